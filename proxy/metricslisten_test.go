package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// metricsHarness is a harness, with token and mod applied, whose Server
// also serves the metrics listener (metrics_addr), the scrape answering
// "scrape\n"; it returns the harness and that listener's address.
func metricsHarness(t *testing.T, token string, mod ...func(*harnessOpts)) (*harness, string) {
	t.Helper()
	h := newHarness(t, append(mod, func(o *harnessOpts) {
		o.token = token
		o.metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "scrape\n") })
	})...)
	mln := listen(t, "127.0.0.1:0")
	go h.server.ServeMetrics(mln)
	return h, mln.Addr().String()
}

// holdDrain sends a request to a sandbox that holds its answer until
// release is called, and returns once the sandbox has it: a drain begun
// then waits for it. held gets the request's status (0: it failed).
func holdDrain(t *testing.T, h *harness, id string) (release func(), held <-chan int) {
	t.Helper()
	arrived, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	host := h.route(id, backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-hold
		io.WriteString(w, "done")
	})))
	status := h.goStatus(h.req("GET", host, "/", nil))
	select {
	case <-arrived:
	case st := <-status:
		t.Fatalf("the request the drain is to wait for was answered %d before it reached the sandbox", st)
	case <-time.After(10 * time.Second):
		t.Fatal("the request the drain is to wait for never reached the sandbox")
	}
	return release, status
}

// Nothing on the metrics listener takes a body, and it is meant for a
// network the admin API is kept from: a head there gets the body limit of
// a caller without the admin token (8 KiB), whatever token it sends and
// whether one is configured. Served by the admin API's server, it got the
// admin limit when no token was configured (the default): fasthttp
// allocated a declared 1 MiB whole and waited for it for 30 s, from any
// host that reached the listener, on connections no limit caps
// (TestAdminDoesNotHoldTokenlessBodies is the admin listener's).
func TestMetricsListenerHoldsNoBodies(t *testing.T) {
	for _, token := range []string{"", "admin-secret"} {
		_, metrics := metricsHarness(t, token)
		for _, sent := range []string{"", "admin-secret"} {
			head := "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048576\r\n"
			if sent != "" {
				head += "X-Cube-Admin-Token: " + sent + "\r\n"
			}
			// The body never comes: the answer must not wait for it.
			resp, body := rawRequest(t, metrics, head+"\r\n")
			if resp.StatusCode != 413 || !strings.Contains(body, `"code":"request_body_too_large"`) {
				t.Errorf("token %q configured, %q sent, 1 MiB declared: %d %s, want 413", token, sent, resp.StatusCode, body)
			}
		}
	}
}

// An "Expect: 100-continue" head on the metrics listener is judged as the
// request would be, before the body is asked for: anything but the scrape
// is refused from its head, the admin token or a loopback client
// notwithstanding. The admin API's judgement sent 100 to an admin path
// there (the token, or a loopback client with none configured,
// authorizes it on the admin listener), and the body came only to be
// refused 404.
func TestMetricsListenerJudgesExpectHeads(t *testing.T) {
	const tok = "admin-secret"
	for _, token := range []string{"", tok} {
		_, metrics := metricsHarness(t, token)
		for _, tc := range []struct {
			method, path string
			length       int
			status       int
		}{
			{"POST", "/admin/state", 100, 404},
			{"PUT", "/admin/routes/x", 100, 404},
			{"POST", "/metrics", 100, 405},
			{"GET", "/metrics", 20 << 10, 413},
			{"GET", "/metrics", 100, 100},
		} {
			req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nX-Cube-Admin-Token: %s\r\nContent-Length: %d\r\n\r\n",
				tc.method, tc.path, tok, tc.length)
			resp, body := rawRequest(t, metrics, req)
			if resp.StatusCode != tc.status {
				t.Errorf("token %q configured: %s %s with Expect: %d %s, want %d", token, tc.method, tc.path, resp.StatusCode, body, tc.status)
			}
		}
	}
}

// With shared ports (reuse_port) the admin listener closes at the start of
// the drain, as what answers its port from then on is the next process;
// the metrics listener closes with it, while a request is still drained.
func TestSharedPortsDrainClosesTheMetricsListener(t *testing.T) {
	h, metrics := metricsHarness(t, "", func(o *harnessOpts) {
		o.srv.DrainTimeout = 30 * time.Second
		o.srv.SharedPorts = true
	})
	if resp, body := rawRequest(t, metrics, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); resp.StatusCode != 200 || body != "scrape\n" {
		t.Fatalf("scrape: %d %q", resp.StatusCode, body)
	}
	unblock, held := holdDrain(t, h, "sharedrain")
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	for _, l := range []struct{ name, addr string }{{"admin", h.admin}, {"metrics", metrics}} {
		testenv.WaitFor(t, 10*time.Second, "the "+l.name+" listener closed during the drain", func() bool {
			c, err := net.DialTimeout("tcp", l.addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err != nil
		})
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("the drain ended (%v) before the request it waits for", err)
	default:
	}
	unblock()
	if code := <-held; code != 200 {
		t.Fatalf("the request the drain waited for: %d, want 200", code)
	}
	drainEnds(t, shutdownDone, 40*time.Second, "the drain outlived its deadline (30 s) after the request it waited for")
}
