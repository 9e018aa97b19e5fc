package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func TestFileSelectionBySNI(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "ca")
	pairs := []FilePair{
		{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")},
		{CertFile: filepath.Join(dir, "b.crt"), KeyFile: filepath.Join(dir, "b.key")},
		{CertFile: filepath.Join(dir, "c.crt"), KeyFile: filepath.Join(dir, "c.key")},
		{CertFile: filepath.Join(dir, "d.crt"), KeyFile: filepath.Join(dir, "d.key")},
	}
	ca.WritePair(t, pairs[0].CertFile, pairs[0].KeyFile, "cube.test", "*.cube.test")
	ca.WritePair(t, pairs[1].CertFile, pairs[1].KeyFile, "api.other.test", "*.cube.test")
	ca.WritePair(t, pairs[2].CertFile, pairs[2].KeyFile, "*.b.cube.test")
	ca.WritePair(t, pairs[3].CertFile, pairs[3].KeyFile, "api.cube.test")
	s, err := newFileSource(pairs, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	tests := []struct {
		sni  string
		want int // index of the pair
	}{
		{"", 0},
		{"127.0.0.1", 0},
		{"::1", 0},
		{"[::1]", 0},
		{"50005-abc.cube.test", 0}, // both 0 and 1 cover it: the first listed wins
		{"50005-ABC.Cube.Test", 0},
		{"cube.test.", 0},
		// A trailing dot (sent by some clients, openssl s_client among
		// them) names the same host: not the default pair.
		{"api.other.test.", 1},
		{"x.b.cube.test.", 2},
		{"api.other.test", 1},
		{"x.b.cube.test", 2},
		// A pair naming the host exactly wins over the wildcards listed
		// before it, as the README says.
		{"api.cube.test", 3},
		{"API.Cube.Test", 3},
		{"a.x.cube.test", 0}, // a wildcard covers one label only: default
		{"unknown.example", 0},
	}
	for _, tt := range tests {
		t.Run(tt.sni, func(t *testing.T) {
			got, err := s.getCertificate(&tls.ClientHelloInfo{ServerName: tt.sni})
			if err != nil {
				t.Fatal(err)
			}
			if got != s.loaded[tt.want].cert {
				t.Fatalf("got %v, want pair %d", got.Leaf.DNSNames, tt.want)
			}
		})
	}
}

func TestFileReloadKeepsPreviousOnError(t *testing.T) {
	dir := t.TempDir()
	p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	ca := testenv.NewCA(t, "ca")
	ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test")
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	first := s.loaded[0].cert
	otherCert, _ := ca.Issue(t, "cube.test") // a certificate that does not match the key on disk

	steps := []struct {
		name        string
		write       func()
		wantChanged bool
	}{
		{"nothing changed", func() {}, false},
		{"rewritten with the same bytes", func() { copyFile(t, p.CertFile, p.CertFile) }, false},
		{"garbage certificate", func() { writeFile(t, p.CertFile, []byte("garbage")) }, false},
		{"certificate without its key yet", func() { writeFile(t, p.CertFile, otherCert) }, false},
		// Both truncated by a writer about to fill them: read twice, the
		// same empty bytes both times, which are no pair.
		{"both files empty", func() { writeFile(t, p.CertFile, nil); writeFile(t, p.KeyFile, nil) }, false},
		{"key removed", func() { _ = os.Remove(p.KeyFile) }, false},
		{"matching pair written", func() { ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test", "*.cube.test") }, true},
	}
	for _, st := range steps {
		st.write()
		if got := s.reload(); got != st.wantChanged {
			t.Fatalf("%s: reload changed = %v, want %v", st.name, got, st.wantChanged)
		}
		if !st.wantChanged && s.loaded[0].cert != first {
			t.Fatalf("%s: the previous certificate was dropped", st.name)
		}
	}
	if s.loaded[0].cert == first || len(s.loaded[0].cert.Leaf.DNSNames) != 2 {
		t.Fatal("the new pair was not loaded")
	}
}

// A pair whose files are written one by one, the certificate first, and
// read between the two writes (the new certificate, the old key), is read
// again, and the second reading, whose key has changed since, is parsed:
// the reload does not stop at the first reading's mismatch because the
// certificate is the same in both.
func TestFileReloadReadsAgainAKeyWrittenAfterItsCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testenv.NewCA(t, "ca")
	p := FilePair{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test")
	rec := &countingHandler{}
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	newCert, newKey := ca.Issue(t, "cube.test", "*.cube.test")
	writeFile(t, p.CertFile, newCert)
	reads := 0
	s.betweenReads = func() {
		if reads == 1 { // the second reading: the first read the old key
			writeFile(t, p.KeyFile, newKey)
		}
		reads++
	}
	if !s.reload() {
		t.Fatal("a pair whose key was written after the first reading was not reloaded")
	}
	if got := s.loaded[0].cert.Leaf.DNSNames; len(got) != 2 {
		t.Fatalf("serving %v, want the new pair", got)
	}
	if n := rec.warns.Load(); n > 0 {
		t.Fatalf("%d warnings for a pair that was whole at its second reading", n)
	}
}

// A Kubernetes secret volume replaces a pair at once, by renaming a new
// "..data" symlink over the old (cert_file and key_file are links through
// it), and a reload that read the certificate before the swap and the key
// after it took the new key for another certificate's: it warned "reload
// failed" and served the old pair one more reload_interval, at random
// among rotations. A pair that fails to load is read again at once when
// the files changed under the first reading; a pair that stays torn (the
// key not written yet) still keeps the previous one.
func TestFileReloadReadsAgainAPairSwappedBetweenItsReads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	link := func(target, name string) {
		t.Helper()
		tmp := filepath.Join(dir, name+".tmp")
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ca := testenv.NewCA(t, "ca")
	version := func(name string, names ...string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		ca.WritePair(t, filepath.Join(dir, name, "tls.crt"), filepath.Join(dir, name, "tls.key"), names...)
	}
	version("..2026_01", "cube.test")
	link("..2026_01", "..data")
	link("..data/tls.crt", "tls.crt")
	link("..data/tls.key", "tls.key")
	p := FilePair{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	rec := &countingHandler{}
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	version("..2026_02", "cube.test", "*.cube.test")
	swaps := 0
	s.betweenReads = func() {
		if swaps == 0 { // the secret's update lands between the two reads
			link("..2026_02", "..data")
		}
		swaps++
	}
	if !s.reload() {
		t.Fatal("a pair swapped between its reads was not reloaded")
	}
	if got := s.loaded[0].cert.Leaf.DNSNames; len(got) != 2 {
		t.Fatalf("serving %v, want the new pair", got)
	}
	if n := rec.warns.Load(); n > 0 {
		t.Fatalf("%d warnings for a swap that left the pair whole", n)
	}

	// A pair torn on disk, not by the reading, still keeps the previous.
	kept := s.loaded[0].cert
	s.betweenReads = nil
	otherCert, _ := ca.Issue(t, "cube.test")
	writeFile(t, filepath.Join(dir, "..2026_02", "tls.crt"), otherCert)
	if s.reload() || s.loaded[0].cert != kept {
		t.Fatal("a certificate without its key was loaded")
	}
	if n := rec.warns.Load(); n != 1 {
		t.Fatalf("%d warnings, want the reload failure's", n)
	}
}

// A reload failure is logged once, not at every tick; but once the files
// are back to the pair in use, the same failure is a new occurrence and is
// logged again. Before, a key file removed by mistake, put back and
// removed again months later (the same error, the same bytes) was never
// logged the second time: the pair stopped being reloaded in silence.
func TestFileReloadFailureLoggedAgainAfterRecovery(t *testing.T) {
	dir := t.TempDir()
	p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	ca := testenv.NewCA(t, "ca")
	ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test")
	key, err := os.ReadFile(p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	otherCert, _ := ca.Issue(t, "cube.test")
	cert, err := os.ReadFile(p.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	rec := &countingHandler{}
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()

	steps := []struct {
		name  string
		write func()
		want  int64 // warnings so far
	}{
		{"key removed", func() { _ = os.Remove(p.KeyFile) }, 1},
		{"still removed", func() {}, 1},
		{"key put back", func() { writeFile(t, p.KeyFile, key) }, 1},
		{"key removed again", func() { _ = os.Remove(p.KeyFile) }, 2},
		{"key put back again", func() { writeFile(t, p.KeyFile, key) }, 2},
		{"certificate of another key", func() { writeFile(t, p.CertFile, otherCert) }, 3},
		{"certificate put back", func() { writeFile(t, p.CertFile, cert) }, 3},
		{"certificate of another key again", func() { writeFile(t, p.CertFile, otherCert) }, 4},
	}
	for _, st := range steps {
		st.write()
		if s.reload() {
			t.Fatalf("%s: reload changed the pair", st.name)
		}
		if got := rec.warns.Load(); got != st.want {
			t.Fatalf("%s: %d warnings, want %d", st.name, got, st.want)
		}
	}
}

// A certificate file replaced in place (cp, a deploy hook's cat > file) is
// read by a reload that can land mid-write. A write cut inside the chain
// leaves a whole leaf, which matches the key, and a truncated intermediate:
// loaded, it served new clients a chain they could not verify until the
// next tick. It is refused like any other incomplete pair.
func TestFileReloadRefusesTruncatedChain(t *testing.T) {
	dir := t.TempDir()
	p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	ca := testenv.NewCA(t, "ca")
	ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test")
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	first := s.loaded[0].cert

	leaf, key := ca.Issue(t, "cube.test", "*.cube.test")
	inter := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	full := append(append([]byte(nil), leaf...), inter...)
	writeFile(t, p.KeyFile, key)
	for _, cut := range []int{len(leaf) + 5, len(leaf) + 10, len(leaf) + len(inter)/2, len(full) - 5} {
		writeFile(t, p.CertFile, full[:cut])
		if s.reload() || s.loaded[0].cert != first {
			t.Fatalf("cut at %d of %d bytes: a truncated chain was loaded", cut, len(full))
		}
	}
	writeFile(t, p.CertFile, full)
	if !s.reload() || len(s.loaded[0].cert.Certificate) != 2 {
		t.Fatal("the whole chain was not loaded")
	}
}

// An expired certificate is warned about once, not at every tick.
func TestFileExpiryWarnedOnce(t *testing.T) {
	dir := t.TempDir()
	p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	ca := testenv.NewCA(t, "ca")
	leaf := ca.WritePair(t, p.CertFile, p.KeyFile, "cube.test")
	rec := &countingHandler{}
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for _, tc := range []struct {
		at   time.Time
		want int
	}{
		{leaf.NotAfter.Add(-time.Minute), 0},
		{leaf.NotAfter.Add(time.Second), 1},
		{leaf.NotAfter.Add(time.Minute), 1},
	} {
		s.warnExpired(tc.at)
		if got := rec.warns.Load(); got != int64(tc.want) {
			t.Fatalf("at %v: %d warnings, want %d", tc.at, got, tc.want)
		}
	}
}

type countingHandler struct{ warns atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.warns.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, b)
}

func TestCoveredByWildcard(t *testing.T) {
	s := &acmeSource{domain: "cube.test", defaultName: "*.cube.test"}
	tests := []struct {
		name string
		want bool
	}{
		{"cube.test", true},
		{"CUBE.test.", true},
		{"50005-abc.cube.test", true},
		{"50005-abc.CUBE.TEST", true},
		{"a.b.cube.test", false},
		{"xcube.test", false},
		{"cube.test.evil", false},
		{".cube.test", false},
		{"other.test", false},
	}
	for _, tt := range tests {
		if got := s.covered(tt.name); got != tt.want {
			t.Errorf("covered(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
	if (&acmeSource{domain: "cube.test"}).covered("x.cube.test") {
		t.Error("with the wildcard skipped nothing is covered")
	}
}

func TestWindowLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newWindowLimiter(2)
	l.now = func() time.Time { return now }
	steps := []struct {
		advance time.Duration
		want    bool
	}{
		{0, true},
		{10 * time.Second, true},
		{10 * time.Second, false}, // third within a minute
		{39 * time.Second, false}, // 59 s after the first
		{time.Second, true},       // the first has left the window
		{0, false},
		{10 * time.Second, true}, // the second has left too
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		// full foretells allow without spending the budget.
		if full := l.full(); full != !st.want {
			t.Fatalf("step %d: full = %v, want %v", i, full, !st.want)
		}
		if got := l.allow(); got != st.want {
			t.Fatalf("step %d: allow = %v, want %v", i, got, st.want)
		}
	}
}

// A refusal report carries the refusals since the last report, this one
// included, then the count starts over: a running total would have the
// operator count a retrying client's first minute again each minute.
func TestWindowLimiterReportCountsSinceLast(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newWindowLimiter(1)
	l.now = func() time.Time { return now }
	steps := []struct {
		advance time.Duration
		refused int
		ok      bool
	}{
		{0, 1, true},
		{time.Second, 0, false},
		{time.Second, 0, false},
		{time.Minute, 3, true}, // the two held back and this one
		{time.Minute, 1, true},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		if refused, ok := l.report(); refused != st.refused || ok != st.ok {
			t.Fatalf("step %d: report = %d, %v; want %d, %v", i, refused, ok, st.refused, st.ok)
		}
	}
}

// on_demand_rate has no upper bound in the configuration, and an operator
// who means "no limit" writes a large one: the limiter allocated room for
// a minute's worth of them at start, and 100000000000 ended the process
// with "fatal error: runtime: out of memory" before it listened. Its memory
// follows the issuances it saw.
func TestWindowLimiterLargeRate(t *testing.T) {
	for _, rate := range []int{100_000_000_000, math.MaxInt} {
		t.Run(strconv.Itoa(rate), func(t *testing.T) {
			l := newWindowLimiter(rate)
			for i := range 1000 {
				if !l.allow() {
					t.Fatalf("issuance %d refused under a rate of %d a minute", i, rate)
				}
			}
			if c := cap(l.events); c > 4096 {
				t.Fatalf("%d issuances hold room for %d", 1000, c)
			}
		})
	}
}

// onDemandSource is an acmeSource that manages *.cube.test and cube.test
// and decides on-demand names itself: every name is allowed, limit orders
// a minute.
func onDemandSource(limit int) *acmeSource {
	return &acmeSource{
		log:          slog.New(slog.DiscardHandler),
		managedNames: []string{"*.cube.test", "cube.test"},
		allow:        func(context.Context, string) error { return nil },
		limiter:      newWindowLimiter(limit),
		failures:     newFailureBackoff(),
	}
}

func TestOnEventRateLimitsOnlyNewOnDemandIssuance(t *testing.T) {
	s := onDemandSource(1)
	tests := []struct {
		name    string
		event   string
		data    map[string]any
		wantErr bool
	}{
		{"other events pass", "cert_obtained", map[string]any{"identifier": "x.cube.test"}, false},
		{"first on-demand issuance", "cert_obtaining", map[string]any{"identifier": "a.other.test"}, false},
		{"second is over budget", "cert_obtaining", map[string]any{"identifier": "b.other.test"}, true},
		{"renewals are not limited", "cert_obtaining", map[string]any{"identifier": "a.other.test", "renewal": true}, false},
		{"managed wildcard is not limited", "cert_obtaining", map[string]any{"identifier": "*.cube.test"}, false},
		{"managed apex is not limited", "cert_obtaining", map[string]any{"identifier": "cube.test"}, false},
		{"a failed order is noted", "cert_failed", map[string]any{"identifier": "c.other.test", "error": errRateLimited}, false},
		{"its name is refused while it backs off", "cert_obtaining", map[string]any{"identifier": "c.other.test"}, true},
		{"a failed managed name is not backed off", "cert_failed", map[string]any{"identifier": "*.cube.test", "error": errRateLimited}, false},
		{"so it is not refused", "cert_obtaining", map[string]any{"identifier": "*.cube.test"}, false},
	}
	for _, tt := range tests {
		err := s.onEvent(t.Context(), tt.event, tt.data)
		if (err != nil) != tt.wantErr {
			t.Fatalf("%s: err = %v, want error %v", tt.name, err, tt.wantErr)
		}
	}
}

// Refusals over the on-demand budget are logged once a minute with their
// count, not once each: every handshake for an existing sandbox's name
// over the budget is refused, and a client retrying in a loop wrote a
// warning per handshake.
func TestRateLimitWarningOncePerWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	rec := &countingHandler{}
	s := &acmeSource{log: slog.New(rec), limiter: newWindowLimiter(1), failures: newFailureBackoff()}
	s.limiter.now = func() time.Time { return now }
	steps := []struct {
		advance   time.Duration
		handshake int   // new on-demand issuances tried
		wantWarns int64 // warnings logged in all, after the step
	}{
		{0, 1, 0},                  // within the budget
		{time.Second, 100, 1},      // over it: one warning
		{30 * time.Second, 100, 1}, // same minute: no more
		{30 * time.Second, 100, 2}, // a minute after the warning: one more
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		for j := range st.handshake {
			_ = s.onEvent(t.Context(), "cert_obtaining", map[string]any{"identifier": fmt.Sprintf("50005-s%d-%d.other.test", i, j)})
		}
		if got := rec.warns.Load(); got != st.wantWarns {
			t.Fatalf("step %d: %d warnings, want %d", i, got, st.wantWarns)
		}
	}
}

// A name whose order failed waits a minute, then twice as long after each
// further failure, up to an hour; a success or a long quiet period starts
// it over.
func TestFailureBackoff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newFailureBackoff()
	steps := []struct {
		at       time.Duration // since t0
		op       string        // "fail", "ok" or "check"
		wantNext time.Duration // fail: next attempt, since t0
		wantErr  bool          // check
	}{
		{0, "check", 0, false},
		{0, "fail", time.Minute, false},
		{30 * time.Second, "check", 0, true},
		{time.Minute, "check", 0, false},
		{time.Minute, "fail", 3 * time.Minute, false},
		{2 * time.Minute, "check", 0, true},
		{3 * time.Minute, "fail", 7 * time.Minute, false},
		{7 * time.Minute, "fail", 15 * time.Minute, false},
		{15 * time.Minute, "fail", 31 * time.Minute, false},
		{31 * time.Minute, "fail", 63 * time.Minute, false},
		{63 * time.Minute, "fail", 123 * time.Minute, false}, // capped at an hour
		{123 * time.Minute, "fail", 183 * time.Minute, false},
		{183*time.Minute + 2*time.Hour, "fail", 184*time.Minute + 2*time.Hour, false}, // quiet for 2 h: starts over
		{185*time.Minute + 2*time.Hour, "ok", 0, false},
		{185*time.Minute + 2*time.Hour, "check", 0, false},
		{185*time.Minute + 2*time.Hour, "fail", 186*time.Minute + 2*time.Hour, false}, // forgotten after a success
		// A quiet period of up to an hour after the backoff keeps the count.
		{216*time.Minute + 2*time.Hour, "fail", 218*time.Minute + 2*time.Hour, false}, // 30 min after
		{278*time.Minute + 2*time.Hour, "fail", 282*time.Minute + 2*time.Hour, false}, // exactly an hour after
	}
	for i, st := range steps {
		now := t0.Add(st.at)
		switch st.op {
		case "fail":
			if got := b.record("x.test", now); !got.Equal(t0.Add(st.wantNext)) {
				t.Fatalf("step %d: next attempt at +%v, want +%v", i, got.Sub(t0), st.wantNext)
			}
		case "ok":
			b.forget("x.test")
		case "check":
			if err := b.check("x.test", now); (err != nil) != st.wantErr {
				t.Fatalf("step %d: check = %v, want error %v", i, err, st.wantErr)
			}
		}
		if err := b.check("other.test", now); err != nil {
			t.Fatalf("step %d: another name is refused: %v", i, err)
		}
	}
}

// The names remembered stay bounded: past failureBackoffKeep, a failure
// forgets the names whose backoff has ended, and only those.
func TestFailureBackoffForgetsEndedNames(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newFailureBackoff()
	for i := range failureBackoffKeep - 1 {
		b.record(fmt.Sprintf("n%d.test", i), t0) // backing off until t0+1m
	}
	b.record("late.test", t0.Add(90*time.Second)) // until t0+2m30s
	now := t0.Add(2 * time.Minute)
	b.record("new.test", now)
	if len(b.names) != 2 {
		t.Errorf("%d names remembered, want 2 (late.test and new.test)", len(b.names))
	}
	for _, name := range []string{"late.test", "new.test"} {
		if err := b.check(name, now); !errors.Is(err, errBackingOff) {
			t.Errorf("check(%s) = %v; want it still backing off", name, err)
		}
	}
}

// A name whose order failed is refused by the decision (no handshake
// waits on it) and by the issuance hook (a handshake that passed the
// decision before the failure places no order), for backing off, not
// for the budget; a certificate obtained for it later clears it.
func TestFailedNameRefusedUntilObtained(t *testing.T) {
	s := onDemandSource(100)
	const name = "a.other.test"
	obtaining := map[string]any{"identifier": name}
	if err := s.onEvent(t.Context(), "cert_failed", map[string]any{"identifier": name, "error": errRateLimited}); err != nil {
		t.Fatal(err)
	}
	if err := s.decide(t.Context(), name); !errors.Is(err, errBackingOff) {
		t.Errorf("decide after a failed order = %v; want %v", err, errBackingOff)
	}
	if err := s.onEvent(t.Context(), "cert_obtaining", obtaining); !errors.Is(err, errBackingOff) {
		t.Errorf("cert_obtaining after a failed order = %v; want %v", err, errBackingOff)
	}
	if err := s.decide(t.Context(), "b.other.test"); err != nil {
		t.Errorf("decide for another name = %v; want nil", err)
	}
	if err := s.onEvent(t.Context(), "cert_obtained", obtaining); err != nil {
		t.Fatal(err)
	}
	if err := s.decide(t.Context(), name); err != nil {
		t.Errorf("decide after a certificate was obtained = %v; want nil", err)
	}
	if err := s.onEvent(t.Context(), "cert_obtaining", obtaining); err != nil {
		t.Errorf("cert_obtaining after a certificate was obtained = %v; want nil", err)
	}
}

// A failed renewal of an on-demand certificate backs its name off only
// when a handshake waits on it (the certificate expired): the background
// renewal of one still valid keeps it served, and certmagic retries that
// itself. A renewal that succeeds clears the backoff.
func TestRenewalFailureBacksOffOnlyAWaitingHandshake(t *testing.T) {
	s := onDemandSource(100)
	const name = "a.other.test"
	failed := map[string]any{"identifier": name, "renewal": true, "error": errors.New("CA down")}
	if err := s.onEvent(t.Context(), "cert_failed", failed); err != nil {
		t.Fatal(err)
	}
	if err := s.decide(t.Context(), name); err != nil {
		t.Fatalf("decide after a background renewal failed = %v; want nil (the valid certificate stays served)", err)
	}

	ctx, abort := context.WithCancelCause(t.Context())
	defer abort(nil)
	ctx = context.WithValue(ctx, abortKey{}, abort)
	if err := s.onEvent(ctx, "cert_failed", failed); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Error("the handshake waiting on the failed renewal was not ended")
	}
	if err := s.decide(t.Context(), name); !errors.Is(err, errBackingOff) {
		t.Errorf("decide after a waited-on renewal failed = %v; want %v", err, errBackingOff)
	}
	if err := s.onEvent(t.Context(), "cert_obtained", map[string]any{"identifier": name, "renewal": true}); err != nil {
		t.Fatal(err)
	}
	if err := s.decide(t.Context(), name); err != nil {
		t.Errorf("decide after a renewal succeeded = %v; want nil", err)
	}
}

func TestZapLoggerWritesToSlog(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo}))
	z := newZapLogger(log).Named("obtain").With(zap.String("ca", "pebble"))
	z.Debug("hidden")
	z.Info("certificate obtained", zap.String("identifier", "*.cube.test"), zap.Int("attempt", 1))
	out := b.String()
	for _, want := range []string{`msg="certificate obtained"`, "level=INFO", "logger=obtain", "ca=pebble", `identifier=*.cube.test`, "attempt=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "hidden") {
		t.Error("debug entry passed an info-level handler")
	}
}

// A pair that cannot load says why in terms an operator can act on. A
// chain whose server certificate is not first (intermediate, then leaf: a
// concatenation in the wrong order) was reported as "private key does not
// match public key", which sent the operator after the wrong file; nginx
// refuses such a chain too, so it is refused, with the fix named. A key
// protected by a passphrase read "failed to parse private key".
func TestFilePairErrorNamesTheCause(t *testing.T) {
	ca := testenv.NewCA(t, "ca")
	leaf, key := ca.Issue(t, "cube.test", "*.cube.test")
	_, otherKey := ca.Issue(t, "cube.test")
	inter := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	tests := []struct {
		name      string
		cert, key []byte
		want      string // in the error
		wantNot   string // not in the error
	}{
		{"intermediate before the leaf", cat(inter, leaf), key, "certificate 2 of 2 in", "does not match"},
		{"leaf between two intermediates", cat(inter, leaf, inter), key, "certificate 2 of 3 in", "does not match"},
		{"key of another certificate", cat(leaf, inter), otherKey, "private key does not match", "of 2 in"},
		// What openssl writes when given a passphrase: PKCS#8, and the
		// legacy form with a Proc-Type header (the bodies are never read).
		{"PKCS#8 encrypted key", leaf, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte("opaque")}), "is encrypted", "failed to parse"},
		{"legacy encrypted key", leaf, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY",
			Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-256-CBC,6EE31CBEBB7E78BA9ECD1C78FC713EB7"}, Bytes: []byte("opaque")}), "is encrypted", "failed to parse"},
		// PEM lines that do not stand alone at the start of their line,
		// which no PEM reader takes (nginx: "bad end line", "no start
		// line"): they read as "truncated, or still being written", or,
		// with the leaf's BEGIN line hidden, as a key of another
		// certificate, and sent the operator after a cut file or the key.
		{"files concatenated without a newline", cat(bytes.TrimSuffix(leaf, []byte("\n")), inter), key, "line " + strconv.Itoa(bytes.Count(leaf, []byte("\n"))) + ":", "truncated"},
		{"byte-order mark before the chain", cat([]byte("\uFEFF"), leaf, inter), key, "line 1:", "does not match"},
		{"byte-order mark before the leaf alone", cat([]byte("\uFEFF"), leaf), key, "line 1:", "truncated"},
		{"indented chain", indent(cat(leaf, inter)), key, "line 1:", "truncated"},
		{"indented key", leaf, indent(key), "line 1 of", "PEM data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
			writeFile(t, p.CertFile, tt.cert)
			writeFile(t, p.KeyFile, tt.key)
			_, err := newFileSource([]FilePair{p}, time.Hour, slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatal("the pair loaded")
			}
			if msg := err.Error(); !strings.Contains(msg, tt.want) || strings.Contains(msg, tt.wantNot) || !strings.Contains(msg, p.CertFile) {
				t.Fatalf("error %q: want it to name %s and say %q, not %q", msg, p.CertFile, tt.want, tt.wantNot)
			}
		})
	}
}

