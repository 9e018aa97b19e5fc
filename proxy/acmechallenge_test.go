package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// An HTTP-01 challenge request for a sandbox's host name is refused by the
// proxy on every listener that routes to sandboxes, and never reaches the
// sandbox: answered there, it let any sandbox owner have a publicly trusted
// certificate issued for the platform's "<port>-<id>.<domain>" names, each
// one spending the domain's CA rate limit the proxy's own on-demand
// issuance needs. The redirect listener refuses it in place of its 308
// (a CA follows the redirect to HTTPS). Other paths under /.well-known, a
// path that only holds the prefix further in, and other methods still go
// to the sandbox (or are redirected).
func TestACMEChallengeRefused(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.RequestURI)
		mu.Unlock()
		io.WriteString(w, "from the sandbox")
	}))
	h := newHarness(t)
	host := h.route("acmebox", port)
	tlsAddr, roots := serveTLS(t, h)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")

	type listener struct {
		name    string
		dial    func() net.Conn
		through int // the status of a request not refused
	}
	listeners := []listener{
		{"plain HTTP", func() net.Conn { return dialRaw(t, h.addr) }, 200},
		{"HTTPS", func() net.Conn { return tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: host}) }, 200},
		{"redirect", func() net.Conn { return dialRaw(t, rln.Addr().String()) }, 308},
	}
	cases := []struct {
		method, path string
		refused      bool
	}{
		{"GET", "/.well-known/acme-challenge/tok3n", true},
		{"HEAD", "/.well-known/acme-challenge/tok3n", true},
		{"GET", "/.well-known/acme-challenge/", true},
		{"GET", "/.well-known/acme-challenge/tok3n?x=1", true},
		{"GET", "/.well-known/other", false},
		{"GET", "/x/.well-known/acme-challenge/tok3n", false},
		{"GET", "/.well-known/acme-challengeX", false},
		{"POST", "/.well-known/acme-challenge/tok3n", false},
	}
	var want []string
	for _, l := range listeners {
		for _, tc := range cases {
			t.Run(l.name+" "+tc.method+" "+tc.path, func(t *testing.T) {
				c := l.dial()
				defer c.Close()
				fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", tc.method, tc.path, host)
				req := &http.Request{Method: tc.method}
				resp, err := http.ReadResponse(bufio.NewReader(c), req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !tc.refused {
					if resp.StatusCode != l.through {
						t.Fatalf("%d %s, want %d", resp.StatusCode, body, l.through)
					}
					if l.through == 200 {
						want = append(want, tc.method+" "+tc.path)
					}
					return
				}
				if resp.StatusCode != 403 {
					t.Fatalf("%d %s, want 403 %s", resp.StatusCode, body, CodeACMEChallenge)
				}
				if got := resp.Header.Get(HeaderRetcode); got != "310403" {
					t.Errorf("%s %q, want 310403 (answered by the proxy)", HeaderRetcode, got)
				}
				if tc.method == "HEAD" {
					return
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				if !strings.Contains(string(body), `"code":"`+CodeACMEChallenge+`"`) || !strings.Contains(string(body), `"sandbox_id":"acmebox"`) {
					t.Errorf("body %s, want code %s and the sandbox's id", body, CodeACMEChallenge)
				}
			})
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("the sandbox saw:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// Only a host that names a sandbox has its challenge path refused: on a
// shared host (an IP literal) a sandbox is routed by the X-Cube-Sandbox-Id
// headers, which no CA sends, so a request with them is the sandbox's as
// any other (acmeChallengeFor's !Shared); and the redirect listener
// redirects a challenge for a host it cannot route, such as the bare
// domain, as any request (redirectedChallenge's parse), rather than
// refusing it for a sandbox without an id.
func TestACMEChallengeOnlyForSandboxHosts(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "from the sandbox")
	}))
	h := newHarness(t)
	h.route("acmeshared", port)
	rln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(rln, "8443")
	const path = "/.well-known/acme-challenge/tok3n"
	shared := "Host: 127.0.0.1\r\nX-Cube-Sandbox-Id: acmeshared\r\nX-Cube-Sandbox-Port: " + itoa(port) + "\r\n"
	for _, tc := range []struct {
		name, addr, head string
		want             int
	}{
		{"shared host", h.addr, shared, 200},
		{"shared host, redirect listener", rln.Addr().String(), shared, 308},
		{"bare domain, redirect listener", rln.Addr().String(), "Host: cube.test\r\n", 308},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, tc.addr)
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\n%s\r\n", path, tc.head)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%d %s, want %d", resp.StatusCode, body, tc.want)
			}
		})
	}
}
