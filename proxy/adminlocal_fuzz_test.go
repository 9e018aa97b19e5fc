package proxy

import (
	"bufio"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// localHostRef is localHost as its doc comment reads, over the Host
// net/http reads: a name no DNS answer can redirect (an IP literal,
// localhost or a *.localhost name, any case, a root dot aside).
func localHostRef(host string) bool {
	name := (&url.URL{Host: host}).Hostname()
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

// FuzzAdminLocalClient sends a write (a cache delete) to the tokenless
// admin API from loopback with any head, and holds the guard against web
// pages in a browser on the host (localClient: CSRF, DNS rebinding) to the
// head as net/http reads it, where both parsers take it: the write is
// served when no Origin line has a value and Host names this host in a way
// no DNS answer can redirect, and refused 403 otherwise.
func FuzzAdminLocalClient(f *testing.F) {
	for _, s := range []string{
		"Host: 127.0.0.1:8082\r\n",
		"Host: localhost\r\n",
		"Host: [::1]:8082\r\n",
		"Host: app.LOCALHOST.\r\n",
		"Host: evil.test\r\n",
		"Host: 127.0.0.1.nip.io\r\n",
		"Host: localhost.evil.test\r\n",
		"Host: 127.0.0.1\r\nOrigin: http://evil.test\r\n",
		"Host: 127.0.0.1\r\nOrigin:\r\nOrigin: http://evil.test\r\n",
		"Host: 127.0.0.1\r\norigin: null\r\n",
		"Host: 127.0.0.1\r\nOrigin: \t\r\n",
		"Host: [fe80::1%25eth0]:1\r\n",
		"Host: 0x7f.1\r\n",
	} {
		f.Add(s)
	}
	p, _ := bareProxy(f)
	a := NewAdmin(AdminConfig{}, p)
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	const body = `{"sandbox_id":"box"}`
	f.Fuzz(func(t *testing.T, head string) {
		raw := "POST /admin/backend_cache/delete HTTP/1.1\r\n" + head + "Content-Length: 20\r\n\r\n" + body
		hreq, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil || hreq.ContentLength != int64(len(body)) {
			return
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, loopback, nil)
		if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
			return // fasthttp's 400, before the handler
		}
		a.Handler(&ctx)
		st := ctx.Response.StatusCode()
		origin := false
		for _, v := range hreq.Header.Values("Origin") {
			origin = origin || v != ""
		}
		local := !origin && localHostRef(hreq.Host)
		switch {
		case local && st == 403:
			t.Fatalf("a local tool's write refused (Host %q, Origin %q): %d %s\n%q", hreq.Host, hreq.Header.Values("Origin"), st, ctx.Response.Body(), raw)
		case !local && st == 200:
			t.Fatalf("a page's write served (Host %q, Origin %q): %s\n%q", hreq.Host, hreq.Header.Values("Origin"), ctx.Response.Body(), raw)
		}
	})
}
