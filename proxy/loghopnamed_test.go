package proxy

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The access log's user_agent and x_cube_instance_id are the headers as
// the client sent them, as nginx's $http_user_agent and
// $http_x_cube_instance_id are and as x_real_ip, x_forwarded_for and
// x_forwarded_proto already were. A client's Connection may name them, so
// that the proxy removes them from what the sandbox gets (hop-by-hop by
// declaration); earlier builds read them from that rewritten request, and
// such a request was logged with neither ("-" in the cube format), the
// client's agent gone from the only record of it. Both a request logged
// when the handler ends and an event stream, whose line is captured when
// its head goes out (captureEntry), are checked.
func TestAccessLogKeepsConnectionNamedHeaders(t *testing.T) {
	for _, format := range []string{accesslog.FormatCube, accesslog.FormatJSON} {
		t.Run(format, func(t *testing.T) {
			h, logs := logHarness(t, format)
			got := make(chan string, 2)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Get("User-Agent") + "|" + r.Header.Get("X-Cube-Instance-Id")
				if r.URL.Path == "/events" {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: one\n\n")
					return
				}
				fmt.Fprint(w, "ok")
			}))
			host := h.route("hopnamed", port)
			for i, path := range []string{"/plain", "/events"} {
				id := fmt.Sprintf("hopnamed-%s-%d", format, i)
				resp, body := rawRequest(t, h.addr, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n"+
					"X-Cube-Request-Id: "+id+"\r\nConnection: User-Agent, X-Cube-Instance-Id, close\r\n"+
					"User-Agent: agent/1.0\r\nX-Cube-Instance-Id: inst-7\r\n\r\n")
				if resp.StatusCode != 200 {
					t.Fatalf("%s: status %d: %s", path, resp.StatusCode, body)
				}
				if sent := testenv.Recv(t, got, 10*time.Second, "the sandbox's request"); sent != "|" {
					t.Errorf("%s: the sandbox got User-Agent|X-Cube-Instance-Id %q, which Connection named", path, sent)
				}
				var ua, inst string
				if format == accesslog.FormatCube {
					f := logs.wait(t, id)
					ua, inst = f[18], f[20]
				} else {
					e := logs.waitJSON(t, id)
					ua, _ = e["user_agent"].(string)
					inst, _ = e["x_cube_instance_id"].(string)
				}
				if ua != "agent/1.0" || inst != "inst-7" {
					t.Errorf("%s: logged user_agent %q and x_cube_instance_id %q, want the client's %q and %q",
						path, ua, inst, "agent/1.0", "inst-7")
				}
			}
		})
	}
}
