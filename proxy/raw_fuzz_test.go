package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// rawToken is the restricted route's traffic token.
const rawToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fuzzBackend is a backend of the raw-request fuzz target, the sandbox
// name: it says so in X-Echo-Sandbox. It answers 200 with a short body, an
// event stream under /sse, and a 101 (then echoes until the proxy closes
// its side) to a WebSocket upgrade: an answer of 400 and above comes from
// the proxy, or from net/http refusing to parse what the proxy sent.
func fuzzBackend(tb testing.TB, name string) uint16 {
	return backend(tb, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		echoReceived(w, r)
		w.Header().Set("X-Echo-Sandbox", name)
		// An app that echoes the id it got, and adds its own: the client
		// must still get the proxy's alone.
		w.Header()[HeaderRequestID] = append(r.Header.Values(HeaderRequestID), "sandbox-own")
		switch {
		case strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
			hj, ok := w.(http.Hijacker)
			if !ok {
				return
			}
			c, brw, err := hj.Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			_, _ = io.Copy(c, brw)
		case strings.HasPrefix(r.URL.Path, "/sse"):
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "data: two\n\n")
		default:
			w.Header().Set("Set-Cookie", "b=1; Domain=evil.example; Path=/")
			_, _ = io.WriteString(w, "ok\n")
		}
	}))
}

// echoReceived reads r's body and tells the client, in X-Echo-* response
// headers, what the sandbox got: the body's length and digest (and
// whether reading it failed), its Host, Content-Length and request ids,
// and any proxy token in the head or, read with the body's end, in the
// trailer. FuzzProxyRaw holds these to what the client sent.
func echoReceived(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	sum := sha256.Sum256(body)
	h := w.Header()
	h.Set("X-Echo-Body", fmt.Sprintf("%d:%x", len(body), sum[:8]))
	if err != nil {
		h.Set("X-Echo-Body-Err", err.Error())
	}
	h.Set("X-Echo-Host", r.Host)
	h.Set("X-Echo-Length", strconv.FormatInt(r.ContentLength, 10))
	h.Set("X-Echo-Id", strings.Join(r.Header.Values(HeaderRequestID), ","))
	for _, name := range proxyTokenHeaders {
		if len(r.Header.Values(name)) > 0 || len(r.Trailer.Values(name)) > 0 {
			h.Add("X-Echo-Token", name)
		}
	}
}

// writePieces writes raw to c in up to four pieces, cut where a hash of
// raw says, each its own write after a pause: what the proxy reads, and
// what it flushes to the sandbox as it goes (a Content-Length body piece
// by piece, a chunked body's head before its first chunk), varies with
// the input. A failed write is the proxy's refusal: the rest is not sent.
func writePieces(c net.Conn, raw []byte) {
	hs := fnv.New32a()
	_, _ = hs.Write(raw)
	s := hs.Sum32()
	cuts := []int{0, len(raw)}
	for i := range 3 {
		if len(raw) > 1 {
			cuts = append(cuts, int(s>>(8*i)&0xff)%len(raw))
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	for i := 1; i < len(cuts); i++ {
		if i > 1 {
			time.Sleep(time.Millisecond) // a pause in the client's writes, not a wait for the proxy
		}
		if _, err := c.Write(raw[cuts[i-1]:cuts[i]]); err != nil {
			return
		}
	}
}

// sentRequest is the first request in raw as net/http reads it, with its
// body, or ok false when net/http refuses it or its body.
func sentRequest(raw []byte) (req *http.Request, body []byte, ok bool) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return nil, nil, false
	}
	body, err = io.ReadAll(req.Body)
	return req, body, err == nil
}

