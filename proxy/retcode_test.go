package proxy

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Every traffic answer carries the platform proxy's X-Cube-Retcode: 310
// and the status for what the proxy answered without asking a sandbox,
// 330 and the status for a sandbox's answer other than a 200 (or the
// proxy's 502 when the exchange with it failed), 310200 for a 200; a
// sandbox's own line is replaced.
func TestRetcodeOnEveryAnswer(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.srv.MaxRequestHeaderSize = 4096 })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderRetcode, "999999") // forged: replaced
		switch r.URL.Path {
		case "/missing":
			w.WriteHeader(404)
		case "/created":
			w.WriteHeader(201)
		}
	}))
	host := h.route("retbox", port)
	putAuthRoute(h, "retlocked", rawToken, port, 8080)
	dead := listen(t, "127.0.0.1:0")
	deadPort := uint16(dead.Addr().(*net.TCPAddr).Port)
	dead.Close()
	deadHost := h.route("retdead", deadPort)
	ended := make(chan error, 1)
	wsHost := h.route("retws", wsBackend(t, ended))
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")

	for _, tc := range []struct {
		name, addr, head string
		status           int
		want             string
	}{
		{"sandbox 200", h.addr, "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 200, "310200"},
		{"sandbox 404", h.addr, "GET /missing HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 404, "330404"},
		{"sandbox 201", h.addr, "GET /created HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 201, "330201"},
		{"by path", h.addr, "GET /sandbox/retbox/" + itoa(port) + "/missing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404, "330404"},
		{"sandbox unreachable", h.addr, "GET / HTTP/1.1\r\nHost: " + deadHost + "\r\n\r\n", 502, "330502"},
		{"unknown sandbox", h.addr, "GET / HTTP/1.1\r\nHost: 80-nosuch.cube.test\r\n\r\n", 404, "310404"},
		{"bad host", h.addr, "GET / HTTP/1.1\r\nHost: nodash.cube.test\r\n\r\n", 400, "310400"},
		{"Expect refusal", h.addr, "POST / HTTP/1.1\r\nHost: 8080-retlocked.cube.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", 403, "310403"},
		{"no token", h.addr, "GET / HTTP/1.1\r\nHost: 8080-retlocked.cube.test\r\n\r\n", 403, "310403"},
		{"refused by fasthttp", h.addr, "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Big: " + string(make([]byte, 5000)) + "\r\n\r\n", 431, "310431"},
		{"redirect listener", rln.Addr().String(), "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 308, "310308"},
	} {
		_, _, resp, _ := rawAsk(t, tc.addr, tc.head)
		if got := resp.Header.Values(HeaderRetcode); resp.StatusCode != tc.status || len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: %d with %s %q, want %d with %s", tc.name, resp.StatusCode, HeaderRetcode, got, tc.status, tc.want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: wsHost, Subprotocols: []string{"echo.v1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if got := resp.Header.Get(HeaderRetcode); got != "330101" {
		t.Errorf("101: %s %q, want 330101 (the platform's code for any answer of a sandbox but a 200)", HeaderRetcode, got)
	}
}
