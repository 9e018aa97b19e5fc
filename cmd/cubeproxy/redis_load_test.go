package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// Through the whole program: 1,000 concurrent HTTP requests for one
// uncached sandbox make exactly one HGETALL, and 1,000 requests spread over
// 50 unknown ids (within the 2 s negative TTL) make one read of each key
// per id: the new key and the legacy fallback.
func TestRedisConcurrentRequestsShareLookups(t *testing.T) {
	r := testenv.StartRedis(t)
	backendPort := redisBackend(t, "hot-backend")
	hsetRoute(t, r, redisstore.DefaultKeyPrefix+"hot", cpFields("127.0.0.1", "127.0.0.1", backendPort)...)
	p := startRedisProxy(t, r.Addr(), "--cache-negative-ttl", "30s")
	p.client.Transport.(*http.Transport).MaxIdleConnsPerHost = 100
	// The readiness probe reads Redis too, and applying the first
	// subscription expires the cache: let them finish before counting.
	p.subscribed(t)
	testenv.WaitFor(t, 5*time.Second, "readyz 200", func() bool { return p.adminGet(t, "/readyz").status == 200 })

	// fire returns how many requests got each status (-1: no answer) and
	// the first few transport errors, which say why a request got none.
	fire := func(hosts []string) (map[int]int, []string) {
		var mu sync.Mutex
		statuses := map[int]int{}
		var errs []string
		var wg sync.WaitGroup
		sem := make(chan struct{}, 100)
		for _, host := range hosts {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				req, _ := http.NewRequest("GET", "http://"+p.http+"/", nil)
				req.Host = host
				status := -1
				resp, err := p.client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				statuses[status]++
				if err != nil && len(errs) < 5 {
					errs = append(errs, err.Error())
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		return statuses, errs
	}

	r.ResetStats(t)
	hosts := make([]string, 1000)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("%d-hot.cube.test", redisContainerPort)
	}
	if got, errs := fire(hosts); got[200] != 1000 {
		t.Fatalf("statuses %v, want 1000 x 200; errors %q\n%s", got, errs, proxyCounts(p))
	}
	// One lookup: the new and the legacy key, in one pipeline.
	if n := r.CommandCount(t, "hgetall"); n != 2 {
		t.Fatalf("1000 concurrent requests for one uncached id made %d HGETALLs, want 2 (one lookup)", n)
	}

	r.ResetStats(t)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("%d-ghost-%d.cube.test", redisContainerPort, i%50)
	}
	if got, errs := fire(hosts); got[404] != 1000 {
		t.Fatalf("statuses %v, want 1000 x 404 (after 1000 x 200); errors %q\n%s", got, errs, proxyCounts(p))
	}
	if n := r.CommandCount(t, "hgetall"); n != 2*50 {
		t.Fatalf("1000 requests over 50 unknown ids made %d HGETALLs, want %d (new + legacy key per id)", n, 2*50)
	}
}

// proxyCounts is what the proxy itself counted, for a failure message (its
// log is printed at the end of the test). A request its client got no
// answer for but the proxy counted (late, or as a 499 once the client gave
// up at its 5 s timeout) was slow, not dropped; one the proxy never counted
// did not reach its handler, or is still in it. Connect retries and accept
// errors say where a slow one may have waited.
func proxyCounts(p *redisProxy) string {
	var b strings.Builder
	b.WriteString("the proxy counted:")
	resp, err := p.client.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return fmt.Sprintf("%s (scrape failed: %v)", b.String(), err)
	}
	defer resp.Body.Close()
	samples, err := testenv.ParsePromText(resp.Body)
	if err != nil {
		return fmt.Sprintf("%s (scrape unreadable: %v)", b.String(), err)
	}
	for _, s := range samples {
		switch s.Name {
		case "cubeproxy_requests_total":
			if s.Value == 0 {
				continue // one sample per status class and route kind
			}
		case "cubeproxy_upstream_retries_total", "cubeproxy_upstream_connect_errors_total", "cubeproxy_accept_errors_total":
		default:
			continue
		}
		fmt.Fprintf(&b, "\n  %s %v = %v", s.Name, s.Labels, s.Value)
	}
	return b.String()
}
