package proxy

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// smallChunks frames body as chunks of 1 to 3 bytes, with one chunk of
// big bytes (no chunk when 0) after the first third: a big piece goes to
// the sandbox at once, behind the small ones waiting (uploadWriter.Write).
func smallChunks(body string, big int) string {
	var b strings.Builder
	for i := 0; i < len(body); {
		n := 1 + i%3
		if big > 0 && i >= len(body)/3 && i < len(body)/3+3 {
			n = big
		}
		n = min(n, len(body)-i)
		fmt.Fprintf(&b, "%x\r\n%s\r\n", n, body[i:i+n])
		i += n
	}
	return b.String()
}

// Many chunked uploads of small chunks on one keep-alive connection, some
// with a chunk too big to wait, some after Expect: 100-continue, the last
// pipelined with a GET behind it, each reach the sandbox byte for byte in
// order, and the connection serves a GET after them: no read of a later
// request runs a hook left from an upload (WriteTo removes it on its way
// out), and the pooled buffer the pieces wait in is handed back once. A
// few connections do it at once, so that pooled bodies and buffers change
// hands between them: the race detector sees one used after it went back.
// Over TLS too.
func TestChunkedUploadCoalesceKeepAliveThenGet(t *testing.T) {
	const conns = 3
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", overTLS), func(t *testing.T) {
			h := newHarness(t)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %d %x %v", r.Method, len(b), sha256.Sum256(b), err)
			}))
			host := h.route("coalka", port)
			errs := make(chan error, conns)
			for range conns {
				c := dialProxy(t, h, host, overTLS)
				go func() { errs <- keepAliveUploads(c, host) }()
			}
			for range conns {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// keepAliveUploads makes TestChunkedUploadCoalesceKeepAliveThenGet's
// requests on c.
func keepAliveUploads(c net.Conn, host string) error {
	br := bufio.NewReader(c)
	answer := func(what string, want string) error {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return fmt.Errorf("%s: %v", what, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(got) != want || resp.Close {
			return fmt.Errorf("%s: %d %q (close %v), want 200 %q", what, resp.StatusCode, got, resp.Close, want)
		}
		return nil
	}
	const uploads = 24
	for i := range uploads {
		body := strings.Repeat(fmt.Sprintf("%d:abcdefghijklmnopqrstuvwxyz|", i), 40+i*7)
		big := 0
		if i%3 == 1 {
			big = 5000 + i
		}
		expect := i%4 == 2
		head := fmt.Sprintf("POST /up/%d HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n", i, host)
		if expect {
			head += "Expect: 100-continue\r\n"
		}
		head += "\r\n"
		raw := smallChunks(body, big) + "0\r\n\r\n"
		if i == uploads-1 {
			raw += fmt.Sprintf("GET /after HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		}
		if expect {
			if _, err := io.WriteString(c, head); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 100 {
				return fmt.Errorf("upload %d: want 100 Continue, got %v %v", i, resp, err)
			}
			head = ""
		}
		if _, err := io.WriteString(c, head+raw); err != nil {
			return err
		}
		if err := answer(fmt.Sprintf("upload %d", i), fmt.Sprintf("POST %d %x <nil>", len(body), sha256.Sum256([]byte(body)))); err != nil {
			return err
		}
	}
	if err := answer("pipelined GET", fmt.Sprintf("GET 0 %x <nil>", sha256.Sum256(nil))); err != nil {
		return err
	}
	fmt.Fprintf(c, "GET /last HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	return answer("GET after the uploads", fmt.Sprintf("GET 0 %x <nil>", sha256.Sum256(nil)))
}

// A chunked body of small chunks that goes past max_request_body is
// refused with the 413 request_body_too_large, as one sent in one chunk
// is, though the pieces read before the cap were still waiting for the
// next read of the client (uploadWriter); the sandbox never gets more than
// the cap. Over TLS too.
func TestChunkedUploadSmallChunksOverLimit(t *testing.T) {
	const limit = 1000
	body := strings.Repeat("z", 3*limit/2)
	for _, tc := range []struct {
		name string
		raw  string
	}{
		{"small chunks", smallChunks(body, 0) + "0\r\n\r\n"},
		{"small chunks around a big one", smallChunks(body, 600) + "0\r\n\r\n"},
		{"one chunk", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)},
	} {
		for _, overTLS := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tls=%v", tc.name, overTLS), func(t *testing.T) {
				h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = limit })
				got := make(chan int, 1)
				port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					got <- len(b)
				}))
				host := h.route("coallimit", port)
				c := dialProxy(t, h, host, overTLS)
				if _, err := fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, tc.raw); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 413 || !strings.Contains(string(b), CodeBodyTooLarge) {
					t.Fatalf("answer %d %s, want 413 %s", resp.StatusCode, b, CodeBodyTooLarge)
				}
				select {
				case n := <-got:
					if n > limit {
						t.Fatalf("the sandbox got %d bytes of a body capped at %d", n, limit)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the sandbox's read of the refused body never ended")
				}
			})
		}
	}
}

// chunkedProgressBackend is a raw sandbox that reads one chunked request
// and sends on progress the count of body bytes it has, after each chunk;
// it never answers, and reads until the proxy closes.
func chunkedProgressBackend(t *testing.T) (uint16, <-chan int) {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	progress := make(chan int, 1024)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		size := 0
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			n, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 64)
			if err != nil || n == 0 {
				break
			}
			if _, err := io.CopyN(io.Discard, br, n+2); err != nil {
				return
			}
			size += int(n)
			progress <- size
		}
		_, _ = io.Copy(io.Discard, br)
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port), progress
}

