package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Settings that change what a client sees reach the proxy from the
// command line. Each is checked through its effect on a request, so a
// setting loaded but never passed on (a line lost in build) fails here:
// the proxy package's own tests set these fields directly and would not
// notice.
func TestServeWiresTrafficSettings(t *testing.T) {
	// Parallel: it waits on the proxy's timeouts, each far above a loaded
	// run's round trip; no signals, no process-wide state.
	t.Parallel()
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold": // a body that ends once the test lets it go
			// The head goes at once and a byte every 50 ms, so neither
			// response_header_timeout nor idle_timeout ends the request
			// while the test checks the next one is refused: on a loaded
			// -race run that check may outlast either.
			w.(http.Flusher).Flush()
			held <- struct{}{}
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-release:
					return
				case <-r.Context().Done():
					return
				case <-tick.C:
					_, _ = io.WriteString(w, ".")
					w.(http.Flusher).Flush()
				}
			}
		case "/mute": // never sends its head
			<-r.Context().Done()
			return
		case "/bighead": // a response head over 1 KiB
			w.Header().Set("X-Big", strings.Repeat("b", 2048))
		case "/sse": // head, then silence
			w.Header().Set("Content-Type", "text/event-stream")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hi from sandbox")
	})}
	port := serveBackend(t, backend)
	t.Cleanup(func() { close(release) }) // runs before serveBackend's Close

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
		// Every request here waits on it: far above a loaded run's round
		// trip, far below the 120 s default the 10 s client would hit.
		"--upstream-response-header-timeout", "2s",
		"--upstream-heartbeat-interval", "100ms",
		"--upstream-idle-timeout", "1s",
		"--client-max-header-size", "1024",
		"--upstream-max-header-size", "1024",
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
	expect("client.max_header_size", do("GET", openHost, "/", nil, map[string]string{"X-Big": strings.Repeat("c", 2048)}), 431)
	expect("upstream.max_header_size", do("GET", openHost, "/bighead", nil, nil), 502)

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
	select { // not a bare send: a held request that ended has no one receiving
	case release <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request ended before the test released it")
	}
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

