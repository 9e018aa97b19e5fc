package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A request whose upload a kill (meta/delete) cut, while its client sends
// no more of the body, is answered at once (410 sandbox_killed), as at the
// drain deadline: the proxy's read of the client's body is woken, not left
// waiting client.body_timeout (60 s) with the killed sandbox's slot held.
func TestKillCutsAStalledUpload(t *testing.T) {
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
	host := h.route("ku", port)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := "POST /upload HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 10000000\r\n\r\n"
	if _, err := c.Write(append([]byte(head), make([]byte, 256<<10)...)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload did not reach the sandbox")
	}
	// The client sends no more.
	if st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"ku"}`); st != 200 {
		t.Fatalf("meta/delete: %d %v", st, out)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 10 s of the kill: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 410 || !strings.Contains(string(body), CodeSandboxKilled) {
		t.Fatalf("stalled upload across the kill: %d %s, want 410 %s", resp.StatusCode, body, CodeSandboxKilled)
	}
}
