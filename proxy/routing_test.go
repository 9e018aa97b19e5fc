package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// whoami answers with its own name and the client connection it saw.
func whoami(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.RemoteAddr)
	})
}

func TestBackendChoiceSameNodeVsCrossNode(t *testing.T) {
	// The sandbox listens on its own IP at the container port; its node
	// maps that port to a host port on the node IP.
	sandboxPort := backend(t, "127.0.0.2", whoami("sandbox"))
	hostPort := backend(t, "127.0.0.1", whoami("node"))
	host := fmt.Sprintf("%d-box.cube.test", sandboxPort)
	for _, tc := range []struct {
		nodeIP string
		hostIP string // "": 127.0.0.1
		want   string
	}{
		{"127.0.0.1", "", "sandbox"}, // this node runs it: dial SandboxIP:container port
		{"127.0.0.9", "", "node"},    // another node runs it: dial HostIP:host port
		{"", "", "node"},             // node IP unknown: always through the host port
		// One address, IPv4-mapped on either side (as a dual-stack socket
		// reports an IPv4 peer): still this node.
		{"127.0.0.1", "::ffff:127.0.0.1", "sandbox"},
		{"::ffff:127.0.0.1", "", "sandbox"},
	} {
		t.Run("node_ip="+tc.nodeIP+",HostIP="+tc.hostIP, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) {
				if tc.nodeIP != "" {
					o.cfg.NodeIP = netip.MustParseAddr(tc.nodeIP)
				}
			})
			fields := map[string]string{
				"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.2", "CreatedAt": "1",
				itoa(sandboxPort): itoa(hostPort),
			}
			if tc.hostIP != "" {
				fields["HostIP"] = tc.hostIP
			}
			h.put("box", fields)
			status, body, _ := h.get(host, "/")
			if status != 200 || body[:len(tc.want)] != tc.want {
				t.Fatalf("got %d %q, want %s", status, body, tc.want)
			}
		})
	}
}

func TestUnknownSandboxNegativeCache(t *testing.T) {
	// Longer than the burst can take however slow the machine: past the
	// 2 s default, a request stalled that long reads the store again.
	h := newHarness(t, func(o *harnessOpts) { o.cache.NegativeTTL = time.Minute })
	var wg sync.WaitGroup
	statuses := make(chan int, 100)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, _ := h.get("8080-nosuchbox.cube.test", "/")
			statuses <- status
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != 404 {
			t.Fatalf("status %d, want 404", s)
		}
	}
	if n := h.counts.n.Load(); n != 1 {
		t.Fatalf("store called %d times for 100 requests of one unknown id, want 1", n)
	}
}

func TestInvalidationRereadsStore(t *testing.T) {
	h := newHarness(t)
	a := backend(t, "127.0.0.1", whoami("a"))
	b := backend(t, "127.0.0.1", whoami("b"))
	h.put("inv", map[string]string{"HostIP": "127.0.0.1", "80": itoa(a)})
	if _, body, _ := h.get("80-inv.cube.test", "/"); body[0] != 'a' {
		t.Fatalf("got %q", body)
	}
	// Change the store behind the cache's back: the cache still says a.
	r, _ := h.store.Get("inv")
	r2 := &routing.Route{ID: r.ID, HostIP: r.HostIP, SandboxIP: r.SandboxIP, CreatedAt: r.CreatedAt, Public: r.Public,
		TrafficToken: r.TrafficToken, MaskRequestHost: r.MaskRequestHost, Ports: map[uint16]uint16{80: b}}
	if err := h.store.Put(r2); err != nil {
		t.Fatal(err)
	}
	if _, body, _ := h.get("80-inv.cube.test", "/"); body[0] != 'a' {
		t.Fatalf("cache should still route to a, got %q", body)
	}
	before := h.counts.n.Load()
	status, resp := h.adminDo("POST", "/admin/backend_cache/delete", `{"sandbox_id":"inv"}`, "")
	if status != 200 || resp != `{"deleted":1,"ok":true}`+"\n" {
		t.Fatalf("invalidate: %d %s", status, resp)
	}
	if _, body, _ := h.get("80-inv.cube.test", "/"); body[0] != 'b' {
		t.Fatalf("after invalidation got %q, want b", body)
	}
	if h.counts.n.Load() != before+1 {
		t.Fatal("invalidation did not make the next request read the store")
	}
}

