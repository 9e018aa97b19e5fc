package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// seenReq is what the sandbox received of one request, byte for byte where
// bytes matter.
type seenReq struct {
	tag      string
	Line     string `json:"line"`
	Headers  []hdr  `json:"headers"`
	Framing  string `json:"framing"` // "cl:N", "chunked", "none"
	Body     []byte `json:"body,omitempty"`
	Trailers []hdr  `json:"trailers,omitempty"`
	Err      string `json:"err,omitempty"`
}

// sandbox is a raw TCP echo server: it records every request it reads and
// answers with the variant its X-Lab-Answer header names.
type sandbox struct {
	ln   net.Listener
	port int

	mu   sync.Mutex
	reqs map[string][]seenReq // by X-Lab-Case
}

func startSandbox() (*sandbox, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sandbox{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	s.reqs = map[string][]seenReq{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s, nil
}

// end returns the requests tagged tag (or untagged ones, which no case can
// claim for sure), waiting up to wait for a first one when none came yet.
func (s *sandbox) end(tag string, wait time.Duration) []seenReq {
	deadline := time.Now().Add(wait)
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		out := append([]seenReq(nil), s.reqs[tag]...)
		if len(out) > 0 || !time.Now().Before(deadline) {
			return append(out, s.reqs[""]...)
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		s.mu.Lock()
	}
}

func (s *sandbox) record(r seenReq) {
	s.mu.Lock()
	s.reqs[r.tag] = append(s.reqs[r.tag], r)
	s.mu.Unlock()
}

func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return line, err
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}

// readHeaders reads header lines up to the empty line. An obs-fold line
// (starting with a space or tab) is kept as a line of its own, so that it
// shows.
func readHeaders(br *bufio.Reader) ([]hdr, error) {
	var hs []hdr
	for {
		line, err := readLine(br)
		if err != nil {
			return hs, err
		}
		if line == "" {
			return hs, nil
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			hs = append(hs, hdr{"(no colon)", line})
			continue
		}
		hs = append(hs, hdr{name, strings.Trim(value, " \t")})
	}
}

// readChunked decodes a chunked body, returning the data and the trailer.
func readChunked(br *bufio.Reader) ([]byte, []hdr, error) {
	var body []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return body, nil, fmt.Errorf("chunk size line: %w", err)
		}
		sz, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(sz), 16, 64)
		if err != nil || n < 0 {
			return body, nil, fmt.Errorf("chunk size %q", line)
		}
		if n == 0 {
			tr, err := readHeaders(br)
			return body, tr, err
		}
		chunk := make([]byte, n)
		if _, err := io.ReadFull(br, chunk); err != nil {
			return append(body, chunk...), nil, fmt.Errorf("chunk data: %w", err)
		}
		body = append(body, chunk...)
		if l, err := readLine(br); err != nil || l != "" {
			return body, nil, fmt.Errorf("chunk end %q %v", l, err)
		}
	}
}

func (s *sandbox) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	closing := false
	for {
		c.SetReadDeadline(time.Time{})
		line, err := readLine(br)
		if err != nil {
			return
		}
		if line == "" {
			continue // a stray CRLF between requests
		}
		var r seenReq
		r.Line = line
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		r.Headers, err = readHeaders(br)
		if v := getAll(r.Headers, "X-Lab-Case"); len(v) > 0 {
			r.tag = v[0]
		}
		if err != nil {
			r.Err = "head: " + err.Error()
			s.record(r)
			return
		}
		if v := getAll(r.Headers, "X-Lab-Answer"); len(v) > 0 && v[0] == "early-413" {
			// Refused from its head alone, the body unread, and the
			// connection closed, as a server with a body limit does.
			r.Framing = "unread"
			s.record(r)
			io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nX-Lab: sandbox\r\nConnection: close\r\nContent-Length: 9\r\n\r\ntoo large")
			return
		}
		switch cl := getAll(r.Headers, "Content-Length"); {
		case hasToken(r.Headers, "Transfer-Encoding", "chunked"):
			r.Framing = "chunked"
			r.Body, r.Trailers, err = readChunked(br)
		case len(cl) > 0:
			r.Framing = "cl:" + strings.Join(cl, ",")
			n, perr := strconv.Atoi(cl[0])
			if perr != nil {
				err = perr
				break
			}
			r.Body = make([]byte, n)
			var got int
			got, err = io.ReadFull(br, r.Body)
			r.Body = r.Body[:got]
		default:
			r.Framing = "none"
		}
		if err != nil {
			r.Err = "body: " + err.Error()
			s.record(r)
			return
		}
		s.record(r)
		method, _, _ := strings.Cut(r.Line, " ")
		answer := ""
		if v := getAll(r.Headers, "X-Lab-Answer"); len(v) > 0 {
			answer = v[0]
		}
		if closing {
			// The last answer said the connection ends: a proxy that
			// sends another request on it gets this marked answer.
			answer = "reused-after-close"
		}
		if !s.answer(c, method, answer) {
			return
		}
		closing = answer == "sized-close-open" || answer == "http10-sized" || answer == "http10-coded-keepalive"
		if answer == "stray-later" {
			strayWhenIdle(c, br)
		}
	}
}

