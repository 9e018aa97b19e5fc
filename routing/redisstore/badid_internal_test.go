package redisstore

import (
	"log/slog"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A burst of bad payloads is one line; the next line, badIDLogEvery
// later, counts what was held back, so the log still says how many.
func TestBadIDLogCountsSuppressed(t *testing.T) {
	testenv.ParallelRedis(t)
	var logs testenv.LogBuffer
	sub := &Subscriber{logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	t0 := time.Now()
	for i := range 5 {
		sub.logBadID(7, t0.Add(time.Duration(i)*time.Second))
	}
	if n := testenv.CountLines(logs.String(), "ignored bad id"); n != 1 {
		t.Fatalf("%d lines within %s, want 1:\n%s", n, badIDLogEvery, logs.String())
	}
	sub.logBadID(7, t0.Add(badIDLogEvery))
	if n := testenv.CountLines(logs.String(), "ignored bad id", `"suppressed":4`); n != 1 {
		t.Fatalf("no line counting the 4 held back:\n%s", logs.String())
	}
	sub.logBadID(7, t0.Add(2*badIDLogEvery))
	if n := testenv.CountLines(logs.String(), "suppressed"); n != 1 {
		t.Fatalf("a line after a quiet interval counts nothing held back:\n%s", logs.String())
	}
}
