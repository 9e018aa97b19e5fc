package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Settings that change what a client sees reach the proxy from the
// command line. Each is checked through its effect on a request, so a
// setting loaded but never passed on (a line lost in build) fails here:
// the proxy package's own tests set these fields directly and would not
// notice.
func TestServeWiresTrafficSettings(t *testing.T) {
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold": // answers once the test lets it go
			held <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/mute": // never sends its head
			<-r.Context().Done()
			return
		case "/sse": // head, then silence
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hi from sandbox")
	})}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bln)
	t.Cleanup(func() { close(release); _ = backend.Close() })
	port := bln.Addr().(*net.TCPAddr).Port

	// "open" is public; "locked" needs its token except on container
	// port 80, which auth.exempt_ports opens.
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, fmt.Appendf(nil, `routes:
  open:
    HostIP: "127.0.0.1"
    "%[1]d": "%[1]d"
  locked:
    HostIP: "127.0.0.1"
    AllowPublicTraffic: "false"
    TrafficAccessToken: "%[2]s"
    "80": "%[1]d"
    "%[1]d": "%[1]d"
`, port, token), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", "1s",
		"--domains", "cube.test",
		"--shared-hosts", "gw.cube.test",
		"--max-request-body", "1024",
		"--max-streams-per-sandbox", "1",
		"--auth-exempt-ports", "80",
		"--upstream-response-header-timeout", "300ms",
		"--upstream-heartbeat-interval", "100ms",
		"--upstream-idle-timeout", "1s",
	}, noEnv)
	proxyURL := "http://" + r.a.httpLn.Addr().String()
	openHost := fmt.Sprintf("%d-open.cube.test", port)
	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, host, path string, body io.Reader, hdr map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, proxyURL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			// Not fatal: every other setting is still checked.
			t.Errorf("%s %s%s: %v", method, host, path, err)
		}
		return resp
	}
	expect := func(name string, resp *http.Response, status int) {
		t.Helper()
		if resp == nil {
			return // do reported it
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("%s: %d %s, want %d", name, resp.StatusCode, b, status)
		}
	}

	expect("shared_hosts: target from headers", do("GET", "gw.cube.test", "/", nil,
		map[string]string{"X-Cube-Sandbox-Id": "open", "X-Cube-Sandbox-Port": strconv.Itoa(port)}), 200)
	expect("domains: another domain", do("GET", fmt.Sprintf("%d-open.elsewhere.test", port), "/", nil, nil), 400)
	expect("max_request_body: 1 KiB passes", do("POST", openHost, "/", strings.NewReader(strings.Repeat("x", 1024)), nil), 200)
	expect("max_request_body: 1 KiB + 1 is refused", do("POST", openHost, "/", strings.NewReader(strings.Repeat("x", 1025)), nil), 413)
	expect("exempt_ports: restricted route, exempt port", do("GET", "80-locked.cube.test", "/", nil, nil), 200)
	expect("exempt_ports: restricted route, other port", do("GET", fmt.Sprintf("%d-locked.cube.test", port), "/", nil, nil), 403)
	expect("response_header_timeout", do("GET", openHost, "/mute", nil, nil), 504)

	// max_streams_per_sandbox: one request held open, the next refused.
	holding := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("GET", proxyURL+"/hold", nil)
		req.Host = openHost
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		holding <- resp
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request never reached the sandbox")
	}
	expect("max_streams_per_sandbox: second request", do("GET", openHost, "/", nil, nil), 429)
	release <- struct{}{}
	if resp := <-holding; resp != nil {
		expect("max_streams_per_sandbox: held request", resp, 200)
	}

	// heartbeat_interval and idle_timeout: a silent stream gets SSE
	// comments, and ends after idle_timeout all the same.
	// No client timeout here: the proxy's idle_timeout is what must end
	// the stream.
	client = &http.Client{}
	resp := do("GET", openHost, "/sse", nil, nil)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	first, ended := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(ended)
		br := bufio.NewReader(resp.Body)
		line, _ := br.ReadString('\n')
		first <- line
		_, _ = io.Copy(io.Discard, br)
	}()
	select {
	case line := <-first:
		if !strings.HasPrefix(line, ":") {
			t.Errorf("heartbeat_interval: first line of a silent stream %q, want an SSE comment", line)
		}
	case <-time.After(10 * time.Second):
		t.Error("heartbeat_interval: nothing on a silent stream for 10 s with a 100 ms heartbeat")
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Error("idle_timeout: a silent stream still open 10 s after a 1 s idle timeout")
	}
}