// Connection-level settings reach the proxy: each is set far below its
// default (upstream.max_conns 1024, client timeouts 30-90 s, upstream
// idle connections 30 s), so an unwired one shows as a request that is
// not refused or a connection still open 10 s later.
func TestServeWiresConnectionSettings(t *testing.T) {
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	backendClosed := make(chan struct{}, 16)
	backend := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				held <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, "ok")
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				backendClosed <- struct{}{}
			}
		},
	}
	port := serveBackend(t, backend)
	t.Cleanup(func() { close(release) }) // runs before serveBackend's Close
	routes := boxRoutes(t, t.TempDir(), port)
	r := runServe(t, []string{
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes, "--drain-timeout", "1s",
		"--upstream-max-conns", "1",
		"--upstream-idle-conn-timeout", "300ms",
		"--client-idle-timeout", "300ms",
		"--client-read-timeout", "300ms",
		"--client-body-timeout", "300ms",
	}, noEnv)
	proxyAddr := r.a.httpLn.Addr().String()
	host := fmt.Sprintf("%d-box.cube.test", port)
	const wait = 10 * time.Second

	// dial opens a client connection and sends head (and body, if any).
	dial := func(t *testing.T, raw string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		return c, bufio.NewReader(c)
	}
	// status reads one response head and returns its status code.
	status := func(t *testing.T, br *bufio.Reader) int {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// closed reports whether the proxy closed the connection within wait.
	closed := func(br *bufio.Reader) bool {
		_, err := io.Copy(io.Discard, br)
		return err == nil // EOF; a read deadline is an error
	}
	get := "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"

	t.Run("upstream.max_conns", func(t *testing.T) {
		_, heldBR := dial(t, "GET /hold HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		select {
		case <-held:
		case <-time.After(wait):
			t.Fatal("the held request never reached the sandbox")
		}
		_, br := dial(t, get)
		if st := status(t, br); st != 503 {
			t.Errorf("second connection to a sandbox port with max_conns 1: %d, want 503 upstream_busy", st)
		}
		select { // not a bare send: a held request that ended has no one receiving
		case release <- struct{}{}:
		case <-time.After(wait):
			t.Fatal("the held request ended before the test released it")
		}
		if st := status(t, heldBR); st != 200 {
			t.Errorf("held request: %d", st)
		}
	})
	t.Run("upstream.idle_conn_timeout", func(t *testing.T) {
		for len(backendClosed) > 0 { // closes of the last subtest's connections
			<-backendClosed
		}
		_, br := dial(t, get)
		if st := status(t, br); st != 200 {
			t.Fatalf("GET: %d", st)
		}
		select {
		case <-backendClosed:
		case <-time.After(wait):
			t.Error("the proxy's idle keep-alive connection to the sandbox still open 10 s after a 300 ms idle_conn_timeout")
		}
	})
	t.Run("client.idle_timeout", func(t *testing.T) {
		_, br := dial(t, get)
		if st := status(t, br); st != 200 {
			t.Fatalf("GET: %d", st)
		}
		if !closed(br) {
			t.Error("idle keep-alive client connection still open 10 s after a 300 ms idle_timeout")
		}
	})
	t.Run("client.read_timeout", func(t *testing.T) {
		_, br := dial(t, "GET / HTTP/1.1\r\nHost: "+host+"\r\n") // the head never ends
		if !closed(br) {
			t.Error("connection with an unfinished head still open 10 s after a 300 ms read_timeout")
		}
	})
	t.Run("client.body_timeout", func(t *testing.T) {
		// More than the 8 KiB fasthttp reads with the head, then a stall.
		_, br := dial(t, "POST / HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("x", 16<<10))
		if st := status(t, br); st != 408 {
			t.Errorf("stalled upload: %d, want 408", st)
		}
	})
}

// client.max_conns (flag and environment variable) reaches the traffic
// listeners, across plain HTTP and HTTPS, and not the admin listener: a
// connection over it takes the place of one waiting for a request (which
// the proxy closes), and the operator's health checks and scrapes still
// get in.
func TestServeWiresClientMaxConns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
	}{
		{"flag", []string{"--client-max-conns", "1"}, noEnv},
		{"env", nil, func(k string) string {
			if k == "CUBEPROXY_CLIENT_MAX_CONNS" {
				return "1"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runServe(t, append([]string{"--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0",
				"--admin-addr", "127.0.0.1:0", "--routes="}, tc.args...), tc.getenv)
			if got := r.a.server.Config().MaxClientConns; got != 1 {
				t.Fatalf("server runs with MaxClientConns %d, want 1", got)
			}
			ask := func(addr string) (net.Conn, *http.Response, string) {
				t.Helper()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, "GET /admin/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("no answer from %s: %v", addr, err)
				}
				b, _ := io.ReadAll(resp.Body)
				return c, resp, string(b)
			}
			// closed fails unless the proxy closed c.
			closed := func(c net.Conn, what string) {
				t.Helper()
				var b [1]byte
				if n, err := c.Read(b[:]); n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
					t.Errorf("%s: read %d bytes, %v; want it closed to make room under client.max_conns 1", what, n, err)
				}
			}
			// The held connection: any answer (400, no sandbox named)
			// keeps it open, waiting for its next request.
			held, resp, _ := ask(r.a.httpLn.Addr().String())
			if resp.StatusCode == 503 {
				t.Fatal("first connection refused")
			}
			// A new client takes its place, as nginx's at
			// worker_connections: the limit of 1 is in force. (Refused
			// only in the instant before the held one waits again.)
			var second net.Conn
			deadline := time.Now().Add(5 * time.Second)
			for {
				c, resp, body := ask(r.a.httpLn.Addr().String())
				if resp.StatusCode != 503 {
					second = c
					break
				}
				if !strings.Contains(body, `"code":"proxy_overloaded"`) || time.Now().After(deadline) {
					t.Fatalf("second connection with client.max_conns 1: %d %s", resp.StatusCode, body)
				}
			}
			closed(held, "the held connection")
			// HTTPS shares the limit: its client takes the second's place
			// (refused, its handshake cut, only in the instant before the
			// second waits again, as above).
			for deadline := time.Now().Add(5 * time.Second); ; {
				c, err := tls.Dial("tcp", r.a.httpsLn.Addr().String(), &tls.Config{InsecureSkipVerify: true})
				if err == nil {
					c.Close()
					break
				}
				if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) || time.Now().After(deadline) {
					t.Fatalf("HTTPS connection with one plain connection waiting: %v", err)
				}
			}
			closed(second, "the second connection, after an HTTPS client came")
			for range 3 {
				if _, resp, body := ask(r.a.adminLn.Addr().String()); resp.StatusCode != 200 {
					t.Fatalf("admin listener with client.max_conns open: %d %s", resp.StatusCode, body)
				}
			}
		})
	}
}

// serveBackend serves backend on a loopback port until the test ends and
// returns the port.
func serveBackend(t *testing.T, backend *http.Server) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(ln)
	t.Cleanup(func() { _ = backend.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}
