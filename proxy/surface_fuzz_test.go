package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/html"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// routingRoute and routingTarget are the unmasked route and the target the
// head-level fuzz targets below forward to.
var (
	routingRoute  = routing.Route{ID: "box"}
	routingTarget = func() routing.Target {
		var t routing.Target
		if err := routing.NewParser(routing.ParserConfig{}).Parse(&t, []byte("8080-box.cube.test"), nil); err != nil {
			panic(err)
		}
		return t
	}()
)

// jsonRef is what encoding/json makes of s: a JSON string decodes to s
// with each byte of invalid UTF-8 read as U+FFFD.
func jsonRef(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("json.Marshal(%q): %v", s, err)
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", b, err)
	}
	return out
}

// errorStatuses are the statuses the proxy answers itself (DESIGN.md's
// table, and the 405/413/499/505 the pipeline adds).
var errorStatuses = []int{400, 403, 404, 405, 408, 410, 413, 429, 431, 499, 500, 502, 503, 504, 505}

// FuzzWriteError checks the error answers as a client reads them
// (net/http's response parser): the status and Retry-After asked for,
// never cached; for a browser navigating (Sec-Fetch-Mode: navigate, or no
// Sec-Fetch-Mode and an Accept naming text/html) an HTML page whose only
// markup is the page's own, the message (which echoes client input: a
// bad Host, a bad id) never becoming a tag; otherwise one JSON object
// whose "error", "code" and "sandbox_id" decode to what encoding/json
// makes of them, and which, as encoding/json writes it, holds no raw '<',
// '>' or '&' that a page sniffing it as HTML would read as markup.
func FuzzWriteError(f *testing.F) {
	f.Add(0, 0, "sandbox not found", "box", "application/json", "")
	f.Add(3, 2, `bad host "<script>alert(1)</script>"`, "", "text/html,application/xhtml+xml", "")
	f.Add(12, 5, "a\x00b\xffc\u2028d", "x\xc3", "*/*", "navigate")
	f.Add(9, 1, "</p><h1>&amp;", "box", "text/html", "cors")
	f.Add(1, 0, "\\\"\t\r\n", "", "", "navigate")
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, statusIdx, retry int, msg, sandboxID, accept, fetchMode string) {
		status := errorStatuses[uint(statusIdx)%uint(len(errorStatuses))]
		retry %= 100000
		raw := "GET / HTTP/1.1\r\nHost: 8080-box.cube.test\r\nAccept: " + accept + "\r\n"
		if fetchMode != "" {
			raw += "Sec-Fetch-Mode: " + fetchMode + "\r\n"
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if ctx.Request.Header.Read(bufioReader(raw+"\r\n")) != nil {
			return
		}
		h := &ctx.Request.Header
		// A backend's answer that failed halfway leaves its headers.
		ctx.Response.Header.Set("Set-Cookie", "a=b")
		ctx.Response.Header.Set("Cache-Control", "max-age=600")
		e := proxyError{status: status, code: CodeUpstreamReset, msg: msg, retryAfter: retry}
		writeError(&ctx, e, []byte(sandboxID))

		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		if err := ctx.Response.Write(bw); err != nil {
			t.Fatalf("writing the error: %v", err)
		}
		bw.Flush()
		resp, err := http.ReadResponse(bufio.NewReader(&out), nil)
		if err != nil {
			t.Fatalf("a client cannot read the error answer: %v\n%q", err, out.String())
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the error body: %v", err)
		}
		if resp.StatusCode != status {
			t.Fatalf("status %d, want %d", resp.StatusCode, status)
		}
		if got := resp.Header.Values("Cache-Control"); !slices.Equal(got, []string{"no-store"}) {
			t.Fatalf("Cache-Control %q, want only no-store", got)
		}
		if got := resp.Header.Values("Set-Cookie"); len(got) != 0 {
			t.Fatalf("the failed backend's Set-Cookie %q reached the client", got)
		}
		wantRetry := []string(nil)
		if retry > 0 {
			wantRetry = []string{strconv.Itoa(retry)}
		}
		if got := resp.Header.Values("Retry-After"); !slices.Equal(got, wantRetry) {
			t.Fatalf("Retry-After %q, want %q", got, wantRetry)
		}
		mode, hasMode := h.Peek("Sec-Fetch-Mode"), len(h.Peek("Sec-Fetch-Mode")) > 0
		browser := hasMode && string(mode) == "navigate" || !hasMode && strings.Contains(string(h.Peek("Accept")), "text/html")
		ct := resp.Header.Get("Content-Type")
		if browser {
			if !strings.HasPrefix(ct, "text/html") {
				t.Fatalf("a navigating browser got Content-Type %q", ct)
			}
			// The page's own tags, and nothing the message or id made.
			var tags []string
			z := html.NewTokenizer(bytes.NewReader(body))
			for tt := z.Next(); tt != html.ErrorToken; tt = z.Next() {
				if tt == html.StartTagToken || tt == html.EndTagToken || tt == html.SelfClosingTagToken || tt == html.CommentToken {
					name, _ := z.TagName()
					tags = append(tags, string(name))
				}
			}
			want := []string{"html", "head", "meta", "title", "title", "head", "body", "h1", "h1", "p", "p"}
			if sandboxID != "" {
				want = append(want, "p", "code", "code", "p")
			}
			want = append(want, "p", "small", "small", "p", "body", "html")
			if !slices.Equal(tags, want) {
				t.Fatalf("the error page's markup is %q, want %q\n%s", tags, want, body)
			}
			return
		}
		if ct != "application/json" {
			t.Fatalf("Content-Type %q, want application/json", ct)
		}
		if bytes.ContainsAny(body, "<>&") {
			t.Fatalf("the JSON error holds raw markup characters: %s", body)
		}
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		if err := dec.Decode(&obj); err != nil || dec.More() {
			t.Fatalf("the error body is not one JSON object (%v): %q", err, body)
		}
		want := map[string]any{"error": jsonRef(t, msg), "code": CodeUpstreamReset}
		if sandboxID != "" {
			want["sandbox_id"] = jsonRef(t, sandboxID)
		}
		if len(obj) != len(want) {
			t.Fatalf("error body %v, want %v", obj, want)
		}
		for k, v := range want {
			if obj[k] != v {
				t.Fatalf("error body %q = %q, want %q (encoding/json)", k, obj[k], v)
			}
		}
	})
}

