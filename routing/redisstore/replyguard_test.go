package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// hsetMany gives key n more fields f0..f<n-1>, in batches.
func hsetMany(t *testing.T, r *testenv.Redis, key string, n int) {
	t.Helper()
	for i := 0; i < n; i += 10000 {
		args := make([]any, 0, 20000)
		for j := i; j < min(i+10000, n); j++ {
			args = append(args, "f"+strconv.Itoa(j), "v")
		}
		hset(t, r, key, args...)
	}
}

// TestLookupRefusesOversizedHash: a corrupted route hash (a runaway
// writer's fields by the ten thousand, a huge value) was read whole: a
// million fields cost each lookup 95 MiB and 2.3 s, past the 1 s budget,
// so it answered 503 and every request read it again. Such a hash is now
// refused as invalid route data (404 route_invalid, negatively cached)
// before go-redis allocates for it, whichever key holds it; a valid new
// key still wins over an oversized legacy one; and the store goes on
// serving on fresh connections.
func TestLookupRefusesOversizedHash(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	newKey := func(id string) string { return redisstore.DefaultKeyPrefix + id }
	oldKey := func(id string) string { return redisstore.DefaultLegacyKeyPrefix + id }
	fields := redisstore.MaxReplyElems/2 + 1 // HGETALL answers 2 elements per field
	for _, key := range []string{newKey("many"), oldKey("oldmany"), oldKey("newwins")} {
		hset(t, r, key, "HostIP", "10.0.0.1", "50005", "30001")
		hsetMany(t, r, key, fields)
	}
	hset(t, r, newKey("huge"), "HostIP", "10.0.0.1", "50005", "30001", "Extra", strings.Repeat("x", redisstore.MaxReplyBytes+1))
	hset(t, r, newKey("newwins"), "HostIP", "10.0.0.2", "50005", "30001")
	hset(t, r, newKey("fine"), "HostIP", "10.0.0.3", "50005", "30001")
	// The largest hash that fits is read as ever.
	hset(t, r, newKey("big"), "HostIP", "10.0.0.4", "Extra", strings.Repeat("x", redisstore.MaxReplyBytes/2))
	hsetMany(t, r, newKey("big"), redisstore.MaxReplyElems/2-3)

	for _, legacy := range []bool{true, false} {
		// The largest hash that fits ("big": 64 Ki elements, 4 MiB) takes
		// 50 ms to read, but 250-450 ms under -race and more than the
		// default 1 s budget on a loaded machine: the budget is not what
		// this test is about, so it is generous.
		s := openStoreCfg(t, redisstore.Config{Addr: r.Addr(), DisableLegacy: !legacy, PoolSize: 2, CommandTimeout: 20 * time.Second})
		for _, tc := range []struct {
			id       string
			host     string // "": refused as too large
			noLegacy bool   // the case reads the legacy key
		}{
			{"many", "", false},
			{"fine", "10.0.0.3", false},
			{"huge", "", false},
			{"big", "10.0.0.4", false},
			{"oldmany", "", true},
			{"newwins", "10.0.0.2", false},
			{"fine", "10.0.0.3", false},
		} {
			if tc.noLegacy && !legacy {
				continue
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r.ResetStats(t)
			route, err := s.Lookup(ctx, tc.id)
			runtime.ReadMemStats(&after)
			// The new key is read again, alone (a small read), only when
			// the legacy reply was the one refused: a corrupted new key
			// is not read twice.
			want := 1
			if legacy {
				want = map[string]int{"newwins": 3, "oldmany": 3}[tc.id]
				want = max(want, 2)
			}
			if n := r.CommandCount(t, "hgetall"); n != want {
				t.Errorf("legacy=%v lookup %s: %d HGETALLs, want %d", legacy, tc.id, n, want)
			}
			if tc.host != "" {
				if err != nil || route.HostIP.String() != tc.host {
					t.Fatalf("legacy=%v lookup %s: %v %v, want HostIP %s", legacy, tc.id, route, err, tc.host)
				}
				continue
			}
			var fe *routing.FieldError
			if !errors.As(err, &fe) || fe.Field != "hash" || !strings.Contains(err.Error(), "too large") {
				t.Fatalf("legacy=%v lookup %s: %v %v, want a FieldError: too large", legacy, tc.id, route, err)
			}
			if a := after.TotalAlloc - before.TotalAlloc; a > 4<<20 {
				t.Errorf("legacy=%v lookup %s allocated %d KiB refusing it, want the oversized reply never allocated", legacy, tc.id, a>>10)
			}
		}
	}
}