// waitBodyBytes waits until the sandbox has want bytes of the body.
func waitBodyBytes(t *testing.T, progress <-chan int, want int) {
	t.Helper()
	seen := 0
	for seen < want {
		select {
		case seen = <-progress:
		case <-time.After(5 * time.Second):
			t.Fatalf("the sandbox has %d of the %d bytes the client sent", seen, want)
		}
	}
}

// A client that sends small chunks in one write and then stalls gets the
// 408 request_body_timeout at client.body_timeout, as one that sent a
// chunk: the pieces waiting for company go to the sandbox before the read
// that waits for the client (all of them, before the timeout), and the
// status and error code are the same. Over TLS too.
func TestChunkedUploadSmallChunksThenStall(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	body := strings.Repeat("s", 700)
	for _, tc := range []struct {
		name string
		raw  string
	}{
		{"small chunks", smallChunks(body, 0)},
		{"one chunk", fmt.Sprintf("%x\r\n%s\r\n", len(body), body)},
	} {
		for _, overTLS := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tls=%v", tc.name, overTLS), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, func(o *harnessOpts) { o.srv.ClientBodyTimeout = timeout })
				port, progress := chunkedProgressBackend(t)
				host := h.route("coalstall", port)
				c := dialProxy(t, h, host, overTLS)
				if _, err := fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, tc.raw); err != nil {
					t.Fatal(err)
				}
				waitBodyBytes(t, progress, len(body))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 408 || !strings.Contains(string(b), CodeBodyTimeout) {
					t.Fatalf("answer %d %s, want 408 %s", resp.StatusCode, b, CodeBodyTimeout)
				}
			})
		}
	}
}

// A chunked upload of small chunks whose client stalls is cut at the drain
// deadline (504 drain_timeout, logged) as a Content-Length one is
// (TestDrainCutsStalledUpload): what the client sent reached the sandbox
// before the read that waits for more, and the cut ends that read.
func TestDrainCutsStalledChunkedUploadOfSmallChunks(t *testing.T) {
	const drain = 300 * time.Millisecond
	h, buf, al := drainLogHarness(t, drain)
	port, progress := chunkedProgressBackend(t)
	host := h.route("stalled-chunks", port)
	c := dialRaw(t, h.addr)
	body := strings.Repeat("d", 900)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: stalled-chunks\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, smallChunks(body, 0))
	waitBodyBytes(t, progress, len(body))
	wantDrainCut(t, h, c, "POST", "stalled-chunks", drain, buf, al)
}

// A sandbox that answers a chunked upload of small chunks before its end
// (a 413 from the head alone), or resets the connection, ends it as it
// ends one sent in one chunk: the client, which sent part of its body and
// then waits, gets the same status and error code either way, at once,
// not at client.body_timeout. The pieces waiting for company when the
// answer came go nowhere after it (uploadWriter.beforeRead looks first),
// as a piece read after it went nowhere before.
func TestChunkedUploadSmallChunksAnsweredEarly(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("e", 900)
	bodies := []struct {
		name string
		raw  string
	}{
		{"small chunks", smallChunks(body, 0)},
		{"one chunk", fmt.Sprintf("%x\r\n%s\r\n", len(body), body)},
	}
	done := make(chan struct{}) // the sandbox that reads no more lets go
	t.Cleanup(func() { close(done) })
	for _, sb := range []struct {
		name string
		// then is what the sandbox does after the head of the request.
		then func(c net.Conn, br *bufio.Reader)
	}{
		{"413 then reads no more", func(c net.Conn, br *bufio.Reader) {
			io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig")
			<-done
		}},
		{"413 then reads on", func(c net.Conn, br *bufio.Reader) {
			io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig")
			io.Copy(io.Discard, br)
		}},
		{"reset", func(c net.Conn, br *bufio.Reader) {
			c.(*net.TCPConn).SetLinger(0)
		}},
	} {
		t.Run(sb.name, func(t *testing.T) {
			t.Parallel()
			var answers []string
			for _, bd := range bodies {
				h := newHarness(t, func(o *harnessOpts) { o.srv.ClientBodyTimeout = time.Minute })
				ln := listen(t, "127.0.0.1:0")
				t.Cleanup(func() { ln.Close() })
				go func() {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
					br := bufio.NewReader(c)
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					sb.then(c, br)
				}()
				host := h.route("coalearly", uint16(ln.Addr().(*net.TCPAddr).Port))
				c := dialRaw(t, h.addr)
				start := time.Now()
				fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, bd.raw)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("%s: %v", bd.name, err)
				}
				b, _ := io.ReadAll(resp.Body)
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("%s: answered after %v", bd.name, d)
				}
				code := string(b)
				if i := strings.Index(code, `"code":"`); i >= 0 {
					code = code[i+len(`"code":"`):]
					code = code[:strings.IndexByte(code, '"')]
				}
				answers = append(answers, fmt.Sprintf("%d %s", resp.StatusCode, code))
			}
			t.Logf("answers: %q", answers)
			if answers[0] != answers[1] {
				t.Fatalf("%s answered %q, %s %q", bodies[0].name, answers[0], bodies[1].name, answers[1])
			}
		})
	}
}
