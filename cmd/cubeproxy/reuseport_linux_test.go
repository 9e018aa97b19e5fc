package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Ports are shared only when both processes ask for it: a proxy started
// by mistake next to a running one still fails on the port in use. The
// refusal says which side lacks reuse_port: it said "another process
// listens there: stop it", and an operator whose takeover failed so was
// told to stop the proxy serving the node, refusing every connection.
func TestReusePortNeedsBothSides(t *testing.T) {
	routes := boxRoutes(t, t.TempDir(), 9)
	const choose = "; or choose another address with --http-addr or CUBEPROXY_HTTP_ADDR)"
	for _, tc := range []struct {
		name          string
		first, second bool
		shared        bool
		hint          string // the refusal's advice after "address already in use"
	}{
		{"both", true, true, true, ""},
		{"only the first", true, false, false,
			" (a process started with reuse_port listens there: set reuse_port here too (--reuse-port, CUBEPROXY_REUSE_PORT) to start beside it" + choose},
		{"only the second", false, true, false,
			" (the process there listens without reuse_port, or is another user's: a port is shared only by processes of one user that all set it" + choose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := runServe(t, reuseArgs(tc.first, "127.0.0.1:0", "127.0.0.1:0", routes, "first"), noEnv)
			args := reuseArgs(tc.second, first.a.httpLn.Addr().String(), first.a.adminLn.Addr().String(), routes, "second")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			started := false
			err := serve(ctx, args, noEnv, io.Discard, io.Discard, func(*app) { started = true; cancel() })
			if started != tc.shared {
				t.Fatalf("second proxy started: %v, want %v (serve: %v)", started, tc.shared, err)
			}
			if !tc.shared && (err == nil || !strings.Contains(err.Error(), "address already in use"+tc.hint)) {
				t.Fatalf("serve = %v\nwant the port in use, then%s", err, tc.hint)
			}
		})
	}
}

// reuse_port lets two processes share a port, never two listeners of one
// process: with the traffic and admin listeners on one address both would
// bind, and the kernel would hand sandbox traffic to the admin API (which
// never shares a listener with it). The start is refused, naming both.
func TestReusePortKeepsListenersApart(t *testing.T) {
	routes := boxRoutes(t, t.TempDir(), 9)
	// The refusal comes from the config, before any bind, so the port is
	// held (bound, not listening) for the whole test: a proxy that bound
	// first would fail on it too, and no other socket can take it.
	addr := testenv.RefusingAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	for _, tc := range []struct{ name, http, admin string }{
		{"one address", addr, addr},
		{"wildcard traffic, loopback admin", ":" + port, addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			started := false
			err := serve(ctx, reuseArgs(true, tc.http, tc.admin, routes, "apart"), noEnv, io.Discard, io.Discard, func(*app) { started = true; cancel() })
			if started || err == nil || !strings.Contains(err.Error(), "are the same address") {
				t.Fatalf("started %v, serve = %v; want a refusal naming the shared address", started, err)
			}
		})
	}
}

// A new proxy started with reuse_port next to a running one shares its
// traffic and admin ports; once the old one has drained, the new one
// answers every new connection.
func TestReusePortTakeover(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi from sandbox") }))
	routes := boxRoutes(t, t.TempDir(), port)

	old := runServe(t, reuseArgs(true, "127.0.0.1:0", "127.0.0.1:0", routes, "old"), noEnv)
	httpAddr, adminAddr := old.a.httpLn.Addr().String(), old.a.adminLn.Addr().String()
	runServe(t, reuseArgs(true, httpAddr, adminAddr, routes, "new"), noEnv)

	// Every connection below is new, so the kernel picks a listener for
	// each by its source port: both proxies are seen.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	seen := map[string]bool{}
	for i := 0; i < 200 && len(seen) < 2; i++ {
		seen[instanceAt(t, client, adminAddr)] = true
	}
	if !seen["old"] || !seen["new"] {
		t.Fatalf("instances answering on the shared admin port: %v, want old and new", seen)
	}

	old.stop() // SIGTERM's drain
	for i := range 50 {
		if id := instanceAt(t, client, adminAddr); id != "new" {
			t.Fatalf("connection %d after the drain answered by %q", i, id)
		}
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d after the drain: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hi from sandbox" {
			t.Fatalf("request %d after the drain: %d %q", i, resp.StatusCode, body)
		}
	}
}

