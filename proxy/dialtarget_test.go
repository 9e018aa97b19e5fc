package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// dialRecorder is a set of listeners, each on one loopback address, that
// note every connection they accept: the addresses a request may wrongly
// make the proxy dial (the node itself, the container port on the node,
// another sandbox, a port no route exposes) and the ones a route names.
// Each answers with its own address.
type dialRecorder struct {
	mu  sync.Mutex
	got map[string]int // "ip:port" → connections accepted
}

// listenAll listens on port (0: any free one, the same for all) on each of
// ips, and returns the port.
func (d *dialRecorder) listenAll(t *testing.T, ips ...string) uint16 {
	t.Helper()
	for range 50 {
		var lns []net.Listener
		first := listen(t, ips[0]+":0")
		port := first.Addr().(*net.TCPAddr).Port
		lns = append(lns, first)
		ok := true
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		if !ok {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		for _, ln := range lns {
			d.serve(t, ln)
		}
		return uint16(port)
	}
	t.Fatal("no port free on every address")
	return 0
}

func (d *dialRecorder) serve(t *testing.T, ln net.Listener) {
	name := ln.Addr().String()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "at %s", name)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				d.mu.Lock()
				d.got[name]++
				d.mu.Unlock()
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// take returns the addresses dialed since the last take.
func (d *dialRecorder) take() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	got := d.got
	d.got = map[string]int{}
	return got
}