// FuzzProxyRaw sends arbitrary bytes, as one client connection, to a real
// proxy on loopback with one public and one restricted route, both to one
// backend, and signed browser tokens on. For any input: no panic and no
// hang; the proxy answers with a response a client can parse, or closes;
// an answer of 400 or above (only the proxy gives those here, but for
// net/http's refusal of a path the proxy passes as sent) carries a JSON
// error object (or the HTML page of a browser navigating); a Location (the
// 302 that trades a signed token for a cookie) is a path on the same host;
// no Set-Cookie carries a Domain; every answer has a sane X-Cube-Request-Id;
// what the sandbox got for the first request (echoReceived) has a Host,
// the one request id the client got, the client's Content-Length, no
// proxy token in its head or a chunked body's trailer, and the body
// net/http reads from the input, intact and in order whatever the pieces
// it came in (writePieces), whatever Connection named; and no pool ever names an address other than the routed backend's (no
// request makes the proxy dial an address no route names); and the sandbox
// that answered, each route's its own backend, is the one the request names
// as net/http reads it: by an absolute-form target's host, as RFC 9112 and
// a front proxy read it, before the Host header (no request reaches another
// sandbox than a front proxy would send it to).
func FuzzProxyRaw(f *testing.F) {
	// The routes map container port 8080 to their backend's port: inputs
	// (and crashers kept in testdata) name 8080, whatever ports the
	// backends got.
	bport := strconv.Itoa(int(fuzzBackend(f, "box")))
	pport := strconv.Itoa(int(fuzzBackend(f, "priv")))
	const bp = "8080"
	host := bp + "-box.cube.test"
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"HEAD / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET /sse HTTP/1.1\r\nHost: " + host + "\r\nAccept: text/event-stream\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\n\r\nhello",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"GET /ws HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n\x81\x00",
		"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: box\r\nX-Cube-Sandbox-Port: " + bp + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: localhost\r\nE2b-Sandbox-Id: box\r\nE2b-Sandbox-Port: " + bp + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\ne2b-traffic-access-token: " + rawToken + "\r\n\r\n",
		"GET /?cube_token=AAAA HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\nSec-Fetch-Mode: navigate\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\nGET / HTTP/1.1\r\nHost: 1-box.cube.test\r\n\r\n",
		"GET http://" + host + "/x HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n",
		// Absolute-form targets naming the other sandbox than Host (or
		// the shared host's headers), and the same one.
		"GET http://" + bp + "-priv.cube.test/x HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET http://" + host + "/x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: priv\r\nX-Cube-Sandbox-Port: " + bp + "\r\n\r\n",
		"GET http://u@" + strings.ToUpper(host) + ":80/x HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: 99999-box.cube.test\r\nX-Cube-Request-Id: a\"b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Cube-Request-Id: a\r\nX-Cube-Request-Id: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
		// Expect heads with each body framing: Content-Length 0 and none
		// (no body to hold back: a 100, then the answer), chunked; one
		// refused (no token) and one to an unknown sandbox, each with a
		// request pipelined after the early answer.
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\n\r\nGET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + bp + "-none.cube.test\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		// An early answer without Expect (no token), then a pipelined
		// request.
		"POST /up HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		// Heads and bodies cut short (the client stalls, then closes).
		"GET / HTTP/1.1\r\nHost: " + host + "\r\nX-A: b",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 10\r\n\r\nabc",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\nab",
		// HTTP/1.0: routed, kept alive and pipelined, with Expect.
		"GET / HTTP/1.0\r\nHost: " + host + "\r\n\r\n",
		"GET / HTTP/1.0\r\nHost: " + host + "\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.0\r\nHost: " + host + "\r\n\r\n",
		"POST /up HTTP/1.0\r\nHost: " + host + "\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		// A chunked body's trailer with each proxy token, on a public and
		// a restricted route: none reaches the sandbox.
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\nTrailer: X-Cube-Admin-Token\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\nE2b-Traffic-Access-Token: t\r\ncube-traffic-access-token: u\r\nX-Cube-Admin-Token: a\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + bp + "-priv.cube.test\r\ne2b-traffic-access-token: " + rawToken + "\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nE2b-Traffic-Access-Token: " + rawToken + "\r\n\r\n",
		// Connection options naming the fields no option removes, with
		// a Content-Length body and a chunked one.
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nConnection: Host, Content-Length, X-Cube-Request-Id\r\nX-Cube-Request-Id: rid\r\nContent-Length: 5\r\n\r\nhello",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nConnection: host\r\nConnection: content-length, keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		// Chunked uploads in many small chunks, which wait and reach the
		// sandbox together (uploadWriter's coalescing): 1-byte chunks
		// with extensions then a trailer, small chunks around one past
		// the 4 KiB piece buffer, and a trailer of more names than the
		// line order keeps (32), a name on lines far apart, and a field
		// the head's Connection option names.
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;x=y\r\nz\r\n", 40) + "0\r\nX-Sum: 40\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("3\r\nabc\r\n", 20) + "1194\r\n" + strings.Repeat("0123456789", 450) + "\r\n" + strings.Repeat("2\r\nde\r\n", 20) + "0\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nConnection: X-Drop\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("2\r\nab\r\n", 8) + "0\r\nX-Rep: 1\r\n" + func() string {
			var b strings.Builder
			for i := range 34 {
				fmt.Fprintf(&b, "X-T%d: %d\r\n", i, i)
			}
			return b.String()
		}() + "X-Rep: 2\r\nX-Drop: d\r\n\r\n",
		// Small chunks that together pass the 4 KiB the waiting pieces
		// hold, and a trailer of more repeated names than the line order
		// keeps (8).
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("bb8\r\n"+strings.Repeat("x", 3000)+"\r\n", 3) + "0\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n" + strings.Repeat("X-A: 1\r\nX-B: 2\r\nX-C: 3\r\nX-D: 4\r\nX-E: 5\r\nX-F: 6\r\nX-G: 7\r\nX-H: 8\r\nX-I: 9\r\n", 2) + "\r\n",
		// A Content-Length body past the request writer's 4 KiB, and an
		// event stream refused by its weight.
		"PUT /up HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5000\r\n\r\n" + strings.Repeat("0123456789", 500),
		"GET /sse HTTP/1.1\r\nHost: " + host + "\r\nAccept: text/event-stream;q=0, application/json\r\n\r\n",
		// Routed by the path, on the node's address and on a sandbox
		// host (which routes by itself).
		"GET /sandbox/box/" + bp + "/sse?q HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n",
		"GET /sandbox/priv/" + bp + " HTTP/1.1\r\nHost: localhost\r\nX-Cube-Sandbox-Id: box\r\nX-Cube-Sandbox-Port: " + bp + "\r\n\r\n",
		"GET /sandbox/box/" + bp + "/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n\x81\x00",
		"GET /sandbox/priv/" + bp + "/a HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /sandbox/box/" + bp + "/../up HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello",
		"GET //sandbox/box/" + bp + "//p HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"GET /sandbox/box/" + bp + "/a#frag HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		// Path routing in absolute form: routed by the path when both
		// hosts name no sandbox; a climb or an escaped slash out of the
		// prefix, and a target host naming a sandbox, refused.
		"GET http://127.0.0.1/sandbox/box/" + bp + "/p?q HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"GET http://127.0.0.1/sandbox/priv/" + bp + "/p HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Cube-Sandbox-Id: box\r\nX-Cube-Sandbox-Port: " + bp + "\r\n\r\n",
		"GET http://" + bp + "-priv.cube.test/sandbox/box/" + bp + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"GET http://127.0.0.1/sandbox/box/" + bp + "/../../priv/" + bp + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"GET http://127.0.0.1/sandbox/box/" + bp + "%2F..%2F..%2Fpriv/" + bp + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"GET http://localhost/sandbox/box/" + bp + " HTTP/1.0\r\n\r\n",
		// Server-wide OPTIONS, in both forms.
		"OPTIONS http://" + host + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	signer := testSigner(f)
	tok, err := signer.Sign("priv", 8080, time.Now().Add(24*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("GET //evil.example/p?a=1&cube_token=" + tok + " HTTP/1.1\r\nHost: 8080-priv.cube.test\r\n\r\n"))
	f.Add([]byte("GET /sandbox/priv/8080/p?cube_token=" + tok + " HTTP/1.1\r\nHost: 127.0.0.1\r\nSec-Fetch-Mode: navigate\r\n\r\n"))

	addr, p := fuzzProxy(f, map[string]map[string]string{
		"box":  {"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", bp: bport},
		"priv": {"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "2", bp: pport, "AllowPublicTraffic": "false", "TrafficAccessToken": rawToken},
	}, Config{Signer: signer})
	routed := map[netip.AddrPort]bool{
		netip.MustParseAddrPort("127.0.0.1:" + bport): true,
		netip.MustParseAddrPort("127.0.0.1:" + pport): true,
	}
	parser := routing.NewParser(p.cfg.Parser)

	f.Fuzz(func(t *testing.T, raw []byte) {
		// The proxy may answer and close before reading everything: a
		// failed write is its refusal, and the answer is still read.
		out, rerr := fuzzExchange(t, addr, func(c net.Conn) { writePieces(c, raw) })

		p.pools.mu.RLock()
		for k := range p.pools.m {
			if !routed[k.addr] {
				t.Errorf("the proxy keeps a pool for %v; the routes name %v", k.addr, routed)
			}
		}
		p.pools.mu.RUnlock()

		if len(out) == 0 || rerr != nil && !errors.Is(rerr, syscall.ECONNRESET) {
			return // closed without an answer
		}
		// Every answer in turn (pipelined requests get one each). The
		// method of the first request tells whether its answer has a body;
		// later ones are parsed as answers to GET, and stop the check
		// when that is wrong.
		method, _, _ := bytes.Cut(raw, []byte(" "))
		br := bufio.NewReader(bytes.NewReader(out))
		for n := 0; ; n++ {
			if _, err := br.Peek(1); err != nil {
				return
			}
			req := &http.Request{Method: "GET"}
			if n == 0 {
				req.Method = string(method)
			}
			resp, err := http.ReadResponse(br, req)
			if err != nil {
				if rerr != nil || n > 0 {
					return // reset, or a later request's method unknown
				}
				t.Fatalf("unparsable answer: %v\n%q\nto %q", err, out, raw)
			}
			body, berr := io.ReadAll(resp.Body)
			if n == 0 {
				checkWholeBody(t, raw, resp.StatusCode, body)
			}
			if n == 0 && resp.Header.Get("X-Echo-Body") != "" {
				checkEcho(t, raw, resp)
				checkRouted(t, raw, resp, parser)
			}
			if ids := resp.Header.Values(HeaderRequestID); resp.StatusCode != 100 && (len(ids) != 1 || ids[0] == "" || len(ids[0]) > maxRequestIDLen || !isToken([]byte(ids[0]))) {
				t.Fatalf("%d with %s %q\nto %q", resp.StatusCode, HeaderRequestID, ids, raw)
			}
			for _, ck := range resp.Cookies() {
				if ck.Domain != "" {
					t.Fatalf("Set-Cookie with Domain=%s reached the client\nto %q", ck.Domain, raw)
				}
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				if b := browserLocation(loc); !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") {
					t.Fatalf("%d to Location %q, not a path on the sandbox's host\nto %q", resp.StatusCode, loc, raw)
				}
			}
			switch {
			case resp.StatusCode == 101 || resp.StatusCode >= 200 && resp.StatusCode < 400:
				if resp.StatusCode == 101 || resp.Close {
					return
				}
				continue
			case resp.StatusCode < 200:
				continue // 100 Continue: the answer follows
			case req.Method == "HEAD" || berr != nil:
				return
			}
			switch ct := resp.Header.Get("Content-Type"); {
			case string(body) == "400 Bad Request" && strings.HasPrefix(ct, "text/plain"):
				// net/http's answer to a request target it cannot parse
				// ("/%X0"): the proxy passes paths byte for byte, as
				// nginx does. Its answers to a bad head give a reason
				// ("400 Bad Request: invalid header name"), and the
				// proxy must not send it such a head.
			case resp.StatusCode == 417 && ct == "" && len(body) == 0:
				// net/http's answer to an expectation other than
				// 100-continue ("Expect: 00"): the sandbox's to give, as
				// the proxy passes such an Expect on (end to end, RFC
				// 9110 10.1.1); the proxy answers no 417 itself.
			case strings.HasPrefix(ct, "text/html"):
			case ct == "application/json":
				var obj struct {
					Error string `json:"error"`
					Code  string `json:"code"`
				}
				if err := json.Unmarshal(body, &obj); err != nil || obj.Error == "" || obj.Code == "" {
					t.Fatalf("%d with body %q: not a JSON error object (%v)\nto %q", resp.StatusCode, body, err, raw)
				}
			default:
				t.Fatalf("%d with Content-Type %q, body %q\nto %q", resp.StatusCode, ct, body, raw)
			}
		}
	})
}