func reuseArgs(reuse bool, httpAddr, adminAddr, routes, instance string) []string {
	return []string{fmt.Sprintf("--reuse-port=%v", reuse), "--http-addr", httpAddr, "--admin-addr", adminAddr,
		"--routes", routes, "--instance-id", instance, "--drain-timeout", "2s", "--access-log-format", "off"}
}

// instanceAt asks the admin API behind addr which instance answered.
func instanceAt(t *testing.T, client *http.Client, addr string) string {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/admin/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		InstanceID string `json:"instance_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	return h.InstanceID
}

// While the old proxy drains, the shared admin port answers for the node,
// which the new proxy keeps serving: every health check must reach the
// new one and say ready. The old one's admin listener, left open through
// its drain, answered about half of them 503 (draining), enough for a load
// balancer to take the node out in the middle of a seamless takeover.
func TestReusePortReadinessDuringDrain(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()
	held := make(chan struct{}, 1)
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-release
		io.WriteString(w, "released")
	}))
	routes := boxRoutes(t, t.TempDir(), port)

	args := func(httpAddr, adminAddr, instance string) []string {
		a := reuseArgs(true, httpAddr, adminAddr, routes, instance)
		return append(a, "--drain-timeout", "30s") // the held request keeps the old one draining
	}
	old := runServe(t, args("127.0.0.1:0", "127.0.0.1:0", "old"), noEnv)
	httpAddr, adminAddr := old.a.httpLn.Addr().String(), old.a.adminLn.Addr().String()

	// A request on the old proxy (the only one yet) that holds its drain open.
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	testenv.Recv(t, held, 10*time.Second, "the held request at the sandbox")
	runServe(t, args(httpAddr, adminAddr, "new"), noEnv)
	go old.stop()
	testenv.WaitFor(t, 10*time.Second, "the drain to begin", func() bool {
		return strings.Contains(old.logs.String(), "shutting down: draining")
	})

	// Each probe is a new connection, which the kernel hands to either
	// listener still open on the port: 40 in a row from the new proxy
	// cannot be chance. A probe reset as the old listener closes (its
	// accept queue, without net.ipv4.tcp_migrate_req) starts the count over.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var last string
	inARow := 0
	testenv.WaitFor(t, 10*time.Second, "40 ready answers in a row from the new proxy", func() bool {
		id, status, err := readyAt(client, adminAddr)
		if err != nil || id != "new" || status != http.StatusOK {
			inARow, last = 0, fmt.Sprintf("%q %d %v", id, status, err)
			return false
		}
		inARow++
		return inARow >= 40
	})
	select {
	case err := <-answered:
		t.Fatalf("the held request ended (%v) before the check: the old proxy was no longer draining; last miss %s", err, last)
	default:
	}
	releaseAll()
	if err := testenv.Recv(t, answered, 10*time.Second, "the held request's answer once released"); err != nil {
		t.Errorf("the request held through the drain: %v", err)
	}
}

// readyAt asks /readyz and then /admin/healthz behind addr, each on its own
// connection; id is the instance that answered the second.
func readyAt(client *http.Client, addr string) (id string, status int, err error) {
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return "", 0, err
	}
	resp.Body.Close()
	status = resp.StatusCode
	resp, err = client.Get("http://" + addr + "/admin/healthz")
	if err != nil {
		return "", status, err
	}
	defer resp.Body.Close()
	var h struct {
		InstanceID string `json:"instance_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h.InstanceID, status, err
}

