package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The memory store reads its routes file once, at start. An operator who
// edits it and sends SIGHUP (nginx's reload) was told nothing, and with
// persist_routes the next admin change wrote the running table over the
// edit, as it writes it over another process's changes to the same file,
// without a word either. SIGHUP now says the file changed and is not
// served, and a write that replaces a changed file says what it did; the
// file as the proxy wrote it draws neither.
func TestRoutesFileChangesAreNotSilent(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  a:\n    HostIP: \"10.0.0.1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--config=", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", routes, "--persist-routes"}, noEnv)
	admin := r.a.adminLn.Addr().String()

	sighupWarnings := func() int { return strings.Count(r.logs.String(), `"msg":"SIGHUP: the routes file changed`) }
	overwrites := func() int {
		return strings.Count(r.logs.String(), `"msg":"routes file changed since this process loaded or last wrote it`)
	}
	flushed := func() { t.Helper(); flushProcessLog(t, r) }
	hup := func() { t.Helper(); hupRoutesCheck(t, r) }
	put := func(id string) {
		t.Helper()
		req, err := http.NewRequest("PUT", "http://"+admin+"/admin/routes/"+id, strings.NewReader(`{"HostIP":"10.0.0.2"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("PUT %s: %d", id, resp.StatusCode)
		}
		flushed()
	}

	hup()
	put("b")
	if n, m := sighupWarnings(), overwrites(); n != 0 || m != 0 {
		t.Fatalf("with the file as loaded and as written by the proxy: %d SIGHUP warnings, %d overwrite warnings; want none", n, m)
	}

	if err := os.WriteFile(routes, []byte("routes:\n  hand:\n    HostIP: \"10.0.0.9\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup()
	if n := sighupWarnings(); n != 1 {
		t.Errorf("SIGHUP after a hand edit of the routes file: %d warnings, want 1", n)
	}
	put("c")
	if n := overwrites(); n != 1 {
		t.Errorf("an admin change written over the hand edit: %d warnings, want 1", n)
	}
	hup()
	if n, m := sighupWarnings(), overwrites(); n != 1 || m != 1 {
		t.Errorf("SIGHUP with the file as the proxy wrote it: now %d SIGHUP and %d overwrite warnings, want still 1 and 1", n, m)
	}
	r.stop()
}

// Two processes persisting to one file overwrite each other at every
// write, hundreds a second for a small table (measured: two serves, 100
// PUTs each, 91 warnings): one warning per 10 s, counting the overwrites
// since the last, says it without flooding the log.
func TestOverwriteWarningIsSpaced(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	clock := time.Unix(1000, 0)
	warn, _ := overwriteWarning(log, func() time.Time { return clock }, func(time.Duration, func()) {})
	for _, step := range []time.Duration{0, time.Second, time.Second, 8 * time.Second, time.Second, 20 * time.Second} {
		clock = clock.Add(step)
		warn("/r.yaml")
	}
	var counts []int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l struct {
			Overwrites int `json:"overwrites"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		counts = append(counts, l.Overwrites)
	}
	// At 0 s, 10 s and 31 s: the first alone, then the 3 and the 2 since.
	if !slices.Equal(counts, []int{1, 3, 2}) {
		t.Errorf("warnings counted %v overwrites, want [1 3 2]", counts)
	}
}

// The spacing must not lose an overwrite: one held back because a warning
// was said less than 10 s before was said only with the next overwrite,
// so an operator whose second hand edit (5 s after the first one's
// warning) was written over, and who edited nothing after it, was never
// told it was gone. The held-back count is said once the 10 s are up.
func TestOverwriteWarningHeldBackIsSaidLater(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	clock := time.Unix(1000, 0)
	var (
		delays []time.Duration
		fire   []func()
	)
	after := func(d time.Duration, f func()) {
		delays = append(delays, d)
		fire = append(fire, f)
	}
	warn, _ := overwriteWarning(log, func() time.Time { return clock }, after)
	counts := func() []int {
		var out []int
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var l struct {
				Routes     string `json:"routes"`
				Overwrites int    `json:"overwrites"`
			}
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatal(err)
			}
			if l.Routes != "/r.yaml" {
				t.Errorf("warning names routes %q, want /r.yaml", l.Routes)
			}
			out = append(out, l.Overwrites)
		}
		return out
	}

	warn("/r.yaml") // the first hand edit written over: said at once
	clock = clock.Add(5 * time.Second)
	warn("/r.yaml") // the second, 5 s later: held back
	warn("/r.yaml") // and a third, before the 10 s are up
	if got := counts(); !slices.Equal(got, []int{1}) {
		t.Fatalf("after three overwrites within 10 s: warnings counting %v, want [1]", got)
	}
	if len(fire) != 1 {
		t.Fatalf("%d timers armed for the held-back overwrites, want 1", len(fire))
	}
	if delays[0] != 5*time.Second {
		t.Errorf("held-back overwrites due in %v, want 5s (10 s after the last warning)", delays[0])
	}
	clock = clock.Add(5 * time.Second)
	fire[0]()
	if got := counts(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("10 s after the first warning: warnings counting %v, want [1 2]", got)
	}
	// Said by the timer: the next overwrite is held back again, from then.
	clock = clock.Add(time.Second)
	warn("/r.yaml")
	if len(fire) != 2 || delays[1] != 9*time.Second {
		t.Fatalf("an overwrite 1 s after the timer's warning: timers %v, want a second one due in 9s", delays)
	}
	// A warning said directly before the timer fires leaves it nothing.
	clock = clock.Add(9 * time.Second)
	warn("/r.yaml")
	fire[1]()
	if got := counts(); !slices.Equal(got, []int{1, 2, 2}) {
		t.Errorf("warnings counting %v, want [1 2 2]", got)
	}
}

