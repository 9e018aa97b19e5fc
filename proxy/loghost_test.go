package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// A Host with userinfo ("u:pw@3000-x.cube.test", a client that copied a
// URL's authority into it) is refused 400, but the refusal's access log
// line showed the Host as sent, password and all, on every listener, in
// both formats: its userinfo is logged as REDACTED, as an absolute-form
// target's is.
func TestHostUserinfoRedactedInAccessLog(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, format := range []string{"json", "cube"} {
		t.Run(format, func(t *testing.T) {
			h, logs := logHarness(t, format)
			rln := listen(t, "127.0.0.1:0")
			go h.server.ServeRedirect(rln, "8443")
			for _, tc := range []struct{ listener, addr, host, want string }{
				{"traffic", h.addr, "u:" + secret + "@3000-box.cube.test", "REDACTED@3000-box.cube.test"},
				{"traffic", h.addr, secret + "@3000-box.cube.test:8081", "REDACTED@3000-box.cube.test:8081"},
				{"redirect", rln.Addr().String(), "u:" + secret + "@3000-box.cube.test", "REDACTED@3000-box.cube.test"},
				{"redirect", rln.Addr().String(), "a@b:" + secret + "@3000-box.cube.test", "REDACTED@3000-box.cube.test"},
			} {
				resp, body := rawRequest(t, tc.addr, "GET /p HTTP/1.1\r\nHost: "+tc.host+"\r\n\r\n")
				checkProxyError(t, resp, body, 400, CodeBadRequest)
				id := resp.Header.Get(HeaderRequestID)
				var line, host string
				if format == "json" {
					entry := logs.waitJSON(t, id)
					host, _ = entry["host"].(string)
				} else {
					f := logs.wait(t, id)
					host = f[1]
				}
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, id) {
						line = l
					}
				}
				if strings.Contains(line, secret) {
					t.Errorf("%s listener, Host %q: the line leaks the userinfo: %s", tc.listener, tc.host, line)
				}
				want := tc.want
				if format == "cube" {
					want = strings.TrimSuffix(want, ":8081") // nginx's $host has no port
				}
				if host != want {
					t.Errorf("%s listener, Host %q: logged host %q, want %q", tc.listener, tc.host, host, want)
				}
			}
		})
	}
}

// The cube format's host is nginx's $host, which the platform's pipelines
// group by: the Host's name lowercased, without its port or a trailing
// dot (nginx 1.22.1 logs "Foo.EXAMPLE.com:8080" as "foo.example.com"). A
// client of a path route or of a proxy on a port of its own sends the
// port; earlier builds logged the Host as sent. The JSON line keeps it so.
func TestCubeHostIsNginxHost(t *testing.T) {
	for _, format := range []string{"json", "cube"} {
		t.Run(format, func(t *testing.T) {
			h, logs := logHarness(t, format)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			host := h.route("hostcase", port)
			for _, sent := range []string{host + ":8081", strings.ToUpper(host), strings.ToUpper(host) + ".:443"} {
				resp, _ := rawRequest(t, h.addr, "GET /p HTTP/1.1\r\nHost: "+sent+"\r\n\r\n")
				if resp.StatusCode != 200 {
					t.Fatalf("Host %q: status %d", sent, resp.StatusCode)
				}
				id := resp.Header.Get(HeaderRequestID)
				want, got := host, ""
				if format == "json" {
					want = sent
					got, _ = logs.waitJSON(t, id)["host"].(string)
				} else {
					got = logs.wait(t, id)[1]
				}
				if got != want {
					t.Errorf("Host %q: logged %q, want %q", sent, got, want)
				}
			}
		})
	}
}