// A misplaced PEM line is named only when the pair fails to load: a key
// file that opens with a byte-order mark before the EC PARAMETERS block
// openssl ecparam writes ahead of the key loaded before, and still does.
func TestMisplacedPEMLineInABlockNotNeeded(t *testing.T) {
	ca := testenv.NewCA(t, "ca")
	leaf, key := ca.Issue(t, "cube.test")
	params := "\uFEFF-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
	dir := t.TempDir()
	p := FilePair{CertFile: filepath.Join(dir, "a.crt"), KeyFile: filepath.Join(dir, "a.key")}
	writeFile(t, p.CertFile, leaf)
	writeFile(t, p.KeyFile, append([]byte(params), key...))
	s, err := newFileSource([]FilePair{p}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("the pair no longer loads: %v", err)
	}
	_ = s.close()
}

// indent indents every line of b by two spaces, as a PEM pasted from
// YAML or a document is.
func indent(b []byte) []byte {
	var out []byte
	for line := range bytes.Lines(b) {
		out = append(append(out, "  "...), line...)
	}
	return out
}

// ACMECovers, which check uses without a Manager, answers as the managed
// certificates do: the apex and one label below tls.domain, any name with
// on-demand issuance, none with the wildcard skipped and no on-demand.
func TestACMECovers(t *testing.T) {
	base := Config{Source: SourceACME, Domain: "Cube.Test."}
	onDemand, skipped := base, base
	onDemand.ACME.OnDemand = true
	skipped.ACME.SkipWildcard = true
	for _, tc := range []struct {
		name string
		cfg  Config
		host string
		want bool
	}{
		{"sandbox host", base, "1-x.cube.test", true},
		{"apex, trailing dot", base, "CUBE.test.", true},
		{"two labels below", base, "1-x.eu.cube.test", false},
		{"other domain", base, "1-x.cube.example", false},
		{"on-demand", onDemand, "1-x.eu.cube.test", true},
		{"wildcard skipped", skipped, "1-x.cube.test", false},
	} {
		if got := ACMECovers(tc.cfg, tc.host); got != tc.want {
			t.Errorf("%s: ACMECovers(%q) = %v, want %v", tc.name, tc.host, got, tc.want)
		}
	}
}

