package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A WebSocket whose upgrade was judged, and whose route changes after its
// sandbox connection left the pool's busy list for the tunnel's (splice)
// but before the tunnel was listed there, is judged as it is listed: the
// change's walk found it on neither list. Opened with the rotated token,
// it is cut (credential_revoked), not left relaying until the janitor's
// next look.
func TestRouteChangeDuringTunnelHandOffIsJudged(t *testing.T) {
	const host = "8080-rh.cube.test"
	// The janitor's look (rejudgeOpen) comes each 30 s here, after the
	// waits below: what they see cut is the change's own doing.
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute })
	b := newRJBackend(t)
	putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenA, ""))
	var changed atomic.Bool
	h.proxy.afterHandOff = func() {
		if changed.CompareAndSwap(false, true) {
			putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenB, ""))
			rereadsDone(t, h, "rh")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: rjCreds{token: rjTokenA}.header()})
	if !changed.Load() {
		t.Fatalf("the upgrade did not reach its hand-off (%v): the case tests nothing", err)
	}
	if err == nil {
		// The 101 may have gone out before the cut: the tunnel is cut.
		defer ws.CloseNow()
		wsCut(t, ws, "WebSocket across the change")
	}
	testenv.WaitFor(t, 10*time.Second, "the access log line with error_code "+CodeCredentialRevoked, func() bool {
		return strings.Contains(logs.String(), `"error_code":"`+CodeCredentialRevoked+`"`)
	})
}

// A request re-sent on a new connection because the kept-alive one it
// took had been closed by the sandbox (roundTrip's retry) is judged again
// as it takes the new one: a change whose walk ran in between, while no
// list of the pool held the request, would otherwise let the old token's
// request through on the retry.
func TestRouteChangeBeforeRetryIsJudged(t *testing.T) {
	const host = "8080-rr.cube.test"
	h := newHarness(t)
	var dropped atomic.Bool
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/drop" && dropped.CompareAndSwap(false, true) {
			// Closed before any answer: the proxy re-sends the GET.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	putRJ(t, h, "rr", rjFields(port, "1", rjTokenA, ""))
	get := func(path string) (int, string) {
		t.Helper()
		req := h.req("GET", host, path, nil)
		req.Header.Set(auth.HeaderE2BTrafficToken, rjTokenA)
		resp := h.do(req)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// A connection to keep alive for the next request.
	if st, body := get("/"); st != 200 {
		t.Fatalf("first request: %d %s", st, body)
	}
	var changed atomic.Bool
	h.proxy.beforeRetry = func() {
		if changed.CompareAndSwap(false, true) {
			putRJ(t, h, "rr", rjFields(port, "1", rjTokenB, ""))
			rereadsDone(t, h, "rr")
		}
	}
	st, body := get("/drop")
	if !changed.Load() {
		t.Fatalf("the request was not re-sent (%d %s): the case tests nothing", st, body)
	}
	if st != 403 || !strings.Contains(body, CodeCredentialRevoked) {
		t.Fatalf("request re-sent across the change: %d %s, want 403 %s", st, body, CodeCredentialRevoked)
	}
}

// A request whose upload a route change cut, while its client sends no
// more of the body, is answered at once (403 credential_revoked), as at
// the drain deadline: the proxy's read of the client's body is woken, not
// left waiting client.body_timeout (60 s) with the request's slot held,
// for a body the closed sandbox connection can no longer take.
func TestRouteChangeCutsAStalledUpload(t *testing.T) {
	const host = "8080-ru.cube.test"
	h := newHarness(t)
	arrived := make(chan struct{}, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf [32 << 10]byte
		for {
			if _, err := r.Body.Read(buf[:]); err != nil {
				return
			}
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
	}))
	putRJ(t, h, "ru", rjFields(port, "1", rjTokenA, ""))
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := "POST /upload HTTP/1.1\r\nHost: " + host + "\r\n" + auth.HeaderE2BTrafficToken + ": " + rjTokenA + "\r\nContent-Length: 10000000\r\n\r\n"
	if _, err := c.Write(append([]byte(head), make([]byte, 256<<10)...)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload did not reach the sandbox")
	}
	// The client sends no more.
	putRJ(t, h, "ru", rjFields(port, "1", rjTokenB, ""))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 10 s of the change: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(body), CodeCredentialRevoked) {
		t.Fatalf("stalled upload across the change: %d %s, want 403 %s", resp.StatusCode, body, CodeCredentialRevoked)
	}
}