// No request a client without admin credentials can write makes the proxy
// connect anywhere but to an address and port its route names: the
// mapped host port on the sandbox's node, or, on this node, the sandbox's
// own address (at any container port: README "Backend choice"). Every
// address such a request could wrongly reach listens here (the node, the
// container port on another node, the sandbox's own address on another
// node, another sandbox's node, ports no route maps) and records what it
// accepts; each case may reach at most the one address its answer names.
// Hostname tricks (leading zeros, signs, ports that wrap uint16, port 0,
// non-ASCII, escapes, trailing dots, case, Host with a port), absolute-form
// targets naming another host, a second Host, override headers on sandbox
// and shared hosts, path routes (escaped slashes, dot segments, ports out
// of range or unmapped) and WebSocket upgrades are all tried.
func TestNoRequestDialsOutsideItsRoute(t *testing.T) {
	const (
		node   = "127.0.0.1" // this node (node_ip) and its services
		nodeA  = "127.0.0.2" // the node that runs sandbox a
		nodeB  = "127.0.0.3" // the node that runs sandbox b (restricted)
		sbAB   = "127.0.0.6" // a's and b's own address on their nodes
		sbHere = "127.0.0.7" // c's own address, on this node
	)
	d := &dialRecorder{got: map[string]int{}}
	ips := []string{node, nodeA, nodeB, sbAB, sbHere}
	cp := d.listenAll(t, ips...) // the container port every route exposes
	hp := d.listenAll(t, ips...) // the host port it is mapped to
	un := d.listenAll(t, ips...) // a port no route maps
	h := newHarness(t, func(o *harnessOpts) { o.cfg.NodeIP = netip.MustParseAddr(node) })
	tok := strings.Repeat("ab", 32)
	h.put("a", map[string]string{"HostIP": nodeA, "SandboxIP": sbAB, "CreatedAt": "1", itoa(cp): itoa(hp)})
	h.put("b", map[string]string{"HostIP": nodeB, "SandboxIP": sbAB, "CreatedAt": "1", itoa(cp): itoa(hp),
		"AllowPublicTraffic": "false", "TrafficAccessToken": tok})
	h.put("c", map[string]string{"HostIP": node, "SandboxIP": sbHere, "CreatedAt": "1", itoa(cp): itoa(hp)})

	at := func(ip string, port uint16) string { return net.JoinHostPort(ip, itoa(port)) }
	a := at(nodeA, hp) // the one address of a's port cp
	C, U, H := itoa(cp), itoa(un), itoa(hp)
	wrap16 := strconv.Itoa(int(cp) + 65536)
	wrap32 := strconv.Itoa(int(cp) + 1<<32)
	ws := "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, tc := range []struct {
		name   string
		target string // "" = "/"; "1.0 " before it: an HTTP/1.0 request
		host   string // the Host line(s)' value(s), "\n" between lines; "" = none
		extra  string // further header lines, each ending "\r\n"
		status int
		code   string // "" = not checked
		from   string // the address that answers 200; "" = none may be dialed
	}{
		{"plain", "", C + "-a.cube.test", "", 200, "", a},
		{"leading zeros", "", "000" + C + "-a.cube.test", "", 200, "", a},
		{"upper case", "", C + "-A.CUBE.TEST", "", 200, "", a},
		{"trailing dot", "", C + "-a.cube.test.", "", 200, "", a},
		{"Host with a port", "", C + "-a.cube.test:" + U, "", 200, "", a},
		{"host port as container port", "", H + "-a.cube.test", "", 404, CodePortNotMapped, ""},
		{"unmapped port", "", U + "-a.cube.test", "", 404, CodePortNotMapped, ""},
		{"plus sign", "", "+" + C + "-a.cube.test", "", 400, "invalid_port", ""},
		{"minus sign", "", "-" + C + "-a.cube.test", "", 400, "invalid_port", ""},
		{"port wraps uint16", "", wrap16 + "-a.cube.test", "", 400, "invalid_port", ""},
		{"port wraps uint32", "", wrap32 + "-a.cube.test", "", 400, "invalid_port", ""},
		{"port 0", "", "0-a.cube.test", "", 400, "invalid_port", ""},
		{"port 00000", "", "00000-a.cube.test", "", 400, "invalid_port", ""},
		{"hex port", "", "0x50-a.cube.test", "", 400, "invalid_port", ""},
		{"escaped dot", "", C + "-a%2ecube.test", "", 400, "", ""},
		{"Cyrillic a", "", C + "-\u0430.cube.test", "", 400, "invalid_sandbox_id", ""},
		{"full-width a", "", C + "-\uff41.cube.test", "", 400, "invalid_sandbox_id", ""},
		{"Kelvin sign in id", "", C + "-\u212a.cube.test", "", 400, "invalid_sandbox_id", ""},
		{"two trailing dots", "", C + "-a.cube.test..", "", 400, "", ""},
		{"headers ignored on a sandbox host", "", C + "-a.cube.test",
			"X-Cube-Sandbox-Id: b\r\nX-Cube-Sandbox-Port: " + C + "\r\nE2b-Sandbox-Id: c\r\nE2b-Sandbox-Port: " + U + "\r\n", 200, "", a},
		{"absolute form names another sandbox", "http://" + C + "-b.cube.test/", C + "-a.cube.test", "", 400, "invalid_host", ""},
		{"absolute form names an address", "http://" + at(nodeB, hp) + "/", C + "-a.cube.test", "", 400, "invalid_host", ""},
		{"absolute form names the node", "http://" + at(node, cp) + "/", C + "-a.cube.test", "", 400, "invalid_host", ""},
		{"absolute form with userinfo", "http://" + C + "-a.cube.test@" + at(nodeB, hp) + "/", C + "-a.cube.test", "", 400, "", ""},
		{"absolute form, unmapped port", "http://" + U + "-a.cube.test/", C + "-a.cube.test", "", 400, "invalid_host", ""},
		{"two Host lines", "", C + "-a.cube.test\n" + C + "-b.cube.test", "", 400, "", ""},
		{"two Host lines, unmapped second", "", C + "-a.cube.test\n" + U + "-a.cube.test", "", 400, "", ""},
		{"userinfo in Host", "", "x@" + C + "-b.cube.test", "", 400, "", ""},
		{"folded Host line", "", C + "-a.cube.test\r\n " + U + "-a.cube.test", "", 400, "", ""},
		{"HTTP/1.0 without Host, unmapped port", "1.0 http://" + U + "-a.cube.test/", "", "", 404, CodePortNotMapped, ""},
		{"HTTP/1.0 without Host, an address", "1.0 http://" + at(nodeB, hp) + "/", "", "", 400, "missing_target_headers", ""},
		{"HTTP/1.0 without Host, userinfo", "1.0 http://" + C + "-a.cube.test@" + at(nodeB, hp) + "/", "", "", 400, "", ""},
		{"HTTP/1.0 without Host", "1.0 http://" + C + "-a.cube.test/", "", "", 200, "", a},
		{"path under a sandbox host", "/sandbox/b/" + C + "/", C + "-a.cube.test", "", 200, "", a},
		{"shared: headers", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: " + C + "\r\n", 200, "", a},
		{"shared: unmapped port", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: " + U + "\r\n", 404, CodePortNotMapped, ""},
		{"shared: port wraps", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: " + wrap16 + "\r\n", 400, "invalid_port", ""},
		{"shared: signed port", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: +" + C + "\r\n", 400, "invalid_port", ""},
		{"shared: port 0", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: 0\r\n", 400, "invalid_port", ""},
		{"shared: second port line", "", node, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: " + C + "\r\nX-Cube-Sandbox-Port: " + U + "\r\n", 400, "invalid_port", ""},
		{"shared: id names an address", "", node, "X-Cube-Sandbox-Id: 127.0.0.3\r\nX-Cube-Sandbox-Port: " + C + "\r\n", 400, "invalid_sandbox_id", ""},
		{"shared: id with a path", "", node, "X-Cube-Sandbox-Id: a/../b\r\nX-Cube-Sandbox-Port: " + C + "\r\n", 400, "invalid_sandbox_id", ""},
		{"shared: underscore spellings", "", node, "X_Cube_Sandbox_Id: a\r\nX_Cube_Sandbox_Port: " + C + "\r\n", 400, "missing_target_headers", ""},
		{"shared: restricted sandbox", "", "[::1]", "X-Cube-Sandbox-Id: b\r\nX-Cube-Sandbox-Port: " + C + "\r\n", 403, "", ""},
		{"shared: E2B restricted", "", "localhost", "E2b-Sandbox-Id: b\r\nE2b-Sandbox-Port: " + C + "\r\n", 403, "", ""},
		{"shared: IPv4-mapped Host", "", "[::ffff:127.0.0.3]:" + H, "X-Cube-Sandbox-Id: a\r\nX-Cube-Sandbox-Port: " + U + "\r\n", 404, CodePortNotMapped, ""},
		{"path", "/sandbox/a/" + C + "/", node, "", 200, "", a},
		{"path, Host names b's node", "/sandbox/a/" + C + "/x", at(nodeB, hp), "", 200, "", a},
		{"path, leading slashes", "//sandbox/a/" + C + "/", node, "", 200, "", a},
		{"path, leading zero", "/sandbox/a/0" + C + "/", node, "", 400, "invalid_port", ""},
		{"path, unmapped port", "/sandbox/a/" + U + "/", node, "", 404, CodePortNotMapped, ""},
		{"path, host port", "/sandbox/a/" + H + "/", node, "", 404, CodePortNotMapped, ""},
		{"path, port wraps", "/sandbox/a/" + wrap16 + "/", node, "", 400, "invalid_port", ""},
		{"path, port 0", "/sandbox/a/0/", node, "", 400, "invalid_port", ""},
		{"path, signed port", "/sandbox/a/+" + C + "/", node, "", 400, "invalid_port", ""},
		{"path, escaped slash", "/sandbox/a%2F" + C + "/", node, "", 400, "", ""},
		{"path, escaped slash after id", "/sandbox/a/" + C + "%2F/", node, "", 400, "invalid_port", ""},
		{"path, upper-case id", "/sandbox/A/" + C + "/", node, "", 400, "invalid_sandbox_id", ""},
		{"path, empty id", "/sandbox//" + C + "/", node, "", 400, "invalid_sandbox_id", ""},
		{"path, dots to another sandbox", "/sandbox/a/" + C + "/../../b/" + C + "/", node, "", 400, CodeBadRequest, ""},
		{"path, escaped dots", "/sandbox/a/" + C + "/%2e%2e/%2E%2E/b/" + C + "/", node, "", 400, CodeBadRequest, ""},
		{"path, escaped dots and slashes", "/sandbox/a/" + C + "/..%2f..%2fb%2f" + C, node, "", 400, CodeBadRequest, ""},
		{"path, dots before the prefix", "/x/../sandbox/b/" + C + "/", node, "", 400, "", ""},
		{"path, restricted sandbox", "/sandbox/b/" + C + "/", node, "", 403, "", ""},
		{"path wins over headers", "/sandbox/a/" + C + "/", node, "X-Cube-Sandbox-Id: b\r\nX-Cube-Sandbox-Port: " + C + "\r\n", 200, "", a},
		{"WebSocket, unmapped port", "", U + "-a.cube.test", ws, 404, CodePortNotMapped, ""},
		{"WebSocket, restricted sandbox", "", C + "-b.cube.test", ws, 403, "", ""},
		{"WebSocket, path, unmapped port", "/sandbox/a/" + U + "/", node, ws, 404, CodePortNotMapped, ""},
		// On this node: the sandbox's own address, at the container port
		// asked, never the node's.
		{"this node", "", C + "-c.cube.test", "", 200, "", at(sbHere, cp)},
		{"this node, unmapped port", "", U + "-c.cube.test", "", 200, "", at(sbHere, un)},
		{"this node, host port", "", H + "-c.cube.test", "", 200, "", at(sbHere, hp)},
		{"this node, path", "/sandbox/c/" + U + "/", node, "", 200, "", at(sbHere, un)},
		// The recorder sees a dial: b, with its token.
		{"restricted sandbox with its token", "", C + "-b.cube.test", "cube-traffic-access-token: " + tok + "\r\n", 200, "", at(nodeB, hp)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.take()
			target := tc.target
			if target == "" {
				target = "/"
			}
			proto := "HTTP/1.1"
			if t10, ok := strings.CutPrefix(target, "1.0 "); ok {
				target, proto = t10, "HTTP/1.0"
			}
			head := "GET " + target + " " + proto + "\r\n"
			if tc.host != "" {
				for _, hl := range strings.Split(tc.host, "\n") {
					head += "Host: " + hl + "\r\n"
				}
			}
			head += tc.extra + "\r\n"
			pc := h.dialProxy(t)
			resp, body := pc.doRaw(head)
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %q, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.code != "" {
				checkProxyError(t, resp, body, tc.status, tc.code)
			}
			if tc.from != "" && body != "at "+tc.from {
				t.Errorf("answered by %q, want the route's address %s", body, tc.from)
			}
			for addr, n := range d.take() {
				if addr != tc.from {
					t.Errorf("proxy connected to %s (%d times); the route names only %q", addr, n, tc.from)
				}
			}
		})
	}
}

// The client's request id is the one thing of its own a resume call to the
// lifecycle manager carries: it is a query value, escaped, and can add no
// parameter (another sandbox_id), path or fragment to the call.
func TestResumeCallTakesNoURLFromTheClient(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.URL.Path+" "+strings.Join(r.URL.Query()["sandbox_id"], ",")+" "+r.URL.Query().Get("request_id"))
		mu.Unlock()
	}))
	h, host := resumeHarness(t, &fakeSidecar{addr: "127.0.0.1:" + itoa(port)}, 5*time.Second)
	const id = "r1&sandbox_id=other/../../x?y#z"
	for range 2 {
		h.setSandboxState("sleepy", "paused")
		req := h.req("GET", host, "/", nil)
		req.Header.Set(HeaderRequestID, id)
		resp := h.do(req)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d, want 200 after the resume", resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := "/internal/resume sleepy " + id
	if len(calls) != 2 || calls[0] != want || calls[1] != want {
		t.Fatalf("lifecycle manager saw %q, want twice %q", calls, want)
	}
}

// The machine's own non-loopback IPv4 address, as a route's HostIP, reaches
// a wildcard listener of the proxy (":8081", the default): the connection
// comes from that same address, and is refused as a loop (508) before a
// byte is sent, as through 127.0.0.1 (TestRouteToOwnListenerIsALoop) and
// the IPv6 addresses (TestIPv6RouteToOwnListener).
func TestRouteToOwnWildcardListenerThroughNodeIPv4(t *testing.T) {
	var ip string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && hasLocalAddr(n.IP.String()) {
			ip = n.IP.String()
			break
		}
	}
	if ip == "" {
		t.Skip("this machine has no non-loopback IPv4 address")
	}
	for _, listen := range []string{"0.0.0.0", "[::]"} {
		t.Run(listen, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.listen = listen })
			for _, port := range []string{portOf(t, h.addr), portOf(t, h.admin)} {
				h.put("me", map[string]string{"HostIP": ip, "CreatedAt": "1", "80": port})
				if status, body, _ := h.get("80-me.cube.test", "/"); status != 508 || !strings.Contains(body, CodeProxyLoop) {
					t.Errorf("HostIP %s, the proxy's own port %s: %d %s, want 508 %s", ip, port, status, body, CodeProxyLoop)
				}
			}
		})
	}
}