// TestPerHandshakeLineThrottled checks that certmagic's per-handshake
// "tls-alpn challenge" line is logged once per handshakeLogEvery, the next
// one counting those held back, while other lines all pass.
func TestPerHandshakeLineThrottled(t *testing.T) {
	var b strings.Builder
	core := newZapLogger(slog.New(slog.NewTextHandler(&b, nil))).Core()
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	write := func(msg string, at time.Duration) {
		if err := core.Write(zapcore.Entry{Level: zapcore.ErrorLevel, Message: msg, Time: t0.Add(at)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		write("tls-alpn challenge", time.Duration(i)*time.Second)
		write("could not get certificate from issuer", time.Duration(i)*time.Second)
	}
	write("tls-alpn challenge", handshakeLogEvery+time.Second)
	// The count starts over: the next line counts only what was held
	// back since the last one.
	write("tls-alpn challenge", handshakeLogEvery+2*time.Second)
	write("tls-alpn challenge", 2*handshakeLogEvery+2*time.Second)
	var got []string
	others := 0
	for line := range strings.Lines(b.String()) {
		if !strings.Contains(line, `msg="tls-alpn challenge"`) {
			others++
			continue
		}
		got = append(got, strings.TrimSpace(line))
	}
	want := []string{
		`time=2026-12-05T00:00:00.000Z level=ERROR msg="tls-alpn challenge"`,
		`time=2026-12-05T00:00:11.000Z level=ERROR msg="tls-alpn challenge" suppressed=5`,
		`time=2026-12-05T00:00:22.000Z level=ERROR msg="tls-alpn challenge" suppressed=1`,
	}
	if !slices.Equal(got, want) || others != 6 {
		t.Fatalf("lines:\n%s\nwant the challenge lines %q and all 6 others", b.String(), want)
	}
}
