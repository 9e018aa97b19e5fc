package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// localIPv6 is one of the machine's own non-loopback IPv6 addresses (a
// global or unique-local one; a link-local one would need a zone): a
// dual-stack listener takes it as a local address like any other. It is
// found rather than named, since machines differ; "" where there is none,
// and the cases through it are then left out, saying so.
var localIPv6 = func() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if ok && n.IP.To4() == nil && n.IP.IsGlobalUnicast() && hasLocalAddr(n.IP.String()) {
			return n.IP.String()
		}
	}
	return ""
}()

// withLocalIPv6 returns rows, plus more when the machine has a non-loopback
// IPv6 address (more builds them from it); without one it says what is
// left out.
func withLocalIPv6[T any](t *testing.T, rows []T, more func(ip string) []T) []T {
	t.Helper()
	if localIPv6 == "" {
		t.Log("this machine has no non-loopback IPv6 address: the cases through one are left out")
		return rows
	}
	return append(rows, more(localIPv6)...)
}

// hasLocalAddr reports whether ip is one of this machine's addresses.
func hasLocalAddr(ip string) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// portOf is the port of a listener address.
func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// The client address the proxy vouches for, as the sandbox and the access
// log see it, on an IPv6-only listener and on a dual-stack one ("[::]",
// which takes IPv4 clients as IPv4-mapped ::ffff:a.b.c.d): IPv6 clients as
// nginx writes $remote_addr (no brackets, no port), IPv4 ones as IPv4,
// mapped or not, never "::ffff:127.0.0.1".
func TestIPv6ClientAddress(t *testing.T) {
	type row struct {
		listen, client string // client: the address dialed
		want           string // X-Real-IP, remote_addr and server_addr
	}
	rows := withLocalIPv6(t, []row{
		{"[::1]", "[::1]", "::1"},
		{"[::]", "[::1]", "::1"},
		{"[::]", "127.0.0.1", "127.0.0.1"},
		{"[::]", "[::ffff:127.0.0.1]", "127.0.0.1"},
		{"127.0.0.1", "[::ffff:127.0.0.1]", "127.0.0.1"},
	}, func(ip string) []row { return []row{{"[::]", "[" + ip + "]", ip}} })
	for _, tc := range rows {
		t.Run(tc.listen+" from "+tc.client, func(t *testing.T) {
			h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.listen = tc.listen })
			port := backend(t, "[::1]", echoHeaders())
			h.put("six", map[string]string{"HostIP": "::1", "CreatedAt": "1", "80": itoa(port)})
			id := "ip6-" + strings.Trim(tc.client, "[]")
			lines := []string{"GET / HTTP/1.1", "Host: 80-six.cube.test", "X-Cube-Request-Id: " + id,
				"X-Forwarded-For: 203.0.113.9"}
			e := echoRawRequest(t, tc.client+":"+portOf(t, h.addr), lines...)
			for k, want := range map[string]string{
				"X-Real-Ip":       tc.want,
				"X-Forwarded-For": "203.0.113.9, " + tc.want,
			} {
				if got := e.get(k); got != want {
					t.Errorf("%s reached the sandbox as %q, want %q", k, got, want)
				}
			}
			entry := logs.waitJSON(t, id)
			for k, want := range map[string]string{
				"remote_addr":   tc.want,
				"server_addr":   tc.want, // the client dialed the proxy's address of its family
				"upstream_addr": "[::1]:" + itoa(port),
				"backend_ip":    "::1",
			} {
				if got := entry[k]; got != want {
					t.Errorf("access log %s = %v, want %q", k, got, want)
				}
			}
		})
	}
}

