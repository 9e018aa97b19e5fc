package proxy

import (
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
)

// browserLocation is what a browser makes of a Location value before it
// resolves it (WHATWG URL parsing): leading and trailing C0 controls and
// spaces go, tabs and newlines anywhere go, and in a special scheme's URL a
// backslash is a slash.
func browserLocation(loc string) string {
	loc = strings.TrimFunc(loc, func(r rune) bool { return r <= ' ' })
	loc = strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(loc)
	return strings.ReplaceAll(loc, `\`, "/")
}

// FuzzAppendLocalPath checks the Location of the 302 that trades a signed
// token for a cookie (appendCookieLocation), for any request target: a
// browser reads it as a path on the same host (one leading '/', never "//"
// that names another host), and so does net/url resolving it against the
// page; the query keeps no cube_token as fasthttp (the proxy's reader of
// it) reads the query, and the other parameters as sent.
func FuzzAppendLocalPath(f *testing.F) {
	for _, s := range []string{"/a/b?x=1&cube_token=t", "//evil.example/x", `/\evil.example`, "http://h//evil/x?y",
		"/\t/evil", "*", "host:80", `http:\\evil\x`, "/%2F%2Fevil", "?cube_token=a", "/p?cube%5Ftoken=t",
		"/p?cube_token=a&cube_token=b", "/p?CUBE_TOKEN=t&a=1", "/p?a=1&cube_token=t&b=2#f", "http://h?cube_token=t",
		"/ /evil", "/\r\n//evil", "/p??cube_token=t", "/p?&cube_token"} {
		f.Add(s)
	}
	base, err := url.Parse("https://8080-box.cube.test/start?cube_token=t")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		loc := string(appendCookieLocation(nil, []byte(uri)))
		b := browserLocation(loc)
		if !strings.HasPrefix(b, "/") || strings.HasPrefix(b, "//") {
			t.Fatalf("target %q: Location %q (to a browser %q) is not a path on this host", uri, loc, b)
		}
		if ref, err := url.Parse(b); err == nil {
			if got := base.ResolveReference(ref); got.Host != base.Host || got.User != nil {
				t.Fatalf("target %q: Location %q resolves to %q (net/url)", uri, loc, got)
			}
		}
		path, query, _ := strings.Cut(uri, "?")
		_, lquery, hasQuery := strings.Cut(loc, "?")
		var args fasthttp.Args
		args.Parse(lquery)
		if args.Has(auth.QueryParamName) || auth.HasQueryParam([]byte(lquery), auth.QueryParamName) {
			t.Fatalf("target %q: Location %q keeps %s", uri, loc, auth.QueryParamName)
		}
		if want, _ := auth.AppendStripQueryParam(nil, []byte(query), auth.QueryParamName); lquery != string(want) || hasQuery != (len(want) > 0) {
			t.Fatalf("target %q: Location %q, want the query %q", uri, loc, want)
		}
		// And a path that needs no repair (one '/' and then no '/', '\\'
		// or character a browser skips) comes back as sent: the browser
		// lands on the page it asked for.
		if path == "/" || len(path) > 1 && path[0] == '/' && path[1] > ' ' && path[1] != '/' && path[1] != '\\' {
			if got := string(appendLocalPath(nil, []byte(path))); got != path {
				t.Fatalf("path %q: Location path %q", path, got)
			}
		}
	})
}

// FuzzRedirectLocation checks the 308 of the plain-HTTP redirect listener
// for any Host and request target fasthttp accepts: the Location names
// the host the client asked for (no open redirect), at the HTTPS port,
// followed by a path: the one asked for, when it was in origin form.
func FuzzRedirectLocation(f *testing.F) {
	for _, s := range [][3]string{
		{"8080-box.cube.test", "/a?b", ""}, {"8080-box.cube.test:80", "http://evil.example//x", "8443"},
		{"[::1]:80", "*", ""}, {"::1", "/", "8443"}, {"[v1.x]", "//evil/", ""}, {"a:b:c", "/", ""},
		{"[a]b", "/", ""}, {"evil.example:80:1", "/", "8443"}, {"]", "/", ""},
		{"[::1]b", "/", ""}, {"[::1]b", "/", "8443"}, {`a\b`, "/", ""}, {`evil.example\.a`, "/", "8443"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, host, uri, port string) {
		if port != "" && strings.Trim(port, "0123456789") != "" {
			return // the operator's https port is a number
		}
		var h fasthttp.RequestHeader
		raw := "GET " + uri + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
		if h.Read(bufioReader(raw)) != nil || !redirectableHost(h.Host()) || len(h.Host()) == 0 {
			return
		}
		host = string(h.Host())
		loc := "https://" + httpsAuthority(host, port) + redirectTarget(h.RequestURI())
		b := strings.TrimPrefix(browserLocation(loc), "https://")
		authority, rest, _ := strings.Cut(b, "/")
		if !strings.HasPrefix(b[len(authority):], "/") {
			t.Fatalf("Host %q, target %q: Location %q has no path after its authority", host, uri, loc)
		}
		_ = rest
		if strings.ContainsAny(authority, "@?#") {
			t.Fatalf("Host %q: Location %q has userinfo, query or fragment in its authority", host, loc)
		}
		if got, want := hostOf(authority), hostOf(host); !strings.EqualFold(got, want) {
			t.Fatalf("Host %q (host %q): Location %q names host %q", host, want, loc, got)
		}
		// And it is the page asked for, on the HTTPS port: an origin-form
		// target whole, the operator's port or none (the default).
		if _, p, err := net.SplitHostPort(authority); port != "" && (err != nil || p != port) || port == "" && err == nil {
			t.Fatalf("Host %q, HTTPS port %q: Location %q", host, port, loc)
		}
		if target := string(h.RequestURI()); strings.HasPrefix(target, "/") && loc != "https://"+httpsAuthority(host, port)+target {
			t.Fatalf("target %q: Location %q", target, loc)
		}
	})
}

// hostOf is the host part of an authority, as a URL parser reads it: the
// bracketed literal, or everything before the last ':'.
func hostOf(authority string) string {
	if strings.HasPrefix(authority, "[") {
		if i := strings.IndexByte(authority, ']'); i >= 0 {
			return authority[1:i]
		}
	}
	if h, _, err := net.SplitHostPort(authority); err == nil {
		return h
	}
	if i := strings.LastIndexByte(authority, ':'); i >= 0 && !strings.Contains(authority[:i], ":") {
		return authority[:i]
	}
	return strings.Trim(authority, "[]")
}

// FuzzScopeSetCookies checks what a sandbox's Set-Cookie lines become on
// their way to the client: as net/http (and a browser) parses them, none
// has a Domain (not even the request's host), every cookie keeps its name,
// value and other attributes (a line without Domain its bytes), and their
// number and order do not change.
func FuzzScopeSetCookies(f *testing.F) {
	for _, s := range []string{
		"a=1; Domain=cube.test; Path=/",
		"a=1; domain = .8080-box.cube.test ; Secure\r\nSet-Cookie: b=2; Domain=evil",
		"a=1; Domain=; Domain=cube.test",
		"a=\"q;Domain=x\"; HttpOnly",
		"a=1; Domain=8080-BOX.cube.test.",
		"a=1; Domain=.",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Add("a=1; path= /x ;Path=/; Path=rel; Domain=cube.test", true)
	f.Add("0=;pAth= /", true) // a Path with a blank before it
	f.Fuzz(func(t *testing.T, setCookies string, routedByPath bool) {
		var h fasthttp.ResponseHeader
		raw := "HTTP/1.1 200 OK\r\nSet-Cookie: " + setCookies + "\r\nContent-Length: 0\r\n\r\n"
		if h.Read(bufioReader(raw)) != nil {
			return
		}
		before := cookieLines(&h)
		var prefix []byte
		if routedByPath {
			prefix = []byte("/sandbox/box/8080")
		}
		scopeSetCookies(&h, prefix)
		after := cookieLines(&h)
		if len(before) != len(after) {
			t.Fatalf("%d cookies became %d: %q -> %q", len(before), len(after), before, after)
		}
		for i, line := range after {
			c, err := http.ParseSetCookie(trimCookieAttrs(line))
			b, berr := http.ParseSetCookie(trimCookieAttrs(before[i]))
			if (err == nil) != (berr == nil) || err == nil && (c.Name != b.Name || c.Value != b.Value) {
				t.Fatalf("cookie %q became %q", before[i], line)
			}
			if err == nil && c.Domain != "" {
				t.Fatalf("Set-Cookie %q (from %q) keeps Domain %q", line, before[i], c.Domain)
			}
			// Only Domain goes, and a Path under the prefix: every other
			// attribute stays as the sandbox set it, and a line without
			// either is not touched.
			lowered := strings.ToLower(before[i])
			if !strings.Contains(lowered, "domain") && (prefix == nil || !strings.Contains(lowered, "path")) && line != before[i] {
				t.Fatalf("Set-Cookie %q, without a Domain, became %q", before[i], line)
			}
			if err == nil && prefix != nil && strings.HasPrefix(b.Path, "/") && !underPrefix([]byte(b.Path), prefix) {
				if c.Path != string(prefix)+b.Path {
					t.Fatalf("Set-Cookie %q became %q: Path %q, want %q", before[i], line, c.Path, string(prefix)+b.Path)
				}
				c.Path = b.Path
			}
			if err == nil {
				// net/http leaves a Domain it finds invalid unparsed.
				isDomain := func(attr string) bool {
					name, _, _ := strings.Cut(attr, "=")
					return strings.EqualFold(strings.TrimSpace(name), "domain")
				}
				c.Domain, c.Raw, c.Unparsed = "", "", append([]string(nil), slices.DeleteFunc(c.Unparsed, isDomain)...)
				b.Domain, b.Raw, b.Unparsed = "", "", append([]string(nil), slices.DeleteFunc(b.Unparsed, isDomain)...)
				// net/http also leaves unparsed a Path whose value it
				// rejects (a '"' or '\\' in it), which a browser takes as
				// the path all the same: the proxy scopes that one too.
				for j, attr := range b.Unparsed {
					name, val, _ := strings.Cut(attr, "=")
					if prefix != nil && strings.EqualFold(name, "path") && strings.HasPrefix(val, "/") && !underPrefix([]byte(val), prefix) {
						b.Unparsed[j] = name + "=" + string(prefix) + val
					}
				}
				if !reflect.DeepEqual(c, b) {
					t.Fatalf("Set-Cookie %q became %q: %+v, was %+v", before[i], line, c, b)
				}
			}
		}
	})
}

// trimCookieAttrs trims the blanks around each attribute's name and value
// of a Set-Cookie line, as a browser does (RFC 6265 5.2) and the proxy
// reads them: net/http keeps them, so "Path= /" has the path " /" there and
// "Path =/" is no Path at all.
func trimCookieAttrs(line string) string {
	parts := strings.Split(line, ";")
	for i := 1; i < len(parts); i++ {
		name, val, ok := strings.Cut(parts[i], "=")
		parts[i] = strings.Trim(name, " \t")
		if ok {
			parts[i] += "=" + strings.Trim(val, " \t")
		}
	}
	return strings.Join(parts, ";")
}

// cookieLines lists the Set-Cookie lines of h as the client receives them.
func cookieLines(h *fasthttp.ResponseHeader) []string {
	var lines []string
	for _, l := range strings.Split(h.String(), "\r\n") {
		if v, ok := strings.CutPrefix(l, "Set-Cookie: "); ok {
			lines = append(lines, v)
		}
	}
	return lines
}

// FuzzSwitchedAsAsked checks the test a backend's 101 must pass before the
// proxy splices the connection, against RFC 9110 read plainly: the 101
// names at least one protocol in Upgrade, and each one it names (comma
// lists, blanks around items, any case) is one the request offered, h2c
// never.
func FuzzSwitchedAsAsked(f *testing.F) {
	for _, s := range [][2]string{{"websocket", "websocket"}, {"WebSocket", "websocket"}, {"h2c, websocket", "websocket"},
		{"websocket", "h2c"}, {"websocket", ""}, {"websocket", " , "}, {"a,b", "b ,a"}, {"websocket/13", "websocket"}} {
		f.Add(s[0], s[1])
	}
	items := func(lines ...string) []string {
		var out []string
		for _, l := range lines {
			for _, it := range strings.Split(l, ",") {
				// TrimSpace as nextToken: it also drops Unicode spaces
				// (U+00A0...), which only ever makes a token match more.
				if it = strings.TrimSpace(it); it != "" {
					out = append(out, strings.ToLower(it))
				}
			}
		}
		return out
	}
	f.Fuzz(func(t *testing.T, offer, answer string) {
		var req fasthttp.RequestHeader
		var resp fasthttp.ResponseHeader
		if req.Read(bufioReader("GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: "+offer+"\r\n\r\n")) != nil ||
			resp.Read(bufioReader("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+answer+"\r\n\r\n")) != nil {
			return
		}
		// h2c is never switched to, offered or not (see switchable).
		offered := slices.DeleteFunc(items(string(req.Peek("Upgrade"))), func(p string) bool { return p == "h2c" })
		named := items(string(resp.Peek("Upgrade")))
		want := len(named) > 0
		for _, n := range named {
			want = want && slices.Contains(offered, n)
		}
		if got := switchedAsAsked(&req, &resp); got != want {
			t.Fatalf("offered %q, answered %q: switchedAsAsked = %v, want %v", offered, named, got, want)
		}
	})
}
