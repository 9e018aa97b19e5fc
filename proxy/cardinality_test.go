package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// seriesOf returns the series of a scrape (name and labels, not values),
// histogram buckets left out.
func seriesOf(t *testing.T, tel *telemetry.Telemetry) map[string]bool {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	samples, err := testenv.ParsePromText(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range samples {
		if strings.HasPrefix(s.Name, "go_") || strings.HasPrefix(s.Name, "process_") || strings.HasSuffix(s.Name, "_bucket") {
			continue
		}
		keys := make([]string, 0, len(s.Labels))
		for k, v := range s.Labels {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		out[s.Name+"{"+strings.Join(keys, ",")+"}"] = true
	}
	return out
}

// Whatever a client chooses (a method of any name, any path, an envd
// call of any method, an unknown sandbox's host, a request id, a user
// agent), the scrape holds the same series after a few hundred distinct
// ones as after the first of each kind: no label takes a client's value,
// so one client cannot grow the scrape, nor the memory it takes, without
// bound.
func TestMetricsSeriesBoundedWhateverClientsSend(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	host := h.route("cardbox", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	send := func(i int) {
		for _, head := range []string{
			fmt.Sprintf("M%d /p%d?q=%d HTTP/1.1\r\nHost: %s\r\nUser-Agent: ua-%d\r\nX-Cube-Request-Id: id-%d\r\n", i, i, i, host, i, i),
			fmt.Sprintf("E%d /process.Process/Start%d HTTP/1.1\r\nHost: %s\r\n", i, i, host),
			fmt.Sprintf("GET /files HTTP/1.1\r\nHost: 80-cardmissing%d.cube.test\r\n", i),
			fmt.Sprintf("GET /x%d HTTP/1.1\r\nHost: %d-cardbox.cube.test\r\n", i, 1+i%60000),
		} {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, head+"\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%q: %v", head, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for i := range 3 {
		send(i)
	}
	first := seriesOf(t, tel)
	for i := 3; i < 300; i++ {
		send(i)
	}
	after := seriesOf(t, tel)
	for s := range after {
		if !first[s] {
			t.Errorf("series %s appeared with more distinct requests", s)
		}
	}
	if len(after) != len(first) {
		t.Errorf("%d series after 3 requests of each kind, %d after 300", len(first), len(after))
	}
}
