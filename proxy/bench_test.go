package proxy

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// BenchmarkHeaderRewrite measures turning a client request into the
// backend's: hop-by-hop removal, credential stripping, forwarding headers,
// Host masking.
func BenchmarkHeaderRewrite(b *testing.B) {
	p, err := New(Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	var t routing.Target
	parser := routing.NewParser(routing.ParserConfig{})
	if err := parser.Parse(&t, []byte("50005-box.cube.test"), nil); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		mask string
		raw  string
	}{
		// What the bench's http scenario sends, and most requests look like:
		// nothing to remove or join.
		{"small GET", "", "GET /x HTTP/1.1\r\nHost: 50005-box.cube.test\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"},
		// Everything prepareRequest rewrites, on a masked route.
		{"MCP with hops and credentials", "localhost:${PORT}",
			"GET /mcp?x=1 HTTP/1.1\r\nHost: 50005-box.cube.test\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n" +
				"Authorization: Bearer abc\r\nE2b-Traffic-Access-Token: 0123\r\nX-Forwarded-For: 203.0.113.7\r\n" +
				"Accept: text/event-stream\r\nMcp-Session-Id: s1\r\nCookie: a=1; cube_proxy_auth=t; b=2\r\n\r\n"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := &routing.Route{ID: "box", MaskRequestHost: bc.mask}
			var ctx fasthttp.RequestCtx
			ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Request.Reset()
				if err := ctx.Request.Read(bufioReader(bc.raw)); err != nil {
					b.Fatal(err)
				}
				if perr := p.prepareRequest(&ctx, scanHead(&ctx.Request.Header), r, &t, false); perr != nil {
					b.Fatal(perr.msg)
				}
			}
		})
	}
}

// bufioReader returns a reader over s that is reused across iterations.
func bufioReader(s string) *bufio.Reader {
	benchReader.src.Reset(s)
	benchReader.br.Reset(&benchReader.src)
	return benchReader.br
}

var benchReader = struct {
	src strings.Reader
	br  *bufio.Reader
}{br: bufio.NewReader(nil)}

// BenchmarkResponseHops measures hop-by-hop removal on a typical backend
// answer, which carries no hop-by-hop header.
func BenchmarkResponseHops(b *testing.B) {
	var resp fasthttp.ResponseHeader
	raw := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\nDate: Mon, 30 Nov 2026 09:00:00 GMT\r\nX-Request-Id: abc\r\n\r\n"
	if err := resp.Read(bufioReader(raw)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		removeHopResponse(&resp, false)
	}
}