// What the kernel will do with queued connections at a takeover is said at
// start, from net.ipv4.tcp_migrate_req.
func TestTakeoverWarning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		err     error
		want    string // in the warning; "" = none
	}{
		{"moved", "1\n", nil, ""},
		{"reset", "0\n", nil, "tcp_migrate_req is 0"},
		{"old kernel", "", os.ErrNotExist, "Linux 5.14+"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := takeoverWarning([]byte(tc.content), tc.err)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("warning %q, want one containing %q", got, tc.want)
			}
		})
	}
	// serve logs it with reuse_port, from this machine's sysctl, and not
	// without reuse_port.
	want := takeoverWarning(os.ReadFile(migrateReqPath))
	routes := boxRoutes(t, t.TempDir(), 9)
	for _, reuse := range []bool{true, false} {
		r := runServe(t, reuseArgs(reuse, "127.0.0.1:0", "127.0.0.1:0", routes, "warned"), noEnv)
		r.stop()
		logged := strings.Contains(r.logs.String(), "tcp_migrate_req")
		if wantLogged := reuse && want != ""; logged != wantLogged {
			t.Errorf("reuse_port %v: warning logged %v, want %v (sysctl warning %q)\n%s", reuse, logged, wantLogged, want, r.logs)
		}
	}
}

// portShared tells a port held with SO_REUSEPORT from one held without,
// on a loopback address of each family and on the wildcard (one IPv6
// socket that takes IPv4 too, as Go listens on ":port").
func TestPortSharedTellsAReusePortHolder(t *testing.T) {
	for _, tc := range []struct{ name, listen, host string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.1"},
		{"ipv6", "[::1]:0", "::1"},
		{"wildcard", ":0", ""},
	} {
		for _, reuse := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s reuse %v", tc.name, reuse), func(t *testing.T) {
				ln, err := listenTCP(context.Background(), tc.listen, reuse)
				if err != nil {
					t.Skipf("listen %s: %v", tc.listen, err)
				}
				defer ln.Close()
				_, port, _ := net.SplitHostPort(ln.Addr().String())
				if got := portShared(net.JoinHostPort(tc.host, port)); got != reuse {
					t.Errorf("portShared(%s) = %v, want %v", ln.Addr(), got, reuse)
				}
			})
		}
	}
}

// A reuse_port start that cannot bind one of its addresses fails before it
// listens on any: a listener opened on a port the running proxy shares
// takes connections at once, and the failed start closed it over them
// (drilled: ten starts with a metrics_addr in use, next to a proxy under
// load, reset 19 of its clients' connections).
func TestReusePortStartFailsBeforeListening(t *testing.T) {
	running, err := listenTCP(context.Background(), "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	_, held := holdAddr(t)
	for _, tc := range []struct{ name, admin, metrics, key string }{
		{"admin_addr in use", held, "", "admin_addr"},
		{"metrics_addr in use", "127.0.0.1:0", held, "metrics_addr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.ReusePort, cfg.HTTPAddr, cfg.AdminAddr, cfg.MetricsAddr = true, running.Addr().String(), tc.admin, tc.metrics
			var opened []string
			a := &app{cfg: cfg, log: slog.New(slog.DiscardHandler), listenFn: func(ctx context.Context, addr string, reuse bool) (net.Listener, error) {
				ln, err := listenTCP(ctx, addr, reuse)
				if err == nil {
					opened = append(opened, addr)
					ln.Close()
				}
				return ln, err
			}}
			err := a.listen(context.Background())
			if err == nil || !strings.HasPrefix(err.Error(), tc.key+` "`+held+`"`) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("listen = %v; want %s %q in use", err, tc.key, held)
			}
			if len(opened) > 0 {
				t.Fatalf("listened on %v before failing on %s", opened, tc.key)
			}
		})
	}
}