// A sandbox recreated on the same IP:port (new CreatedAt) must not get a
// keep-alive connection that was opened to its predecessor.
func TestRecycledAddressGetsNewConnection(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", whoami("x"))
	route := func(createdAt string) {
		h.put("recyc", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": createdAt, "80": itoa(port)})
	}
	route("100")
	_, first, _ := h.get("80-recyc.cube.test", "/")
	_, again, _ := h.get("80-recyc.cube.test", "/")
	if first != again {
		t.Fatalf("same sandbox should reuse its keep-alive connection: %q vs %q", first, again)
	}
	route("200")
	_, recycled, _ := h.get("80-recyc.cube.test", "/")
	if recycled == first {
		t.Fatalf("recreated sandbox reused the old sandbox's connection %q", first)
	}
}

// On a shared host the target headers choose the sandbox. A gateway in
// front that adds its own X-Cube-Sandbox-Id line behind the client's (as
// Envoy's request_headers_to_add does by default) must not be overruled by
// the client's line: lines that disagree are a 400, not the first one.
func TestSharedHostTargetHeaderGivenTwice(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", whoami("sandbox"))
	h.route("client", port)
	h.route("gateway", port)
	for _, tc := range []struct {
		name, lines string
		status      int
		code        string
	}{
		{"ids disagree", "X-Cube-Sandbox-Id: client\r\nX-Cube-Sandbox-Id: gateway\r\nX-Cube-Sandbox-Port: " + itoa(port), 400, "invalid_sandbox_id"},
		{"ports disagree", "X-Cube-Sandbox-Id: gateway\r\nX-Cube-Sandbox-Port: 1\r\nX-Cube-Sandbox-Port: " + itoa(port), 400, "invalid_port"},
		{"same id twice", "X-Cube-Sandbox-Id: gateway\r\nX-Cube-Sandbox-Id: Gateway\r\nX-Cube-Sandbox-Port: " + itoa(port), 200, ""},
	} {
		resp, body := rawRequest(t, h.addr, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"+tc.lines+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != tc.status || !strings.Contains(body, tc.code) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, body, tc.status, tc.code)
		}
	}
}

// An absolute-form target names a host of its own, which RFC 9112 3.2.2
// (and nginx, so the platform's proxy, and any front proxy that follows
// it) goes by instead of Host. The proxy routes by Host: a target that
// names another sandbox or port is refused, before any sandbox is reached,
// so no reading of the request reaches a sandbox the other would not.
func TestAbsoluteFormTargetNamesHostsSandbox(t *testing.T) {
	h := newHarness(t)
	var hits sync.Map // backend name -> *atomic.Int64
	counted := func(name string) http.Handler {
		n := new(atomic.Int64)
		hits.Store(name, n)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			fmt.Fprintf(w, "%s %s %s", name, r.Host, r.RequestURI)
		})
	}
	pa := backend(t, "127.0.0.1", counted("a"))
	pb := backend(t, "127.0.0.1", counted("b"))
	h.put("a", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(pa), "1": itoa(pa)})
	h.put("b", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "2", "8080": itoa(pb)})
	const hostA, hostB = "8080-a.cube.test", "8080-b.cube.test"
	shared := func(id string) string {
		return "127.0.0.1\r\nX-Cube-Sandbox-Id: " + id + "\r\nX-Cube-Sandbox-Port: 8080"
	}
	for _, tc := range []struct {
		name, target, host string
		want               string // backend that answers; "" = 400 invalid_host, "bad_request" = fasthttp's 400 (userinfo, no host)
	}{
		{"another sandbox", "http://" + hostB + "/x", hostA, ""},
		{"another sandbox, https", "https://" + hostB + "/x", hostA, ""},
		{"another sandbox behind userinfo", "http://" + hostA + "@" + hostB + "/x", hostA, "bad_request"},
		{"another port", "http://1-a.cube.test/x", hostA, ""},
		{"no sandbox host", "http://other.example/x", hostA, ""},
		{"empty authority", "http:///x", hostA, "bad_request"},
		{"another sandbox than the shared host's headers", "http://" + hostA + "/x", shared("b"), ""},
		{"same sandbox", "http://" + hostA + "/x", hostA, "a"},
		{"same sandbox, case, dot, port", "HTTP://8080-A.Cube.Test.:8081/x?q", hostA, "a"},
		{"same sandbox, no path", "http://" + hostB, hostB, "b"},
		{"same sandbox as the shared host's headers", "http://" + hostB + "/x", shared("b"), "b"},
		{"shared host in both", "http://127.0.0.1:9/x", shared("b"), "b"},
		{"origin form", "/x", hostA, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string]int64{}
			hits.Range(func(k, v any) bool { before[k.(string)] = v.(*atomic.Int64).Load(); return true })
			resp, body := rawRequest(t, h.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\nConnection: close\r\n\r\n")
			if tc.want == "" || tc.want == CodeBadRequest {
				code := routing.CodeInvalidHost
				if tc.want != "" {
					code = tc.want
				}
				var e struct{ Error, Code string }
				if resp.StatusCode != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Code != code || e.Error == "" {
					t.Fatalf("%d %s, want 400 %s", resp.StatusCode, body, code)
				}
				hits.Range(func(k, v any) bool {
					if n := v.(*atomic.Int64).Load(); n != before[k.(string)] {
						t.Errorf("sandbox %s was reached", k)
					}
					return true
				})
				return
			}
			if resp.StatusCode != 200 || !strings.HasPrefix(body, tc.want+" ") {
				t.Fatalf("%d %q, want sandbox %s", resp.StatusCode, body, tc.want)
			}
		})
	}
}
