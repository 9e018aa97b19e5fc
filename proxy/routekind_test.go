package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// route_kind error is every answer the proxy gives itself, as README's
// Metrics says (a refusal, an unknown sandbox, a redirect to HTTPS): the
// 302 that trades a signed link for the cookie and the 204 to a CORS
// preflight on a restricted route reach no sandbox either, and were logged
// and counted as http, among the sandboxes' own answers, where a dashboard
// of http 3xx or 2xx read them as the sandbox's.
func TestProxysOwnAnswersAreRouteKindError(t *testing.T) {
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.Signer = signer })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	token := strings.Repeat("ab", 32)
	putAuthRoute(h, "kindbox", token, port, 8080)
	host := "8080-kindbox.cube.test"
	for _, tc := range []struct {
		name    string
		target  string
		headers map[string]string
		status  int
		kind    string
	}{
		{"signed link traded for the cookie", "/p?cube_token=" + sign("kindbox", 8080, time.Minute),
			map[string]string{"Sec-Fetch-Mode": "navigate"}, 302, "error"},
		{"CORS preflight", "/p",
			map[string]string{"Origin": "http://a.test", "Access-Control-Request-Method": "POST"}, 204, "error"},
		{"sandbox's own answer", "/p",
			map[string]string{"e2b-traffic-access-token": token}, 200, "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "GET"
			if tc.status == 204 {
				method = "OPTIONS"
			}
			req := h.req(method, host, tc.target, nil)
			id := "kind-" + strings.ReplaceAll(tc.name, " ", "-")
			req.Header.Set("X-Cube-Request-Id", id)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp := h.do(req)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			// The logged status: the client follows the 302.
			entry := buf.waitJSON(t, id)
			if entry["status"] != float64(tc.status) || entry["route_kind"] != tc.kind {
				t.Errorf("logged %v with route_kind %v; want %d, %s", entry["status"], entry["route_kind"], tc.status, tc.kind)
			}
		})
	}
}

// A WebSocket upgrade the sandbox declines (any answer but 101) opens no
// tunnel: its answer is the sandbox's like any other, logged with
// route_kind http, as README's WebSockets says (websocket is the tunnel's).
func TestDeclinedUpgradeIsRouteKindHTTP(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade asked", http.StatusBadRequest)
			return
		}
		http.Error(w, "no websocket here", http.StatusForbidden)
	}))
	host := h.route("declinebox", port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	const id = "kind-declined-upgrade"
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Cube-Request-Id: %s\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host, id)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	// A 400 would say the Upgrade was dropped as any hop-by-hop header:
	// the request went as no upgrade.
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("declined upgrade: %d, want the sandbox's 403", resp.StatusCode)
	}
	if entry := buf.waitJSON(t, id); entry["status"] != float64(403) || entry["route_kind"] != "http" {
		t.Errorf("logged %v with route_kind %v; want 403, http", entry["status"], entry["route_kind"])
	}
}