// A stop within 10 s of an overwrite warning must not take the
// overwrites held back since with it (the timer that would say them dies
// with the process): the stop says them.
func TestOverwriteWarningHeldBackIsSaidAtStop(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	clock := time.Unix(1000, 0)
	var fire []func()
	warn, flush := overwriteWarning(log, func() time.Time { return clock }, func(_ time.Duration, f func()) { fire = append(fire, f) })
	lines := func() int { return strings.Count(buf.String(), `"overwrites":`) }
	flush()
	if n := lines(); n != 0 {
		t.Fatalf("a stop with no overwrite: %d warnings, want none", n)
	}
	warn("/r.yaml")
	clock = clock.Add(time.Second)
	warn("/r.yaml")
	flush()
	if n := lines(); n != 2 || !strings.Contains(buf.String(), `"overwrites":1}`) {
		t.Fatalf("a stop 1 s after a warning, one overwrite held back: %d warnings, want 2: %s", n, buf.String())
	}
	for _, f := range fire {
		f()
	}
	if n := lines(); n != 2 {
		t.Errorf("the timer after the stop said them: %d warnings, want still 2", n)
	}
}

// A start whose routes file is missing serves an empty table ("routes file
// not found"). An operator who then writes the file and sends SIGHUP
// expects it served: the check says it is not, with persist_routes or
// without (the store of a missing file knew no file at all, and SIGHUP
// said nothing).
func TestRoutesFileWrittenAfterAStartWithoutItIsNotSilent(t *testing.T) {
	for _, persist := range []bool{false, true} {
		t.Run(fmt.Sprintf("persist=%v", persist), func(t *testing.T) {
			routes := filepath.Join(t.TempDir(), "routes.yaml")
			args := []string{"--config=", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes}
			if persist {
				args = append(args, "--persist-routes")
			}
			r := runServe(t, args, noEnv)
			hup := func() int {
				t.Helper()
				hupRoutesCheck(t, r)
				return strings.Count(r.logs.String(), `"msg":"SIGHUP: the routes file changed`)
			}
			if n := hup(); n != 0 {
				t.Fatalf("SIGHUP with the routes file still missing: %d warnings, want none", n)
			}
			if err := os.WriteFile(routes, []byte("routes:\n  hand:\n    HostIP: \"10.0.0.9\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if n := hup(); n != 1 {
				t.Errorf("SIGHUP after the missing routes file was written: %d warnings, want 1", n)
			}
			r.stop()
		})
	}
}

// hupRoutesCheck sends this process SIGHUP and returns once serve r has
// handled it, its look at the routes file has ended and the process log
// holds what it wrote.
func hupRoutesCheck(t *testing.T, r *running) {
	t.Helper()
	said := strings.Count(r.logs.String(), "nothing to reopen")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// onSignal starts the check before it logs that line.
	testenv.WaitFor(t, 5*time.Second, "the SIGHUP handled", func() bool {
		return strings.Count(r.logs.String(), "nothing to reopen") > said
	})
	testenv.WaitFor(t, 5*time.Second, "the check done", func() bool { return r.a.rechecks.Load() == 0 })
	flushProcessLog(t, r)
}

// flushProcessLog returns once what r logged before it is in r's logs:
// the process log is written behind the caller.
func flushProcessLog(t *testing.T, r *running) {
	t.Helper()
	marker := fmt.Sprintf("log-flushed-%d", time.Now().UnixNano())
	r.a.log.Info(marker)
	testenv.WaitFor(t, 5*time.Second, "the process log flushed", func() bool { return strings.Contains(r.logs.String(), marker) })
}
