package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
)

// A request whose upload a kill (meta/delete) or a route change cut, while
// its client sends no more of the body, is answered at once, as at the
// drain deadline: the proxy's read of the client's body is woken, not left
// waiting client.body_timeout (60 s) with the sandbox's slot held for a
// body the closed sandbox connection can no longer take.
func TestCutWakesAStalledUpload(t *testing.T) {
	tests := []struct {
		name   string
		route  func(t *testing.T, h *harness, port uint16) (host, header string)
		cut    func(t *testing.T, h *harness, port uint16)
		status int
		code   string
	}{
		{"kill", func(t *testing.T, h *harness, port uint16) (string, string) {
			return h.route("su", port), ""
		}, func(t *testing.T, h *harness, _ uint16) {
			if st, out := h.adminJSON("POST", "/admin/meta/delete", `{"sandbox_id":"su"}`); st != 200 {
				t.Fatalf("meta/delete: %d %v", st, out)
			}
		}, 410, CodeSandboxKilled},
		{"token rotated", func(t *testing.T, h *harness, port uint16) (string, string) {
			putRJ(t, h, "su", rjFields(port, "1", rjTokenA, ""))
			return "8080-su.cube.test", auth.HeaderE2BTrafficToken + ": " + rjTokenA + "\r\n"
		}, func(t *testing.T, h *harness, port uint16) {
			putRJ(t, h, "su", rjFields(port, "1", rjTokenB, ""))
		}, 403, CodeCredentialRevoked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
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
			host, header := tt.route(t, h, port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			head := "POST /upload HTTP/1.1\r\nHost: " + host + "\r\n" + header + "Content-Length: 10000000\r\n\r\n"
			if _, err := c.Write(append([]byte(head), make([]byte, 256<<10)...)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the upload did not reach the sandbox")
			}
			// The client sends no more.
			tt.cut(t, h, port)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer within 10 s of the cut: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.code) {
				t.Fatalf("stalled upload across the cut: %d %s, want %d %s", resp.StatusCode, body, tt.status, tt.code)
			}
		})
	}
}
