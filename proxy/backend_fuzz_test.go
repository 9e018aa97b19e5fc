package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// rawAnswerer is a backend that answers every request head with the bytes
// it holds, whatever they are, then closes the connection.
type rawAnswerer struct {
	mu  sync.Mutex
	out []byte
}

func (a *rawAnswerer) set(b []byte) {
	a.mu.Lock()
	a.out = b
	a.mu.Unlock()
}

// serve answers the request head read from c and closes c.
func (a *rawAnswerer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	for {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		if len(bytes.TrimRight(l, "\r\n")) == 0 {
			break
		}
	}
	a.mu.Lock()
	out := a.out
	a.mu.Unlock()
	_, _ = c.Write(out)
}

// FuzzBackendRaw has the one routed backend answer with arbitrary bytes (a
// sandbox is not trusted) and checks what the client gets: no panic and no
// hang; a response a client parses (framing the sandbox made ambiguous is
// not passed on), or a close; a status from 100 to 999; X-Cube-Request-Id
// on it; no header the sandbox's Connection named; no Set-Cookie with a
// Domain other than the client's host; and, where net/http reads the
// sandbox's answer whole with the status the client got, the body the
// client reads is the one net/http reads from the sandbox's bytes (a
// response body is never cut, padded or taken from the next answer on the
// connection).
func FuzzBackendRaw(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nbody",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 302 Found\r\nLocation: //evil\r\nSet-Cookie: a=1; Domain=cube.test\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nclose-delimited",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
		"",
		"garbage",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 4\r\n\r\nbody",
		"HTTP/1.1 200 OK\r\nContent-Length: 02\r\n\r\nokextra",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\ndata: a\r\n1\r\n\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nWWW-Authenticate: Basic\r\nX-Other: 1\r\nWWW-Authenticate: Bearer\r\nWWW-Authenticate: Digest\r\nContent-Length: 0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	var a rawAnswerer
	bln := testenv.ServeTCP(f, a.serve)
	bport := strconv.Itoa(bln.Addr().(*net.TCPAddr).Port)

	addr, _ := fuzzProxy(f, map[string]map[string]string{
		"box": {"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": bport},
	}, Config{HeartbeatInterval: -1})
	const req = "GET /x HTTP/1.1\r\nHost: 8080-box.cube.test\r\nConnection: close\r\n\r\n"

	f.Fuzz(func(t *testing.T, answer []byte) {
		a.set(answer)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		out, rerr := io.ReadAll(c)
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			t.Fatalf("no answer and no close within 10 s; got %q\nfor backend answer %q", out, answer)
		}
		if len(out) == 0 {
			return
		}
		// X-Secret is hop-by-hop when a Connection line of the sandbox's
		// names it.
		namesSecret := false
		for _, l := range strings.Split(strings.ToLower(string(answer)), "\n") {
			if v, ok := strings.CutPrefix(l, "connection:"); ok {
				for tok := range strings.SplitSeq(v, ",") {
					namesSecret = namesSecret || strings.TrimSpace(tok) == "x-secret"
				}
			}
		}
		// The sandbox's final head as the proxy reads it: its repeated
		// fields' lines reach the client in their order.
		var sh fasthttp.ResponseHeader
		sbr := bufio.NewReader(bytes.NewReader(answer))
		for sh.Read(sbr) == nil && sh.StatusCode() < 200 && sh.StatusCode() != 101 {
		}
		sentLines, ordered := repeatedLines(sh.All(), sh.PeekAll)
		// The sandbox's final answer as net/http reads it: the reference
		// reading of its framing.
		refStatus, refBody, refOK := 0, []byte(nil), false
		abr := bufio.NewReader(bytes.NewReader(answer))
		for {
			r, err := http.ReadResponse(abr, &http.Request{Method: "GET"})
			if err != nil || r.StatusCode == 101 {
				break
			}
			b, err := io.ReadAll(r.Body)
			if r.StatusCode >= 200 {
				// net/http ignores Transfer-Encoding on an HTTP/1.0
				// answer and reads to the close; the proxy decodes its
				// chunks, as nginx and curl do (README, "an HTTP/1.0
				// answer with Transfer-Encoding: chunked"): no
				// reference there.
				te := bytes.Contains(bytes.ToLower(answer), []byte("chunked"))
				refStatus, refBody, refOK = r.StatusCode, b, err == nil && (r.ProtoAtLeast(1, 1) || !te)
				break
			}
		}
		br := bufio.NewReader(bytes.NewReader(out))
		for {
			resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
			if err != nil {
				if rerr != nil {
					return // reset: the answer may be cut short
				}
				t.Fatalf("unparsable answer: %v\n%q\nfor backend answer %q", err, out, answer)
			}
			body, berr := io.ReadAll(resp.Body)
			if resp.StatusCode < 100 || resp.StatusCode > 999 {
				t.Fatalf("status %d\nfor backend answer %q", resp.StatusCode, answer)
			}
			if id := resp.Header.Get(HeaderRequestID); id == "" && resp.StatusCode >= 200 {
				t.Fatalf("%d without %s\nfor backend answer %q", resp.StatusCode, HeaderRequestID, answer)
			}
			for _, ck := range resp.Cookies() {
				if ck.Domain != "" {
					t.Fatalf("Set-Cookie with Domain=%s reached the client\nfor backend answer %q", ck.Domain, answer)
				}
			}
			if resp.Header.Get("X-Secret") != "" && namesSecret || resp.Header.Get("Keep-Alive") != "" {
				t.Fatalf("a hop-by-hop header reached the client: %q\nfor backend answer %q", out, answer)
			}
			if resp.StatusCode >= 200 || resp.StatusCode == 101 {
				for name, vals := range sentLines {
					if got := resp.Header.Values(name); ordered && len(got) == len(vals) && !slices.Equal(got, vals) {
						t.Fatalf("%s lines %q reached the client as %q\nfor backend answer %q", name, vals, got, answer)
					}
				}
				// A proxy's own error (a refused framing) has a status
				// the sandbox may have sent too.
				own := bytes.HasPrefix(body, []byte(`{"error":`)) && resp.Header.Get("Cache-Control") == "no-store"
				if refOK && rerr == nil && berr == nil && resp.StatusCode == refStatus && !own && !bytes.Equal(body, refBody) {
					t.Fatalf("the client read the body %q; net/http reads %q\nfrom backend answer %q", body, refBody, answer)
				}
				return
			}
		}
	})
}