// checkEcho holds what the sandbox reported getting for the first request
// in raw (echoReceived, in resp's head) to what the client sent.
func checkEcho(t *testing.T, raw []byte, resp *http.Response) {
	t.Helper()
	e := resp.Header
	if tok := e.Values("X-Echo-Token"); len(tok) > 0 {
		t.Fatalf("the proxy's token %q reached the sandbox\nto %q", tok, raw)
	}
	if e.Get("X-Echo-Host") == "" {
		t.Fatalf("the sandbox got no Host\nto %q", raw)
	}
	if id, got := resp.Header.Get(HeaderRequestID), e.Get("X-Echo-Id"); got != id {
		t.Fatalf("the sandbox got request id %q, the client %q\nto %q", got, id, raw)
	}
	req, want, ok := sentRequest(raw)
	if !ok || e.Get("X-Echo-Body-Err") != "" {
		return
	}
	sum := sha256.Sum256(want)
	if w := fmt.Sprintf("%d:%x", len(want), sum[:8]); e.Get("X-Echo-Body") != w {
		t.Fatalf("the sandbox got body %s, the client sent %s (%q)\nto %q", e.Get("X-Echo-Body"), w, want, raw)
	}
	if req.ContentLength > 0 && len(req.TransferEncoding) == 0 && e.Get("X-Echo-Length") != strconv.FormatInt(req.ContentLength, 10) {
		t.Fatalf("the sandbox got Content-Length %s, the client sent %d\nto %q", e.Get("X-Echo-Length"), req.ContentLength, raw)
	}
}

