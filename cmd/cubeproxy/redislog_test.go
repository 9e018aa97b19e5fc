package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// While Redis is down go-redis logs a failed dial several times a second;
// the proxy logs one line per kind of message per redisLogEvery, and the
// next line counts what it held back.
func TestRedisLoggerRateLimits(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	r := newRedisLogger(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	dial := "connection pool: failed to dial after %d attempts: %v"
	steps := []struct {
		advance time.Duration
		format  string
		want    string // "" = nothing logged
	}{
		{0, dial, "failed to dial after 1 attempts"},
		{100 * time.Millisecond, dial, ""},
		{100 * time.Millisecond, dial, ""},
		{0, "sentinel: new master=%q addr=%q", "sentinel: new master"}, // another kind is not held back
		{redisLogEvery, dial, "suppressed=2"},
		{time.Second, dial, ""},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		buf.Reset()
		r.Printf(context.Background(), s.format, 1, "refused")
		got := buf.String()
		switch {
		case s.want == "" && got != "":
			t.Errorf("step %d: logged %q, want nothing", i, got)
		case s.want != "" && !strings.Contains(got, s.want):
			t.Errorf("step %d: logged %q, want it to contain %q", i, got, s.want)
		}
	}
}
