package proxy

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// targetsSandbox is a sandbox that parses what reaches it as strictly as
// net/http does, records the method and target of each request, and
// answers each with a small fixed-length body.
type targetsSandbox struct {
	mu   sync.Mutex
	seen []string
	open atomic.Int64 // connections not yet read to their end
}

func newTargetsSandbox(t *testing.T) (*targetsSandbox, uint16) {
	s := &targetsSandbox{}
	port := rawBackendCounted(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", func(req *http.Request) {
		s.mu.Lock()
		s.seen = append(s.seen, req.Method+" "+req.RequestURI)
		s.mu.Unlock()
	}, &s.open)
	return s, port
}

// parsed returns what the sandbox parsed once it has read every
// connection to its end. A connection the proxy cut short is read on its
// own goroutine, which may not have got to its bytes when an answer on
// another connection came back; so the proxy's pool is emptied and the
// sandbox waited for, and nothing of this case is recorded in the next.
func (s *targetsSandbox) parsed(t *testing.T, h *harness) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox still has %d connections open", s.open.Load())
		}
		// Again each time: the connection /after used may have been
		// checked back into the pool only after its answer was sent.
		h.proxy.pools.closeIdle()
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.seen
	s.seen = nil
	return got
}

// Request smuggling: whatever framing tricks the client plays, the sandbox
// (its pooled connection included) gets the requests the proxy answered,
// each framed on its own (a request whose body breaks reaches it cut
// short, on a connection then closed); a body's bytes never become a
// request. The proxy re-frames every request it forwards, so this rests on
// fasthttp's parser refusing what it cannot frame: a guard for fasthttp
// upgrades.
func TestSandboxSeesTheRequestsTheProxyFramed(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = 64 })
	s, port := newTargetsSandbox(t)
	host := h.route("box", port)
	h.put("priv", map[string]string{
		"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "AllowPublicTraffic": "false",
		"TrafficAccessToken": strings.Repeat("a", 64), itoa(port): itoa(port),
	})
	restricted := itoa(port) + "-priv.cube.test"
	smug := "GET /smug HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
	smugLen := itoa(uint16(len(smug)))
	last := "GET /last HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
	post := func(extra, body string) string {
		return "POST /first HTTP/1.1\r\nHost: " + host + "\r\n" + extra + "\r\n" + body
	}
	chunk := func(b string) string { return strings.ToUpper(itoaHex(len(b))) + "\r\n" + b + "\r\n" }
	for _, tc := range []struct {
		name, raw string
		want      []string // what the sandbox parses, in order
	}{
		{"Content-Length then chunked", post("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", chunk(smug)+"0\r\n\r\n"), []string{"POST /first"}},
		{"chunked then Content-Length", post("Transfer-Encoding: chunked\r\nContent-Length: 0\r\n", chunk(smug)+"0\r\n\r\n"), []string{"POST /first"}},
		{"two equal Content-Lengths", post("Content-Length: 1\r\nContent-Length: 1\r\n", "x"+smug), nil},
		{"chunked in odd case, spaced", post("Transfer-Encoding:  ChUnKeD \r\n", chunk(smug)+"0\r\n\r\n"+last), []string{"POST /first", "GET /last"}},
		{"chunked on a folded line", post("Transfer-Encoding:\r\n chunked\r\n", chunk(smug)+"0\r\n\r\n"+last), []string{"POST /first", "GET /last"}},
		{"chunked folded with identity", post("Transfer-Encoding: chunked\r\n identity\r\n", chunk(smug)+"0\r\n\r\n"), nil},
		{"chunked, then a line with a space in its name", post("Transfer Encoding: chunked\r\nContent-Length: 1\r\n", "x"+last), []string{"POST /first", "GET /last"}},
		{"chunk extensions and leading zeros", post("Transfer-Encoding: chunked\r\n", "0004;a=b;c=\"d\"\r\nabcd\r\n000\r\n\r\n"+last), []string{"POST /first", "GET /last"}},
		// A chunked body's head goes ahead of its first chunk: the sandbox
		// gets it, and then a body cut short.
		{"bare LF after a chunk size", post("Transfer-Encoding: chunked\r\n", "4\nabcd\r\n0\r\n\r\n"+smug), []string{"POST /first"}},
		{"bare LF after chunk data", post("Transfer-Encoding: chunked\r\n", "4\r\nabcd\n0\r\n\r\n"+smug), []string{"POST /first"}},
		{"framing field in the trailer", post("Transfer-Encoding: chunked\r\n", "4\r\nabcd\r\n0\r\nContent-Length: "+smugLen+"\r\n\r\n"+smug), []string{"POST /first"}},
		{"GET with a body", "GET /first HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: " + smugLen + "\r\n\r\n" + smug + last, []string{"GET /first", "GET /last"}},
		{"HTTP/1.0 keep-alive with a body", "POST /first HTTP/1.0\r\nHost: " + host + "\r\nConnection: keep-alive\r\nContent-Length: " + smugLen + "\r\n\r\n" + smug + last, []string{"POST /first", "GET /last"}},
		{"Expect: 100-continue", post("Expect: 100-continue\r\nContent-Length: "+smugLen+"\r\n", smug+last), []string{"POST /first", "GET /last"}},
		{"413 then a pipelined request", post("Content-Length: 100\r\n", smug+strings.Repeat("x", 100-len(smug))+last), nil},
		{"413 for a chunked body", post("Transfer-Encoding: chunked\r\n", chunk(strings.Repeat("x", 60))+chunk(smug)+"0\r\n\r\n"+last), []string{"POST /first"}},
		{"refused, its body dropped", "POST / HTTP/1.1\r\nHost: 80-nobox.cube.test\r\nContent-Length: " + smugLen + "\r\n\r\n" + smug + last, []string{"GET /last"}},
		{"two different Content-Lengths", post("Content-Length: 1\r\nContent-Length: "+smugLen+"\r\n", "x"+smug+last), nil},
		{"chunked, identity on one line", post("Transfer-Encoding: chunked, identity\r\n", chunk(smug)+"0\r\n\r\n"+last), nil},
		{"xchunked with a Content-Length", post("Transfer-Encoding: xchunked\r\nContent-Length: "+smugLen+"\r\n", smug+last), nil},
		{"chunked in HTTP/1.0", "POST /first HTTP/1.0\r\nHost: " + host + "\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(smug) + "0\r\n\r\n" + last, nil},
		{"chunk size with 0x", post("Transfer-Encoding: chunked\r\n", "0x4\r\nabcd\r\n0\r\n\r\n"+smug), []string{"POST /first"}},
		{"chunk size past 64 bits", post("Transfer-Encoding: chunked\r\n", "10000000000000004\r\nabcd\r\n0\r\n\r\n"+smug), []string{"POST /first"}},
		{"quoted chunk extension holding a CRLF", post("Transfer-Encoding: chunked\r\n", "4;a=\"x\r\n0\r\n\r\n"+smug+"\"\r\nabcd\r\n0\r\n\r\n"), []string{"POST /first"}},
		// A refusal that reads the body (403 of a restricted sandbox)
		// goes on with the next request; one that would have to decode
		// a chunked body, or answered an Expect, closes.
		{"403, its body dropped", "POST / HTTP/1.1\r\nHost: " + restricted + "\r\nContent-Length: " + smugLen + "\r\n\r\n" + smug + last, []string{"GET /last"}},
		{"403, its chunked body dropped", "POST / HTTP/1.1\r\nHost: " + restricted + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(smug) + "0\r\n\r\n" + last, nil},
		{"404 to Expect, body sent anyway", "POST / HTTP/1.1\r\nHost: 80-nobox.cube.test\r\nExpect: 100-continue\r\nContent-Length: " + smugLen + "\r\n\r\n" + smug + last, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			// The proxy closes the connection after the last answer (or
			// a refusal).
			out, err := io.ReadAll(c)
			if err != nil && !isConnReset(err) {
				t.Fatalf("answers: %v (%q)", err, out)
			}
			// The pooled connection (when one was kept) is not poisoned:
			// one more request on a new client connection is itself.
			if code, body, _ := h.get(host, "/after"); code != 200 || body != "ok" {
				t.Fatalf("request after: %d %q", code, body)
			}
			// The client's requests reach the sandbox in their order, one
			// answered before the next is sent; /after may be parsed
			// before a request cut short on another connection, so it is
			// counted apart.
			got := s.parsed(t, h)
			after := slices.Index(got, "GET /after")
			if after >= 0 {
				got = slices.Delete(got, after, after+1)
			}
			if after < 0 || !slices.Equal(got, tc.want) {
				t.Errorf("sandbox parsed %q and /after (%v), want %q and /after; client got %q", got, after >= 0, tc.want, out)
			}
		})
	}
}

func itoaHex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 16 {
		b = append([]byte{digits[n%16]}, b...)
	}
	return string(b)
}