// The client span of a request to an IPv6 sandbox names it as the semantic
// conventions say (server.address is the bare address) and the proxy's own
// attribute as a dialable host:port (bracketed).
func TestIPv6UpstreamSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h := newHarness(t, func(o *harnessOpts) { o.listen = "[::1]"; o.cfg.Telemetry = tel })
	port := backend(t, "[::1]", echoHeaders())
	h.put("six", map[string]string{"HostIP": "::1", "CreatedAt": "1", "80": itoa(port)})
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4736"
	tid, err := trace.TraceIDFromHex(traceID)
	if err != nil {
		t.Fatal(err)
	}
	req := h.req("GET", "80-six.cube.test", "/", nil)
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp := h.do(req)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	server, client := waitSpans(t, exp, tid)
	checkAttrs(t, "client span", client.Attributes, map[attribute.Key]string{
		"server.address": "::1",
		"server.port":    itoa(port),
	})
	checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{
		"cube.upstream.address": "[::1]:" + itoa(port),
	})
}

// Sandboxes on IPv6 addresses, from the memory store and from Redis: plain
// HTTP, an SSE stream whose events arrive while the sandbox holds it open,
// and a WebSocket, through a proxy listening on [::1]; on this node
// (HostIP an IPv4-mapped node_ip, dialing SandboxIP:container port) and across nodes
// (HostIP:host port).
func TestIPv6SandboxTargets(t *testing.T) {
	ack := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/echo", echoHeaders())
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i, i)
			f.Flush()
			select {
			case <-ack: // the client has event i: it was not held back
			case <-r.Context().Done():
				return
			}
		}
	})
	ended := make(chan error, 4)
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			ended <- err
			return
		}
		defer c.CloseNow()
		typ, msg, err := c.Read(r.Context())
		if err == nil {
			err = c.Write(r.Context(), typ, msg)
		}
		ended <- err
	})
	port := backend(t, "[::1]", mux)

	for _, store := range []string{"memory", "redis"} {
		for _, node := range []struct {
			name, nodeIP string
		}{{"cross-node", ""}, {"same node", "127.0.0.1"}} {
			t.Run(store+"/"+node.name, func(t *testing.T) {
				fields := map[string]string{
					// HostIP:host port across nodes; SandboxIP:container
					// port on this node. Both are the backend.
					"HostIP": "::1", "SandboxIP": "::1", "CreatedAt": "1", itoa(port): itoa(port),
				}
				if node.nodeIP == "" {
					fields["SandboxIP"] = "2001:db8::dead" // never dialed
				} else {
					fields["HostIP"] = "::ffff:127.0.0.1" // this node, IPv4-mapped
				}
				mods := []func(*harnessOpts){func(o *harnessOpts) {
					o.listen = "[::1]"
					if node.nodeIP != "" {
						o.cfg.NodeIP = netip.MustParseAddr(node.nodeIP)
					}
				}}
				var h *harness
				if store == "redis" {
					r, rs := redisStore(t)
					mods = append(mods, func(o *harnessOpts) { o.store = rs })
					h = newHarness(t, mods...)
					args := []any{}
					for k, v := range fields {
						args = append(args, k, v)
					}
					if err := r.Client().HSet(context.Background(), redisstore.DefaultKeyPrefix+"six", args...).Err(); err != nil {
						t.Fatal(err)
					}
				} else {
					h = newHarness(t, mods...)
					h.put("six", fields)
				}
				host := itoa(port) + "-six.cube.test"

				// HTTP.
				status, body, _ := h.get(host, "/echo")
				var e echoed
				if status != 200 || json.Unmarshal([]byte(body), &e) != nil {
					t.Fatalf("GET /echo: %d %q", status, body)
				}
				if got := e.get("X-Real-Ip"); got != "::1" {
					t.Errorf("X-Real-IP %q, want ::1", got)
				}

				// SSE: event i+1 is written only once the client has event i.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp := h.do(h.req("GET", host, "/events", nil).WithContext(ctx))
				br := bufio.NewReader(resp.Body)
				for i := 1; i <= 3; i++ {
					ev, err := readEvent(br)
					if want := fmt.Sprintf("id: %d\ndata: event %d\n", i, i); err != nil || ev != want {
						t.Fatalf("event %d = %q, %v; want %q", i, ev, err, want)
					}
					select {
					case ack <- struct{}{}:
					case <-ctx.Done():
						t.Fatal("the sandbox stopped waiting for the ack")
					}
				}
				resp.Body.Close()

				// WebSocket.
				c, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host})
				if err != nil {
					t.Fatalf("WebSocket through the proxy: %v", err)
				}
				defer c.CloseNow()
				if err := c.Write(ctx, websocket.MessageText, []byte("hello six")); err != nil {
					t.Fatal(err)
				}
				if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hello six" {
					t.Fatalf("echo: %q, %v", msg, err)
				}
				if err := <-ended; err != nil {
					t.Fatalf("sandbox's WebSocket: %v", err)
				}
			})
		}
	}
}