// checkRouted holds the sandbox that answered the first request in raw
// (X-Echo-Sandbox) to the one that request names as net/http reads it,
// whose Host is an absolute-form target's host before the Host header.
func checkRouted(t *testing.T, raw []byte, resp *http.Response, parser *routing.Parser) {
	t.Helper()
	req, _, ok := sentRequest(raw)
	if !ok {
		return
	}
	var tgt routing.Target
	err := parser.ParseRequest(&tgt, []byte(req.Host), []byte(req.RequestURI), stdHeader(req.Header))
	if got := resp.Header.Get("X-Echo-Sandbox"); err != nil || string(tgt.ID()) != got || tgt.Port != 8080 {
		t.Fatalf("sandbox %s answered a request for %d %q (%v), Host %q as net/http reads it\nto %q", got, tgt.Port, tgt.ID(), err, req.Host, raw)
	}
}

// stdHeader is a net/http request's header as a routing.HeaderPeeker.
type stdHeader http.Header

// PeekAll returns the values of every line of key.
func (h stdHeader) PeekAll(key string) [][]byte {
	var all [][]byte
	for _, v := range http.Header(h).Values(key) {
		all = append(all, []byte(v))
	}
	return all
}

// checkWholeBody fails the answer status with body to the first request
// in raw when the proxy calls a Content-Length body net/http reads whole
// from raw malformed or cut short: the proxy lost or mangled some of it
// (a Connection option took its Content-Length, an upload piece went
// astray on its way to the sandbox).
func checkWholeBody(t *testing.T, raw []byte, status int, body []byte) {
	t.Helper()
	if status != 400 && status != 499 {
		return
	}
	req, _, ok := sentRequest(raw)
	if !ok || req.ContentLength <= 0 || len(req.TransferEncoding) > 0 {
		return
	}
	// A 499 for the head is no word on the body: a head net/http reads
	// whole, fasthttp may still wait for (one whose blank line is a bare
	// LF), until the client closes.
	left := bytes.Contains(body, []byte(`"code":"client_closed_request"`)) && !bytes.Contains(body, []byte("its request head"))
	if bytes.Contains(body, []byte(`"code":"bad_request_body"`)) || left {
		t.Fatalf("%d %s to a whole Content-Length body\nto %q", status, body, raw)
	}
}

