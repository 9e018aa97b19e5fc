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
	"github.com/cube-sandbox/cubeproxy/routing"
)

// README: an ACL user without the legacy key pattern is warned about once
// at start, "and again at most hourly while it lasts, with the count of
// refused reads (denied_reads)". An operator who looks at the log an hour
// after the start must still find the line, and the count tells them how
// many lookups read the legacy key as absent meanwhile.
func TestLegacyRefusalRepeatsHourlyWithCount(t *testing.T) {
	testenv.ParallelRedis(t)
	ctx := context.Background()
	r := testenv.StartRedis(t)
	if err := r.Client().Do(ctx, "ACL", "SETUSER", "newonly", "on", ">pw", "resetkeys", "resetchannels", "-@all",
		"~"+DefaultKeyPrefix+"*", "+hgetall").Err(); err != nil {
		t.Fatal(err)
	}
	var logs testenv.LogBuffer
	s, err := Open(Config{Addr: r.Addr(), Username: "newonly", Password: "pw", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	lookups := func(n int) {
		t.Helper()
		for range n {
			if _, err := s.Lookup(ctx, "unknown"); !errors.Is(err, routing.ErrNotFound) {
				t.Fatalf("lookup without the legacy pattern: %v, want ErrNotFound", err)
			}
		}
	}
	// denied lists the denied_reads of each warning logged so far.
	denied := func() []int {
		var out []int
		for _, line := range strings.Split(logs.String(), "\n") {
			var l struct {
				Level  string `json:"level"`
				Denied int    `json:"denied_reads"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Level == "WARN" && strings.Contains(line, "~"+DefaultLegacyKeyPrefix+"*") {
				out = append(out, l.Denied)
			}
		}
		return out
	}

	lookups(3)
	if got := denied(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("warnings after 3 refused legacy reads: denied_reads %v, want one line at the first, [1]\n%s", got, logs.String())
	}
	// An hour passes: the last warning is that old.
	s.legacyWarned.Store(time.Now().Add(-legacyWarnEvery).UnixNano())
	lookups(1)
	if got := denied(); len(got) != 2 || got[1] != 3 {
		t.Fatalf("warnings an hour later: denied_reads %v, want a second line counting the 2 reads held back and this one, [1 3]\n%s", got, logs.String())
	}
	lookups(2)
	if got := denied(); len(got) != 2 {
		t.Fatalf("warnings right after the hourly one: denied_reads %v, want no third line within the hour", got)
	}
}