// A route naming the proxy's own listener through any spelling of a local
// address is refused (508 proxy_loop) once connected, never followed; a
// route to another server on the same port of another address family, or
// of another loopback address, is not a loop and is served.
func TestIPv6RouteToOwnListener(t *testing.T) {
	type row struct {
		listen string
		loops  []string // HostIPs that reach the proxy itself
		other  string   // a listener of another server on the proxy's port, and the HostIP that reaches it
	}
	rows := withLocalIPv6(t, []row{
		{"[::]", []string{"::1", "127.0.0.1", "::ffff:127.0.0.1", "127.0.0.2", "::ffff:127.0.0.2"}, ""},
		{"0.0.0.0", []string{"::1", "127.0.0.1", "::ffff:127.0.0.1"}, ""}, // Go listens dual-stack
		{"[::1]", []string{"::1"}, "127.0.0.1"},
		{"127.0.0.1", []string{"127.0.0.1", "::ffff:127.0.0.1"}, "::1"},
	}, func(ip string) []row {
		return []row{
			// The machine's own address reaches a wildcard listener too.
			{"[::]", []string{ip}, ""},
			{"0.0.0.0", []string{ip}, ""},
			{"[" + ip + "]", []string{ip}, "::1"},
		}
	})
	for _, tc := range rows {
		t.Run(tc.listen+" via "+strings.Join(tc.loops, ","), func(t *testing.T) {
			// The other server's listener comes first, on the port the
			// proxy got: another process may hold that port on the other
			// address, so a taken one means a new proxy port, not a skip.
			var h *harness
			var ln net.Listener
			for attempt := 1; ; attempt++ {
				h = newHarness(t, func(o *harnessOpts) { o.listen = tc.listen })
				if tc.other == "" {
					break
				}
				var err error
				ln, err = net.Listen("tcp", net.JoinHostPort(tc.other, portOf(t, h.addr)))
				if err == nil {
					t.Cleanup(func() { ln.Close() })
					break
				}
				if attempt == 5 {
					t.Fatalf("another server on the proxy's port at %s: %v", tc.other, err)
				}
			}
			port := portOf(t, h.addr)
			try := func(hostIP string) (int, string) {
				t.Helper()
				h.put("me", map[string]string{"HostIP": hostIP, "CreatedAt": "1", "80": port})
				status, body, _ := h.get("80-me.cube.test", "/")
				return status, body
			}
			for _, ip := range tc.loops {
				if status, body := try(ip); status != 508 || !strings.Contains(body, CodeProxyLoop) {
					t.Errorf("HostIP %s, the proxy's own port: %d %s, want 508 %s", ip, status, body, CodeProxyLoop)
				}
			}
			if tc.other == "" {
				return
			}
			srv := &http.Server{Handler: whoami("other")}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			if status, body := try(tc.other); status != 200 || !strings.HasPrefix(body, "other ") {
				t.Errorf("HostIP %s, another server on the proxy's port: %d %s, want 200 from it", tc.other, status, body)
			}
		})
	}
}

// The admin API without a token answers loopback clients only, whichever
// family they come in over: on a dual-stack listener an IPv4 client is
// ::ffff:127.0.0.1, still loopback; the machine's own IPv6 address is a
// local address but no loopback client, and is refused.
func TestIPv6AdminLoopback(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.listen = "[::]" })
	port := portOf(t, h.admin)
	type row struct {
		client string
		status int
	}
	rows := withLocalIPv6(t, []row{
		{"[::1]", 200},
		{"127.0.0.1", 200},
		{"[::ffff:127.0.0.1]", 200},
	}, func(ip string) []row { return []row{{"[" + ip + "]", 403}} })
	for _, tc := range rows {
		t.Run(tc.client, func(t *testing.T) {
			// Host is an IP literal, as admin tools send it.
			resp, err := http.Get("http://" + tc.client + ":" + port + "/admin/routes")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("GET /admin/routes from %s: %d %s, want %d", tc.client, resp.StatusCode, b, tc.status)
			}
		})
	}
}