// fuzzProxy serves routes through a proxy on loopback for a fuzz target,
// with short timeouts so that an input that stalls fails in seconds, and
// returns its address and the proxy (whose pools a target may inspect).
// cfg's zero timeouts and logger are filled in. With a tlsConf, the
// listener is the HTTPS one (Server.ServeTLS).
func fuzzProxy(f *testing.F, routes map[string]map[string]string, cfg Config, tlsConf ...*tls.Config) (string, *Proxy) {
	store := routing.NewMemoryStore()
	for id, fields := range routes {
		r, err := routing.ParseRouteStrict(id, fields)
		if err != nil {
			f.Fatal(err)
		}
		if err := store.Put(r); err != nil {
			f.Fatal(err)
		}
	}
	cache, err := routing.NewCache(store, routing.CacheConfig{})
	if err != nil {
		f.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ConnectTimeout = 500 * time.Millisecond
	cfg.ResponseHeaderTimeout = 2 * time.Second
	cfg.IdleStreamTimeout = 2 * time.Second
	p, err := New(cfg, cache)
	if err != nil {
		f.Fatal(err)
	}
	srv := NewServer(ServerConfig{ClientReadTimeout: 2 * time.Second, ClientBodyTimeout: 2 * time.Second,
		ClientWriteTimeout: 2 * time.Second, DrainTimeout: time.Second}, p, nil)
	ln := listen(f, "127.0.0.1:0")
	if len(tlsConf) > 0 {
		go srv.ServeTLS(ln, tlsConf[0])
	} else {
		go srv.Serve(ln)
	}
	f.Cleanup(func() { _ = srv.Shutdown(f.Context()) })
	return ln.Addr().String(), p
}

// fuzzExchange dials addr, sends what send writes, closes its side and
// returns all the proxy answered until it closed, with the read's error;
// it fails t when the proxy neither closes nor answers within 10 s.
func fuzzExchange(t *testing.T, addr string, send func(net.Conn)) ([]byte, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	send(c)
	_ = c.(*net.TCPConn).CloseWrite()
	out, rerr := io.ReadAll(c)
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		t.Fatalf("no answer and no close within 10 s; got %q", out)
	}
	return out, rerr
}