// strayWhenIdle writes a 408, as a server timing out a kept-alive connection
// does, once c has been idle 50 ms with no next request, and leaves the
// connection open. Only on an idle connection: a request that came first (of
// another case, on a pooled connection) gets its own answer.
func strayWhenIdle(c net.Conn, br *bufio.Reader) {
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := br.Peek(1)
	c.SetReadDeadline(time.Time{})
	if err != nil && isTimeout(err) {
		io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 0\r\n\r\n")
	}
}

const plainBody = "hello from the sandbox\n"

// jsonBody is a JSON answer long enough for gzip (nginx's gzip_min_length is 20).
var jsonBody = `{"items":[` + strings.Repeat(`{"name":"item","value":12345},`, 20) + `{}]}`

// answer writes the variant named by the request's X-Lab-Answer; false when
// the connection must close after it.
func (s *sandbox) answer(c net.Conn, method, variant string) bool {
	head := method == "HEAD"
	sized := func(status, extra, body string) string {
		b := body
		if head {
			b = ""
		}
		return fmt.Sprintf("HTTP/1.1 %s\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n%s", status, len(body), extra, b)
	}
	w := func(s string) bool { _, err := io.WriteString(c, s); return err == nil }
	switch variant {
	case "", "plain":
		return w(sized("200 OK", "", plainBody))
	case "close": // no length: the body ends with the connection
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + plainBody)
		return false
	case "http10": // an HTTP/1.0 answer without a length
		w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\n\r\n" + plainBody)
		return false
	case "chunked":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n" +
			"6;ext=1\r\nhello \r\n11\r\nfrom the sandbox\n\r\n0\r\nX-Checksum: abc\r\n\r\n")
	case "204":
		return w("HTTP/1.1 204 No Content\r\nX-Lab: sandbox\r\n\r\n")
	case "204body": // a body where none may be: the connection cannot be reused
		w("HTTP/1.1 204 No Content\r\nX-Lab: sandbox\r\nContent-Length: 5\r\n\r\nhello")
		return false
	case "304body":
		w("HTTP/1.1 304 Not Modified\r\nX-Lab: sandbox\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\nhello")
		return false
	case "103":
		return w("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + sized("200 OK", "Link: </a.css>; rel=preload\r\n", plainBody))
	case "100": // an unsolicited 100 Continue before the answer
		return w("HTTP/1.1 100 Continue\r\n\r\n" + sized("200 OK", "", plainBody))
	case "cookies":
		return w(sized("200 OK", "Set-Cookie: a=1; Path=/\r\nSet-Cookie: b=2; HttpOnly\r\nSet-Cookie: c=3; Expires=Wed, 21 Oct 2037 07:28:00 GMT\r\n", plainBody))
	case "location":
		return w(sized("302 Found", fmt.Sprintf("Location: http://127.0.0.1:%d/next?x=1\r\n", s.port), plainBody))
	case "location-host":
		return w(sized("301 Moved Permanently", fmt.Sprintf("Location: http://%d-lab.cube.test/next\r\n", s.port), plainBody))
	case "dupcl-same":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello")
	case "dupcl-diff":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")
		return false
	case "cl-and-te":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		return false
	case "gzip-plain": // compressible text, not compressed by the sandbox
		return w(sized("200 OK", "", strings.Repeat("compressible text\n", 100)))
	case "gzipped": // compressed by the sandbox itself
		var b bytes.Buffer
		z := gzip.NewWriter(&b)
		z.Write([]byte(plainBody))
		z.Close()
		return w(sized("200 OK", "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n", b.String()))
	case "hopbyhop":
		return w(sized("200 OK", "Connection: X-Private\r\nX-Private: secret\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nUpgrade: foo\r\nTE: trailers\r\nX-End: kept\r\n", plainBody))
	case "status-custom":
		return w("HTTP/1.1 299 Custom Reason\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "status-noreason":
		return w("HTTP/1.1 200\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "status-404":
		return w(sized("404 Not Found", "", "app's own 404\n"))
	case "status-500":
		return w(sized("500 Internal Server Error", "", "app's own 500\n"))
	case "status-502":
		return w(sized("502 Bad Gateway", "", "app's own 502\n"))
	case "space-name":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "obs-fold":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "bare-lf":
		return w("HTTP/1.1 200 OK\nX-Lab: sandbox\nContent-Length: 2\n\nok")
	case "empty-value":
		return w(sized("200 OK", "X-Empty:\r\nX-Dup: 1\r\nX-Dup: 2\r\n", plainBody))
	case "big-header": // over the platform's 16k proxy_buffer_size
		w(sized("200 OK", "X-Big: "+strings.Repeat("b", 20000)+"\r\n", plainBody))
		return false
	case "upgrade-101-unasked":
		w("HTTP/1.1 101 Switching Protocols\r\nX-Lab: sandbox\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		return false
	case "server-date":
		return w(sized("200 OK", "Server: sandbox/1.0\r\nDate: Tue, 01 Jan 2030 00:00:00 GMT\r\n", plainBody))
	case "sse":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nContent-Length: 13\r\n\r\ndata: hello\n\n")
	case "cl-short": // declares more than it sends, then closes
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 100\r\n\r\nhello")
		return false
	case "sized-close": // sized, then the sandbox closes its connection
		w(sized("200 OK", "Connection: close\r\n", plainBody))
		return false
	case "http10-keepalive":
		return w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
	case "head-chunked": // a HEAD answer that announces a chunked body it does not send
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n")
	case "x-accel": // nginx reads X-Accel-* from its upstreams
		return w(sized("200 OK", "X-Accel-Buffering: no\r\nX-Accel-Expires: 0\r\n", plainBody))
	case "large-sized":
		return w(sized("200 OK", "", strings.Repeat("0123456789abcdef", 20000)))
	case "large-chunked":
		var b strings.Builder
		b.WriteString("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < 40; i++ {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", 5000, strings.Repeat(string(rune('a'+i%26)), 5000))
		}
		b.WriteString("0\r\n\r\n")
		return w(b.String())
	case "401":
		return w(sized("401 Unauthorized", "WWW-Authenticate: Bearer realm=\"mcp\", error=\"invalid_token\"\r\nWWW-Authenticate: Basic realm=\"x\"\r\n", "no\n"))
	case "no-ctype":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "ws-accept": // accepts a WebSocket upgrade, sends one text frame, closes
		w("HTTP/1.1 101 Switching Protocols\r\nX-Lab: sandbox\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x81\x02hi")
		return false
	case "sse-stream": // an event stream of unknown length that ends
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"d\r\ndata: hello\n\n\r\n0\r\n\r\n")
	case "close-early": // closes without answering
		return false
	case "head-with-body": // a HEAD answered with the body a GET would get
		w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(plainBody), plainBody))
		return false
	case "304-cl": // a 304 with the representation's length and no body (RFC 9110 8.6)
		return w("HTTP/1.1 304 Not Modified\r\nX-Lab: sandbox\r\nETag: \"v1\"\r\nContent-Length: 1234\r\n\r\n")
	case "204-cl0":
		return w("HTTP/1.1 204 No Content\r\nX-Lab: sandbox\r\nContent-Length: 0\r\n\r\n")
	case "204-chunked": // announces a chunked body a 204 cannot have, sends none
		return w("HTTP/1.1 204 No Content\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n")
	case "205":
		return w("HTTP/1.1 205 Reset Content\r\nX-Lab: sandbox\r\nContent-Length: 0\r\n\r\n")
	case "102":
		return w("HTTP/1.1 102 Processing\r\n\r\n" + sized("200 OK", "", plainBody))
	case "te-identity": // a coding other than chunked last: the body ends with the connection (RFC 9112 6.3)
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nTransfer-Encoding: identity\r\n\r\n" + plainBody)
		return false
	case "te-gzip": // gzip as a transfer coding, no chunked: ends with the connection
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip\r\n\r\n" + gzipped(plainBody))
		return false
	case "te-gzip-chunked":
		g := gzipped(plainBody)
		return w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(g), g))
	case "te-chunked-upper":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	case "chunked-cut": // one chunk, then the sandbox closes mid-body
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		return false
	case "large-cut": // a sized body over 64 KiB (streamed) cut half-way
		w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", 200000, strings.Repeat("x", 100000)))
		return false
	case "cl-long": // more bytes than Content-Length says, then close
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 5\r\n\r\nhello world")
		return false
	case "cl-leading-zero":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 0005\r\n\r\nhello")
	case "cl-plus":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: +5\r\n\r\nhello")
		return false
	case "chunked-close": // chunked, Connection: close, then the sandbox closes
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		return false
	case "conn-names-cl": // Connection naming the framing field
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello")
		return false
	case "conn-names-ctype":
		return w(sized("200 OK", "Connection: Content-Type, Set-Cookie\r\nSet-Cookie: s=1\r\n", plainBody))
	case "many-cookies":
		return w(sized("200 OK", setCookies(100), plainBody))
	case "status-600":
		w("HTTP/1.1 600 Beyond\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "status-lower-proto":
		w("http/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "http10-chunked": // an HTTP/1.0 answer that says chunked
		w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		return false
	case "ctype-dup": // two Content-Type lines in an answer
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok")
	case "100-then-close": // an interim 100 and no final answer
		w("HTTP/1.1 100 Continue\r\n\r\n")
		return false
	case "cookie-domain": // cookies for the client's host, a parent domain and another site
		return w(sized("200 OK", "Set-Cookie: a=1; Domain=other.example; Path=/\r\nSet-Cookie: b=2; Path=/\r\nSet-Cookie: c=3; Domain=cube.test\r\n", plainBody))
	case "chunk-ext-size": // chunk sizes with leading zeros and an extension with a quoted string
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n005;a=\"x;y\"\r\nhello\r\n00\r\n\r\n")
	case "www-many-vary":
		return w(sized("200 OK", "Vary: Origin\r\nVary: Accept-Encoding\r\nCache-Control: no-cache\r\nCache-Control: private\r\nLink: <a>; rel=x\r\nLink: <b>; rel=y\r\n", plainBody))
	// Stray bytes on a connection the sandbox keeps open: neither proxy may
	// read them as the answer to the next request it sends on it.
	case "cl-long-keep": // more bytes than Content-Length says, connection kept
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 5\r\n\r\nstray")
	case "chunked-extra-keep": // a second answer after the chunked body's end
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 5\r\n\r\nstray")
	case "sse-extra-keep": // an event stream's end, then stray bytes
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"d\r\ndata: hello\n\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 5\r\n\r\nstray")
	case "body-keep": // a body a HEAD, 204 or 304 answer cannot have, connection kept
		st := "200 OK"
		if method != "HEAD" {
			st = "204 No Content"
		}
		return w("HTTP/1.1 " + st + "\r\nX-Lab: sandbox\r\nContent-Length: 5\r\n\r\nhello")
	case "304body-keep":
		return w("HTTP/1.1 304 Not Modified\r\nX-Lab: sandbox\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\nhello")
	case "stray-later": // answered; serve sends a 408 once the connection idles
		return w(sized("200 OK", "", plainBody))
	case "close-noconn": // no length and no Connection: close: the body ends with the connection
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\n\r\n" + plainBody)
		return false
	case "http10-sized": // HTTP/1.0, sized, no keep-alive, and the connection kept anyway
		return w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "http10-coded-keepalive": // HTTP/1.0, a coding beside a Content-Length (faulty framing), keep-alive claimed, and the connection kept
		return w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nConnection: keep-alive\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\nok")
	case "large-cl-long-keep": // a streamed sized body, then a stray answer, connection kept
		return w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%sHTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 5\r\n\r\nstray", 100000, strings.Repeat("x", 100000)))
	case "large-chunked-extra-keep":
		var b strings.Builder
		b.WriteString("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < 20; i++ {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", 5000, strings.Repeat("y", 5000))
		}
		b.WriteString("0\r\n\r\nHTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nX-Stray: 1\r\nContent-Length: 5\r\n\r\nstray")
		return w(b.String())
	case "bodiless-chunk-end-keep": // a HEAD, 204 or 304 answer that says chunked and sends the last chunk anyway
		st := "200 OK"
		switch {
		case method == "HEAD":
		case strings.HasPrefix(method, "P"):
			st = "304 Not Modified"
		default:
			st = "204 No Content"
		}
		return w("HTTP/1.1 " + st + "\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	case "head-chunked-body-keep": // a HEAD answered with a whole chunked body
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	case "many-headers":
		var b strings.Builder
		for i := 0; i < 500; i++ {
			fmt.Fprintf(&b, "X-H%03d: v%d\r\n", i, i)
		}
		return w(sized("200 OK", b.String(), plainBody))
	case "utf8-value": // UTF-8 and Latin-1 bytes in values, as Content-Disposition filenames come
		return w(sized("200 OK", "Content-Disposition: attachment; filename=\"caf\xc3\xa9.txt\"\r\nX-Latin: caf\xe9\r\n", plainBody))
	case "ctl-value":
		w(sized("200 OK", "X-Ctl: a\x01b\r\n", plainBody))
		return false
	case "del-value":
		w(sized("200 OK", "X-Del: a\x7fb\r\n", plainBody))
		return false
	case "tchar-name": // every token character RFC 9110 allows in a field name
		return w(sized("200 OK", "X-Odd!#$%&'*+.^_`|~: 1\r\n", plainBody))
	case "dot-name":
		return w(sized("200 OK", "X.Dotted: 1\r\n", plainBody))
	case "at-name": // an @, which is no token character
		w(sized("200 OK", "X-At@: 2\r\n", plainBody))
		return false
	case "empty-name":
		w(sized("200 OK", ": nameless\r\n", plainBody))
		return false
	case "big-trailer":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T1: " + strings.Repeat("t", 10000) + "\r\nX-T2: 2\r\n\r\n")
	case "long-chunk-ext":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5;x=" + strings.Repeat("e", 5000) + "\r\nhello\r\n0\r\n\r\n")
	case "status-spaces":
		w("HTTP/1.1  200 OK\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "status-2digit":
		w("HTTP/1.1 20 OK\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "status-http10-101-like": // HTTP/1.0 200 with a reason of many words
		return w("HTTP/1.0 200 Very Fine Indeed\r\nX-Lab: sandbox\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
	case "big-cl-no-body": // a HEAD's or 304's length of a large representation, no body
		st := "200 OK"
		if method != "HEAD" {
			st = "304 Not Modified"
		}
		return w("HTTP/1.1 " + st + "\r\nX-Lab: sandbox\r\nContent-Type: application/octet-stream\r\nContent-Length: 200000\r\n\r\n")
	case "sse-empty": // an event stream with no events, sized
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n")
	case "sse-head": // a HEAD's answer announcing an event stream
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
	case "sse-close-delimited": // an event stream ended by the sandbox's close, no framing
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\ndata: one\n\ndata: two\n\n")
		return false
	case "sse-http10": // an HTTP/1.0 event stream (Python's http.server), ended by close
		w("HTTP/1.0 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\n\r\ndata: one\n\n")
		return false
	case "sse-204": // no stream after all
		return w("HTTP/1.1 204 No Content\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\n\r\n")
	case "te-twice": // chunked named on two lines
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	case "te-chunked-chunked":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	case "te-empty-cl": // an empty Transfer-Encoding beside a length
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding:\r\nContent-Length: 5\r\n\r\nhello")
	case "te-space-chunked": // spaces around the coding
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding:   chunked  \r\n\r\n5\r\nhello\r\n0\r\n\r\n")
	case "cl-space": // spaces around the length
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length:   5  \r\n\r\nhello")
	case "cl-list": // one length twice in a list (RFC 9110 8.6 lets a recipient take it)
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 5, 5\r\n\r\nhello")
		return false
	case "reason-utf8":
		return w("HTTP/1.1 200 D\xc3\xa9j\xc3\xa0 vu\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "reason-empty": // a space after the code and no reason
		return w("HTTP/1.1 201 \r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "reason-long":
		return w("HTTP/1.1 200 " + strings.Repeat("r", 8000) + "\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
	case "many-103": // nine interim answers before the final one
		return w(strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", 9) + sized("200 OK", "", plainBody))
	case "sized-close-open": // says Connection: close and keeps the connection open
		return w(sized("200 OK", "Connection: close\r\n", plainBody))
	case "reused-after-close":
		return w(sized("200 OK", "X-Reused: after close\r\n", plainBody))
	case "bodiless-cl-te": // a HEAD's or 304's head with both framings, no body
		st := "200 OK"
		if method != "HEAD" {
			st = "304 Not Modified"
		}
		return w("HTTP/1.1 " + st + "\r\nX-Lab: sandbox\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
	case "cl-huge": // a length no 64-bit integer holds
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: 99999999999999999999\r\n\r\nhello")
		return false
	case "cl-negative":
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Length: -1\r\n\r\nhello")
		return false
	case "chunk-overflow": // a chunk size no 64-bit integer holds
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nhello\r\n0\r\n\r\n")
		return false
	case "chunk-upper-hex":
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\nA\r\nhellohello\r\n0\r\n\r\n")
	case "cookie-own-domain": // Domain naming the client's host, as written three ways
		return w(sized("200 OK", fmt.Sprintf("Set-Cookie: a=1; Domain=%d-lab.cube.test; Path=/\r\nSet-Cookie: b=2; Domain=.%d-lab.cube.test\r\nSet-Cookie: c=3; domain=%d-LAB.Cube.Test; Secure\r\n", s.port, s.port, s.port), plainBody))
	case "x-accel-redirect": // nginx's internal redirect, which nginx follows
		return w(sized("200 OK", "X-Accel-Redirect: /redirected\r\n", plainBody))
	case "header-15k": // a head just under the platform's 16k proxy_buffer_size
		return w(sized("200 OK", "X-Big: "+strings.Repeat("b", 15*1024)+"\r\n", plainBody))
	case "cookies-15k": // as many cookie lines as fit under 16k
		var b strings.Builder
		for i := 0; b.Len() < 15*1024; i++ {
			fmt.Fprintf(&b, "Set-Cookie: session_part_%03d=%s; Path=/; HttpOnly\r\n", i, strings.Repeat("v", 60))
		}
		return w(sized("200 OK", b.String(), plainBody))
	case "sse-sized-large": // an event stream with a length, over 64 KiB
		ev := strings.Repeat("data: "+strings.Repeat("e", 994)+"\n\n", 100)
		return w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(ev), ev))
	case "407": // a proxy's challenge, from a proxy the sandbox runs
		return w(sized("407 Proxy Authentication Required", "Proxy-Authenticate: Basic realm=\"p\"\r\n", "auth\n"))
	case "chunk-size-bws": // whitespace after a chunk size, with and without an extension
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n5\t;a=b\r\nworld\r\n0 \r\n\r\n")
	case "chunk-lf-only": // chunk lines ended by a bare LF (a hand-written server)
		w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n")
		return false
	case "status-199":
		return w("HTTP/1.1 199 Odd\r\nX-Lab: sandbox\r\n\r\n" + sized("200 OK", "", plainBody))
	case "status-999":
		w("HTTP/1.1 999 Odd\r\nX-Lab: sandbox\r\nContent-Length: 2\r\n\r\nok")
		return false
	case "location-relative":
		return w(sized("302 Found", "Location: /next?x=1\r\n", plainBody))
	case "location-scheme-relative":
		return w(sized("302 Found", "Location: //other.example/next\r\n", plainBody))
	case "cookies-200":
		return w(sized("200 OK", setCookies(200), plainBody))
	case "header-60k":
		w(sized("200 OK", "X-Big: "+strings.Repeat("b", 60*1024)+"\r\n", plainBody))
		return false
	case "no-value": // a field with no value and no space after its colon, and one with only spaces
		return w(sized("200 OK", "X-None:\r\nX-Spaces:   \r\n", plainBody))
	case "etag": // a validator: the sandbox does not evaluate conditions itself
		return w(sized("200 OK", "ETag: \"v1\"\r\nLast-Modified: Tue, 01 Jan 2030 00:00:00 GMT\r\nAccept-Ranges: bytes\r\nVary: Accept-Encoding\r\n", plainBody))
	case "json":
		return w(fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(jsonBody), jsonBody))
	case "206": // the sandbox's own range answer
		return w("HTTP/1.1 206 Partial Content\r\nX-Lab: sandbox\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-4/23\r\nContent-Length: 5\r\n\r\nhello")
	case "sse-gzip-stream": // an event stream of unknown length, compressible
		return w("HTTP/1.1 200 OK\r\nX-Lab: sandbox\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"d\r\ndata: hello\n\n\r\n0\r\n\r\n")
	}
	return w(sized("500 Internal Server Error", "", "unknown X-Lab-Answer "+variant+"\n"))
}

func gzipped(s string) string {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	z.Write([]byte(s))
	z.Close()
	return b.String()
}

// setCookies is n Set-Cookie lines, each a cookie of its own.
func setCookies(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "Set-Cookie: c%03d=%d; Path=/\r\n", i, i)
	}
	return b.String()
}
