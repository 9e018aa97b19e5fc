package routing

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// scaleRoutes is the routing table size the scale benchmarks model: a
// node's cache full of sandboxes.
const scaleRoutes = 100000

// fillCache makes ids[i] a fresh positive entry of c, for every i.
func fillCache(tb testing.TB, c *Cache, ids [][]byte) {
	tb.Helper()
	ctx := context.Background()
	for _, id := range ids {
		if _, _, err := c.Get(ctx, id); err != nil {
			tb.Fatal(err)
		}
	}
}

func scaleIDs(prefix string, n int) [][]byte {
	ids := make([][]byte, n)
	for i := range ids {
		ids[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	return ids
}

// getLoop runs Gets over ids until stop is closed, recording when each
// started and ended (unix nanos), so the caller can see what a request
// waited while something else held the cache. running is closed after
// the first Get.
type getLoop struct {
	spans   [][2]int64
	running chan struct{}
	done    chan struct{}
}

func startGetLoop(c *Cache, ids [][]byte, stop <-chan struct{}) *getLoop {
	l := &getLoop{running: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		ctx := context.Background()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now().UnixNano()
			c.Get(ctx, ids[i%len(ids)])
			l.spans = append(l.spans, [2]int64{start, time.Now().UnixNano()})
			if i == 0 {
				close(l.running)
			}
		}
	}()
	return l
}

// maxOverlap waits for the loop to end and returns the longest of its Gets
// that overlapped [from, to].
func (l *getLoop) maxOverlap(from, to int64) time.Duration {
	<-l.done
	var m int64
	for _, sp := range l.spans {
		if sp[0] <= to && sp[1] >= from {
			m = max(m, sp[1]-sp[0])
		}
	}
	return time.Duration(m)
}

// BenchmarkCacheExpireAll measures ExpireAll on a cache of 100k routes
// (ns/op, timed by hand) and what Gets running meanwhile wait:
// max-cached-ns for an id the cache holds (fresh when ExpireAll starts),
// max-uncached-ns for an id it does not, the longest over the iterations.
// Each iteration refills the cache (≈1 s): run it with -benchtime 5x.
func BenchmarkCacheExpireAll(b *testing.B) {
	s := newCountingStore(answerRoute)
	cfg := testCacheConfig
	cfg.Size = scaleRoutes
	c, err := NewCache(s, cfg)
	if err != nil {
		b.Fatal(err)
	}
	cached := scaleIDs("cached", scaleRoutes)
	var maxCached, maxUncached, took time.Duration
	// Timed by hand: StartTimer stops the world to read memory statistics,
	// which the Gets running meanwhile would count as waiting.
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		fillCache(b, c, cached)
		runtime.GC() // not in the middle of ExpireAll
		// New ids per iteration, so each is a miss.
		uncached := scaleIDs(fmt.Sprintf("new%d", i), 4096)
		stop := make(chan struct{})
		// The newest half: the misses' inserts evict the oldest entries.
		hits := startGetLoop(c, cached[scaleRoutes/2:], stop)
		misses := startGetLoop(c, uncached, stop)
		<-hits.running
		<-misses.running
		from := time.Now().UnixNano()
		c.ExpireAll()
		to := time.Now().UnixNano()
		took += time.Duration(to - from)
		close(stop)
		maxCached = max(maxCached, hits.maxOverlap(from, to))
		maxUncached = max(maxUncached, misses.maxOverlap(from, to))
	}
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(float64(maxCached.Nanoseconds()), "max-cached-ns")
	b.ReportMetric(float64(maxUncached.Nanoseconds()), "max-uncached-ns")
}

// writeScaleRoutes writes a routes.yaml of n routes as the admin API
// persists them (a token and three ports each) and returns its path.
func writeScaleRoutes(tb testing.TB, n int) string {
	tb.Helper()
	routes := make([]*Route, 0, n)
	for i := range n {
		r, err := ParseRouteStrict(fmt.Sprintf("sbx-%06d", i), map[string]string{
			FieldHostIP: "10.0.0.1", FieldSandboxIP: "192.168.1.2", FieldCreatedAt: strconv.Itoa(1764460000000000000 + i),
			FieldAllowPublicTraffic: "false", FieldTrafficAccessToken: testToken,
			"50005": "30001", "49983": "30002", "3000": "30003",
		})
		if err != nil {
			tb.Fatal(err)
		}
		routes = append(routes, r)
	}
	data, err := encodeRoutes(routes)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// BenchmarkLoadFile measures loading a 100k-route routes.yaml (≈30 MB),
// what the memory store does at startup. Measured at 3.3 s and 510 MB
// allocated per load on a 2-core machine, three quarters of the CPU in
// yaml.v3 building the yaml.Node tree; validating the routes is ≈10%.
func BenchmarkLoadFile(b *testing.B) {
	path := writeScaleRoutes(b, scaleRoutes)
	b.ReportAllocs()
	for b.Loop() {
		s, err := LoadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := s.Get(fmt.Sprintf("sbx-%06d", scaleRoutes-1)); !ok {
			b.Fatal("last route not loaded")
		}
	}
}
