package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A Redis that is down must not cost a warning per heartbeat: the first
// failure is logged, then at most one line every warnEvery with the
// failures since the last, and one line when the heartbeat recovers.
func TestRegistryHeartbeatFailuresRateLimited(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	rs := testenv.StartRedis(t)
	var logs testenv.LogBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	const (
		interval  = 10 * time.Millisecond
		warnEvery = 600 * time.Millisecond
		// The lines' own times are read inside the logger, after the
		// clock report decides by; a goroutine preempted in between
		// (seen at load average 13: 75 ms) shortens a gap by that much.
		// Half of warnEvery still tells the limit from none, which
		// warns every interval.
		minGap = warnEvery / 2
	)
	reg, err := startRegistry(rs.Client(), RegistryConfig{Enabled: true, Interval: interval}, 200*time.Millisecond,
		Instance{ProxyID: "proxy-1"}, logger, warnEvery, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop(ctx) })
	present := func() bool { return rs.Client().HExists(ctx, DefaultRegistryHash, "proxy-1").Val() }
	testenv.WaitFor(t, 10*time.Second, "registry entry", present)

	type line struct {
		Time   time.Time `json:"time"`
		Level  string    `json:"level"`
		Msg    string    `json:"msg"`
		Failed int       `json:"failed_beats"`
	}
	lines := func() (warns, recovered []line) {
		for _, s := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var l line
			if s == "" || json.Unmarshal([]byte(s), &l) != nil {
				continue
			}
			switch {
			case strings.Contains(l.Msg, "heartbeat failed"):
				warns = append(warns, l)
			case strings.Contains(l.Msg, "heartbeat recovered"):
				recovered = append(recovered, l)
			}
		}
		return warns, recovered
	}

	rs.Stop()
	testenv.WaitFor(t, 20*time.Second, "three warnings", func() bool {
		w, _ := lines()
		return len(w) >= 3
	})
	warns, _ := lines()
	if warns[0].Failed != 1 {
		t.Errorf("first warning counts %d failed beats, want 1", warns[0].Failed)
	}
	for i := 1; i < len(warns); i++ {
		if gap := warns[i].Time.Sub(warns[i-1].Time); gap < minGap {
			t.Errorf("warning %d came %v after the one before, want at least %v (%d warnings)", i+1, gap, minGap, len(warns))
		}
		if warns[i].Failed < 1 {
			t.Errorf("warning %d counts %d failed beats", i+1, warns[i].Failed)
		}
	}

	rs.Restart()
	testenv.WaitFor(t, 20*time.Second, "entry rewritten after restart", present)
	// Some beats after the recovery: still one recovery line, no warning.
	score := rs.Client().ZScore(ctx, DefaultRegistryZSet, "proxy-1").Val()
	testenv.WaitFor(t, 10*time.Second, "later heartbeats", func() bool {
		return rs.Client().ZScore(ctx, DefaultRegistryZSet, "proxy-1").Val() > score+float64(5*interval/time.Millisecond)
	})
	after, recovered := lines()
	if len(recovered) != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", len(recovered), logs.String())
	}
	for _, w := range after {
		if w.Time.After(recovered[0].Time) {
			t.Errorf("warning after the recovery: %+v", w)
		}
	}
	if total := recovered[0].Failed; total < 3 {
		t.Errorf("recovery line counts %d failed beats, want at least 3", total)
	}
}

// A recovery ends the count: the warning of a later outage counts its own
// failed beats, not those of the outage before (which the recovery line
// reported already).
func TestRegistryReportCountsPerOutage(t *testing.T) {
	var logs testenv.LogBuffer
	r := &Registry{logger: slog.New(slog.NewJSONHandler(&logs, nil)), warnEvery: time.Minute}
	t0 := time.Now()
	down := errors.New("connection refused")
	for i := range 3 { // one warning, two beats held back
		r.report(down, t0.Add(time.Duration(i)*time.Second))
	}
	r.report(nil, t0.Add(3*time.Second))
	if n := testenv.CountLines(logs.String(), "heartbeat recovered", `"failed_beats":3`); n != 1 {
		t.Fatalf("no recovery line counting 3 failed beats:\n%s", logs.String())
	}
	r.report(down, t0.Add(4*time.Second))
	if n := testenv.CountLines(logs.String(), "heartbeat failed", `"failed_beats":1`); n != 2 {
		t.Fatalf("the second outage's first warning does not count 1 failed beat:\n%s", logs.String())
	}
}