// A client's Forwarded header (RFC 7239) is not the proxy's to vouch for,
// but frameworks read it before X-Forwarded-For (Rack 3 by default,
// Spring's ForwardedHeaderFilter) and take the rightmost element a trusted
// proxy did not add for the client: passed untouched, "for=6.6.6.6" forged
// the client address the proxy vouches for in X-Real-IP and
// X-Forwarded-For. The proxy appends its element, as it appends to
// X-Forwarded-For, with an IPv6 address quoted and bracketed as the RFC
// requires (a bare "for=::1" is no token), and an IPv4-mapped client as
// IPv4. A request without Forwarded gets none, as through nginx.
func TestForwardedGetsTheProxysElement(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.listen = "[::]" })
	port := backend(t, "127.0.0.1", echoHeaders())
	h.put("fwd", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
	proxyPort := portOf(t, h.addr)
	for _, tc := range []struct {
		name, client string
		forwarded    []string // the client's lines
		want         string   // what reaches the sandbox ("" = no Forwarded)
	}{
		{"none", "[::1]", nil, ""},
		{"IPv6 client", "[::1]", []string{"for=6.6.6.6"}, `for=6.6.6.6, for="[::1]"`},
		{"IPv4 client", "127.0.0.1", []string{"for=6.6.6.6;proto=https"}, "for=6.6.6.6;proto=https, for=127.0.0.1"},
		{"IPv4-mapped client", "[::ffff:127.0.0.1]", []string{`for="[2001:db8::6]"`}, `for="[2001:db8::6]", for=127.0.0.1`},
		{"several lines", "[::1]", []string{"for=1.1.1.1", "", "for=2.2.2.2, for=3.3.3.3"},
			`for=1.1.1.1, for=2.2.2.2, for=3.3.3.3, for="[::1]"`},
		// An open quoted string would swallow the proxy's element: the
		// client's value is dropped, not the proxy's.
		{"open quote", "[::1]", []string{`for="[2001:db8::6`}, `for="[::1]"`},
		{"escaped quote", "[::1]", []string{`for="a\"b"`}, `for="a\"b", for="[::1]"`},
		{"escaped close", "[::1]", []string{`for="a\"`}, `for="[::1]"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{"GET / HTTP/1.1", "Host: 80-fwd.cube.test"}
			for _, f := range tc.forwarded {
				lines = append(lines, "Forwarded: "+f)
			}
			e := echoRawRequest(t, tc.client+":"+proxyPort, lines...)
			if got := e.get("Forwarded"); got != tc.want {
				t.Errorf("Forwarded reached the sandbox as %q, want %q", got, tc.want)
			}
		})
	}
	// A head of no lines at all (HTTP/1.0 in absolute form, routed by its
	// target) has no raw copy either, as a head built in code has none:
	// the proxy's element went out alone, as if the client had sent one.
	t.Run("HTTP/1.0 head without lines", func(t *testing.T) {
		resp, body := rawRequest(t, "127.0.0.1:"+proxyPort, "GET http://80-fwd.cube.test/ HTTP/1.0\r\n\r\n")
		var e echoed
		if err := json.Unmarshal([]byte(body), &e); resp.StatusCode != 200 || err != nil {
			t.Fatalf("%d %q: %v", resp.StatusCode, body, err)
		}
		if got := e.get("Forwarded"); got != "" {
			t.Errorf("Forwarded reached the sandbox as %q, want none", got)
		}
		if got := e.get("X-Forwarded-For"); got != "127.0.0.1" {
			t.Errorf("X-Forwarded-For reached the sandbox as %q, want 127.0.0.1", got)
		}
	})
}