// generatedID is an id requestID makes: the instance's 8 hex digits, a
// dash and a 16-hex-digit sequence number.
var generatedID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{16}$`)

// FuzzRequestID checks X-Cube-Request-Id end to end, for any lines of it
// the client and the sandbox send: the id is the client's first line when
// that is 1..128 printable ASCII bytes without spaces, and a generated one
// otherwise; the sandbox gets exactly that id on one line, and so does the
// client, whatever lines the sandbox's answer carried (net/http reads both
// heads, as a Go sandbox and a Go client do).
func FuzzRequestID(f *testing.F) {
	f.Add("abc-123", "", "")
	f.Add("two words", "second", "sandbox-own")
	f.Add("", "x", "")
	f.Add(strings.Repeat("i", maxRequestIDLen+1), "", "a\tb")
	f.Add("caf\xc3\xa9", "ok", "")
	f.Add("\x7f", "", "")
	p, err := New(Config{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	line := func(v string) string {
		if v == "" {
			return ""
		}
		return HeaderRequestID + ": " + v + "\r\n"
	}
	f.Fuzz(func(t *testing.T, first, second, backend string) {
		raw := "GET / HTTP/1.1\r\nHost: 8080-box.cube.test\r\n" + HeaderRequestID + ": " + first + "\r\n" + line(second) + "\r\n"
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if ctx.Request.Header.Read(bufioReader(raw)) != nil {
			return
		}
		h := &ctx.Request.Header
		client := string(h.Peek(HeaderRequestID))
		var idBuf [maxRequestIDLen]byte
		id := string(p.requestID(h, idBuf[:0]))
		sane := len(client) > 0 && len(client) <= maxRequestIDLen
		for i := 0; i < len(client); i++ {
			sane = sane && client[i] > ' ' && client[i] < 0x7f
		}
		if sane && id != client || !sane && !generatedID.MatchString(id) {
			t.Fatalf("client's id %q (sane %v) gave id %q", client, sane, id)
		}
		if perr := p.prepareRequest(&ctx, scanHead(h), &routingRoute, &routingTarget, false); perr != nil {
			return
		}
		sent := preparedBytes(t, &ctx)
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(sent)))
		if err != nil {
			t.Fatalf("the sandbox cannot read the request: %v\n%q", err, sent)
		}
		if got := req.Header.Values(HeaderRequestID); !slices.Equal(got, []string{id}) {
			t.Fatalf("the sandbox got request ids %q, want [%q]\n%q", got, id, sent)
		}

		var resp fasthttp.Response
		if resp.Header.Read(bufioReader("HTTP/1.1 200 OK\r\n"+line(backend)+line(backend)+"Content-Length: 0\r\n\r\n")) != nil {
			return
		}
		setResponseID(&resp.Header, []byte(id))
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		if err := resp.Write(bw); err != nil {
			t.Fatalf("writing the response: %v", err)
		}
		bw.Flush()
		got, err := http.ReadResponse(bufio.NewReader(&out), nil)
		if err != nil {
			t.Fatalf("the client cannot read the response: %v\n%q", err, out.String())
		}
		if ids := got.Header.Values(HeaderRequestID); !slices.Equal(ids, []string{id}) {
			t.Fatalf("the client got request ids %q, want [%q]\n%q", ids, id, out.String())
		}
	})
}

// FuzzUpgradeRequest checks how the proxy reads a request's wish to switch
// protocols against RFC 9110 §7.8 read plainly: it is an upgrade request
// when it has an Upgrade field and "upgrade" is an option of Connection
// (any line, any case, comma lists with blanks around items); the tunnel
// takes it when it is HTTP/1.1 and offers some protocol but h2c. What the
// sandbox then gets (net/http reads it, as a Go sandbox would): for a
// tunnelled upgrade one Connection line, "Upgrade", and the client's
// Upgrade; for anything else no Upgrade and no Connection at all.
func FuzzUpgradeRequest(f *testing.F) {
	for _, s := range [][4]string{
		{"HTTP/1.1", "Upgrade", "websocket", ""},
		{"HTTP/1.1", "keep-alive, Upgrade", "websocket", ""},
		{"HTTP/1.1", "close", "websocket", "upgrade"},
		{"HTTP/1.1", "Upgrade", "h2c", ""},
		{"HTTP/1.1", "Upgrade", "h2c, websocket", ""},
		{"HTTP/1.0", "Upgrade", "websocket", ""},
		{"HTTP/1.1", "Upgradex", "websocket", ""},
		{"HTTP/1.1", " , upgrade ,", " , ", ""},
		{"HTTP/1.1", "Upgrade", "", "websocket"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	p, err := New(Config{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	// items splits lines as RFC 9110 §5.6.1 lists, TrimSpace as nextToken
	// (it also drops Unicode spaces, which only ever makes a token match
	// more; see FuzzSwitchedAsAsked).
	items := func(lines [][]byte) []string {
		var out []string
		for _, l := range lines {
			for it := range strings.SplitSeq(string(l), ",") {
				if it = strings.TrimSpace(it); it != "" {
					out = append(out, strings.ToLower(it))
				}
			}
		}
		return out
	}
	f.Fuzz(func(t *testing.T, proto, conn, upgrade, conn2 string) {
		raw := "GET / " + proto + "\r\nHost: 8080-box.cube.test\r\nConnection: " + conn + "\r\nUpgrade: " + upgrade + "\r\n"
		if conn2 != "" {
			raw += "Connection: " + conn2 + "\r\n"
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if ctx.Request.Header.Read(bufioReader(raw+"\r\n")) != nil {
			return
		}
		h := &ctx.Request.Header
		if tooManyConnectionOptions(h.PeekAll("Connection")) {
			return // serve answers 400 first
		}
		asked := len(h.Peek("Upgrade")) > 0 && slices.Contains(items(h.PeekAll("Connection")), "upgrade")
		if got := upgradeRequested(h); got != asked {
			t.Fatalf("Connection %q, Upgrade %q: upgradeRequested = %v, want %v", h.PeekAll("Connection"), h.Peek("Upgrade"), got, asked)
		}
		offered := slices.DeleteFunc(items(h.PeekAll("Upgrade")), func(p string) bool { return p == "h2c" })
		takes := string(h.Protocol()) == "HTTP/1.1" && len(offered) > 0
		if !asked {
			takes = false
		} else if got := switchable(h); got != takes {
			t.Fatalf("%s, Upgrade %q: switchable = %v, want %v", h.Protocol(), h.PeekAll("Upgrade"), got, takes)
		}
		clientUpgrade := string(h.Peek("Upgrade"))
		if perr := p.prepareRequest(&ctx, scanHead(h), &routingRoute, &routingTarget, takes); perr != nil {
			return
		}
		sent := preparedBytes(t, &ctx)
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(sent)))
		if err != nil {
			t.Fatalf("the sandbox cannot read the request: %v\n%q", err, sent)
		}
		gotConn, gotUp := req.Header.Values("Connection"), req.Header.Values("Upgrade")
		if takes {
			if !slices.Equal(gotConn, []string{"Upgrade"}) || !slices.Equal(gotUp, []string{clientUpgrade}) {
				t.Fatalf("a tunnelled upgrade reached the sandbox with Connection %q, Upgrade %q (client's Upgrade %q)\n%q", gotConn, gotUp, clientUpgrade, sent)
			}
			return
		}
		if len(gotConn) != 0 || len(gotUp) != 0 {
			t.Fatalf("a plain request reached the sandbox with Connection %q, Upgrade %q\n%q", gotConn, gotUp, sent)
		}
	})
}

// FuzzMaskedHost checks the Host a masked route sends, for any
// MaskRequestHost the route decoder accepts and any port and client Host:
// the sandbox (fasthttp reading the head sent) gets one Host line, the
// template with every ${PORT} replaced by the container port (as
// strings.ReplaceAll does), and the client's Host in one X-Forwarded-Host
// line; on envd's port 49983, or when the route has no template (an empty
// MaskRequestHost is none), it gets the client's Host unmasked and the
// client's own X-Forwarded-Host lines as they were (an empty one too).
func FuzzMaskedHost(f *testing.F) {
	f.Add("localhost:${PORT}", uint16(50005), "")
	f.Add("${PORT}-box.internal:${PORT}", uint16(8080), "spoofed.example")
	f.Add("${PORT", uint16(1), "")
	f.Add("$${PORT}}", uint16(65535), "")
	f.Add("localhost:${PORT}", uint16(envdPort), "a.example")
	f.Add("h:${port}", uint16(80), "")
	p, err := New(Config{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, tmpl string, port uint16, clientXFH string) {
		if port == 0 {
			return
		}
		r, err := routing.ParseRoute("box", map[string]string{routing.FieldHostIP: "10.0.0.1", routing.FieldMaskRequestHost: tmpl})
		if err != nil {
			return
		}
		host := strconv.Itoa(int(port)) + "-box.cube.test"
		raw := "GET / HTTP/1.1\r\nHost: " + host + "\r\n"
		if clientXFH != "" {
			raw += "X-Forwarded-Host: " + clientXFH + "\r\n"
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, addr, nil)
		if ctx.Request.Header.Read(bufioReader(raw+"\r\n")) != nil {
			return
		}
		h := &ctx.Request.Header
		// The client's own lines, an empty one included: an unmasked
		// request passes them as it passes any end-to-end header. Their
		// values as a reader gets them: fasthttp joins an obs-fold line
		// with a space ("00\n " is "00 "), which the sandbox's reader
		// trims as whitespace around a value (RFC 9110 5.5).
		var clientLines []string
		for _, v := range h.PeekAll("X-Forwarded-Host") {
			clientLines = append(clientLines, strings.Trim(string(v), " \t"))
		}
		var tgt routing.Target
		if err := routing.NewParser(routing.ParserConfig{}).Parse(&tgt, h.Host(), h); err != nil {
			t.Fatalf("the target host %q does not parse: %v", host, err)
		}
		if perr := p.prepareRequest(&ctx, scanHead(h), r, &tgt, false); perr != nil {
			t.Fatalf("prepareRequest: %v", perr.msg)
		}
		sent := preparedBytes(t, &ctx)
		var got fasthttp.RequestHeader
		if err := got.Read(bufio.NewReader(bytes.NewReader(sent))); err != nil {
			t.Fatalf("the sandbox cannot read the request: %v\n%q", err, sent)
		}
		lines := map[string][]string{}
		for k, v := range got.All() {
			lines[strings.ToLower(string(k))] = append(lines[strings.ToLower(string(k))], string(v))
		}
		wantHost, wantXFH := strings.ReplaceAll(r.MaskRequestHost, "${PORT}", strconv.Itoa(int(port))), []string{host}
		if r.MaskRequestHost == "" || port == envdPort {
			wantHost, wantXFH = host, clientLines
		}
		if !slices.Equal(lines["host"], []string{wantHost}) || string(got.Host()) != wantHost {
			t.Fatalf("template %q port %d: the sandbox got Host %q, want %q\n%q", tmpl, port, lines["host"], wantHost, sent)
		}
		if !slices.Equal(lines["x-forwarded-host"], wantXFH) {
			t.Fatalf("template %q port %d: the sandbox got X-Forwarded-Host %q, want %q\n%q", tmpl, port, lines["x-forwarded-host"], wantXFH, sent)
		}
	})
}

// preparedBytes is the request prepareRequest left in ctx, as the bytes
// the sandbox would read.
func preparedBytes(t *testing.T, ctx *fasthttp.RequestCtx) []byte {
	t.Helper()
	var sent bytes.Buffer
	bw := bufio.NewWriter(&sent)
	if err := ctx.Request.Write(bw); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	bw.Flush()
	return sent.Bytes()
}
