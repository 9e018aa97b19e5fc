package auth

import (
	"bufio"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
)

func TestSetCookieHeader(t *testing.T) {
	now := time.Unix(1000, 400_000_000)
	tests := []struct {
		name   string
		expiry time.Time
		kind   CookieKind
		want   string
		maxAge int
	}{
		{"tls", time.Unix(1600, 0), CookieLaxSecure, "cube_proxy_auth=TOK; Path=/; Max-Age=600; HttpOnly; SameSite=Lax; Secure", 600},
		{"plain http", time.Unix(1600, 0), CookieLax, "cube_proxy_auth=TOK; Path=/; Max-Age=600; HttpOnly; SameSite=Lax", 600},
		{"cross-site frame", time.Unix(1600, 0), CookiePartitioned, "cube_proxy_auth=TOK; Path=/; Max-Age=600; HttpOnly; SameSite=None; Secure; Partitioned", 600},
		// 0.6 s left: Max-Age=0 would delete the cookie the 302 sets.
		{"last second", time.Unix(1001, 0), CookieLax, "cube_proxy_auth=TOK; Path=/; Max-Age=1; HttpOnly; SameSite=Lax", 1},
		{"at expiry", now, CookieLax, "cube_proxy_auth=TOK; Path=/; Max-Age=0; HttpOnly; SameSite=Lax", -1},
		// fasthttp reports "Max-Age=0" (delete now) as -1.
		{"past expiry", time.Unix(10, 0), CookieLax, "cube_proxy_auth=TOK; Path=/; Max-Age=0; HttpOnly; SameSite=Lax", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SetCookieHeader("TOK", tt.expiry, now, tt.kind)
			if got != tt.want {
				t.Fatalf("got  %q\nwant %q", got, tt.want)
			}
			var c fasthttp.Cookie
			if err := c.Parse(got); err != nil {
				t.Fatal(err)
			}
			sameSite := fasthttp.CookieSameSiteLaxMode
			if tt.kind == CookiePartitioned {
				sameSite = fasthttp.CookieSameSiteNoneMode
			}
			if string(c.Key()) != CookieName || string(c.Value()) != "TOK" || !c.HTTPOnly() || c.Secure() != (tt.kind != CookieLax) ||
				c.SameSite() != sameSite || c.Partitioned() != (tt.kind == CookiePartitioned) ||
				len(c.Domain()) != 0 || string(c.Path()) != "/" || c.MaxAge() != tt.maxAge {
				t.Fatalf("cookie attributes wrong: %s", c.String())
			}
		})
	}
}

func TestAppendStripCookie(t *testing.T) {
	tests := []struct {
		name, in, want string
		found          bool
	}{
		{"middle", "a=1; cube_proxy_auth=x; b=2", "a=1; b=2", true},
		{"first", "cube_proxy_auth=x; b=2", "b=2", true},
		{"last", "a=1; cube_proxy_auth=x", "a=1", true},
		{"only", "cube_proxy_auth=x", "", true},
		{"duplicates", "cube_proxy_auth=x; a=1; cube_proxy_auth=y; b=2; cube_proxy_auth=z", "a=1; b=2", true},
		{"all duplicates", "cube_proxy_auth=x;cube_proxy_auth=y", "", true},
		{"no spaces", "a=1;cube_proxy_auth=x;b=2", "a=1;b=2", true},
		{"odd spacing kept", "a=1 ;  cube_proxy_auth = x ;\tb=2  ;c", "a=1 ;\tb=2  ;c", true},
		{"empty value", "a=1; cube_proxy_auth=; b=2", "a=1; b=2", true},
		{"absent", "a=1; b=2", "a=1; b=2", false},
		{"absent odd bytes", " a=1;;b=\"q\" ; flag;", " a=1;;b=\"q\" ; flag;", false},
		{"similar names kept", "cube_proxy_auth2=x; xcube_proxy_auth=y; Cube_Proxy_Auth=z", "cube_proxy_auth2=x; xcube_proxy_auth=y; Cube_Proxy_Auth=z", false},
		{"name as value kept", "a=cube_proxy_auth; b=cube_proxy_auth=1", "a=cube_proxy_auth; b=cube_proxy_auth=1", false},
		{"valueless pair is not the cookie", "cube_proxy_auth; a=1", "cube_proxy_auth; a=1", false},
		{"empty header", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("keep:")
			got, found := AppendStripCookie(prefix, []byte(tt.in), CookieName)
			if string(got) != "keep:"+tt.want || found != tt.found {
				t.Fatalf("got %q, %v; want %q, %v", got, found, "keep:"+tt.want, tt.found)
			}
		})
	}
}

func TestCookieValues(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"middle", "a=1; cube_proxy_auth=tok; b=2", []string{"tok"}},
		{"duplicates, in order", "cube_proxy_auth=one; x=1; cube_proxy_auth=two", []string{"one", "two"}},
		{"spaces", "a=1 ;  cube_proxy_auth =  tok  ", []string{"tok"}},
		{"empty value", "cube_proxy_auth=", []string{""}},
		{"absent", "a=1; cube_proxy_auth2=x", nil},
		{"valueless", "cube_proxy_auth", nil},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for v := range CookieValues([]byte(tt.in), CookieName) {
				got = append(got, string(v))
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	// A consumer that stops early is not called again.
	n := 0
	for range CookieValues([]byte("cube_proxy_auth=1; cube_proxy_auth=2"), CookieName) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("early stop: %d values", n)
	}
}

func TestAppendStripQueryParam(t *testing.T) {
	tests := []struct {
		name, in, want string
		found          bool
	}{
		{"only", "cube_token=abc", "", true},
		{"first", "cube_token=abc&a=1&b=2", "a=1&b=2", true},
		{"middle", "a=1&cube_token=abc&b=2", "a=1&b=2", true},
		{"last", "a=1&b=2&cube_token=abc", "a=1&b=2", true},
		{"duplicates", "cube_token=1&a=1&cube_token=2&cube_token", "a=1", true},
		{"no value", "a=1&cube_token", "a=1", true},
		{"encoded name", "a=1&cube%5Ftoken=abc&b=2", "a=1&b=2", true},
		{"encoded lower hex", "cube%5ftoken=abc", "", true},
		{"others kept byte for byte", "z=%41%2b+&cube_token=x&&y=a%zz&q", "z=%41%2b+&&y=a%zz&q", true},
		{"similar names kept", "cube_token2=x&xcube_token=y&Cube_Token=z&cube+token=w", "cube_token2=x&xcube_token=y&Cube_Token=z&cube+token=w", false},
		{"bad escape is literal", "cube%5token=x", "cube%5token=x", false},
		// An escape cut short by the end of a name is literal too (and is
		// no reason to read past the name).
		{"escape cut short at the end", "%5=1&cube_token%5=x&cube_token%", "%5=1&cube_token%5=x&cube_token%", false},
		{"value named like the param", "a=cube_token", "a=cube_token", false},
		{"empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := AppendStripQueryParam(nil, []byte(tt.in), QueryParamName)
			if string(got) != tt.want || found != tt.found {
				t.Fatalf("got %q, %v; want %q, %v", got, found, tt.want, tt.found)
			}
			assertQueryAgreesWithFasthttp(t, tt.in, string(got), found)
			if has := HasQueryParam([]byte(tt.in), QueryParamName); has != tt.found {
				t.Errorf("HasQueryParam = %v, want %v", has, tt.found)
			}
		})
	}
}

// assertQueryAgreesWithFasthttp checks against fasthttp's own query parser
// (which the proxy uses to read cube_token): the input had the parameter iff
// found, the output never has it, and every other parameter is unchanged.
func assertQueryAgreesWithFasthttp(t *testing.T, in, out string, found bool) {
	t.Helper()
	var before, after fasthttp.Args
	before.Parse(in)
	after.Parse(out)
	if before.Has(QueryParamName) != found {
		t.Fatalf("found=%v but fasthttp sees the parameter: %v", found, before.Has(QueryParamName))
	}
	if after.Has(QueryParamName) {
		t.Fatalf("fasthttp still sees %s in %q", QueryParamName, out)
	}
	before.Del(QueryParamName)
	if before.String() != after.String() {
		t.Fatalf("other parameters changed: %q vs %q", before.String(), after.String())
	}
}

// FuzzAppendStripQueryParam checks the stripper against fasthttp's
// QueryArgs (what the proxy reads the token from): found says whether
// fasthttp reads the parameter, fasthttp reads none in what is left, and,
// as the doc comment promises, the other parameters keep their bytes and
// order: the output is the input's '&'-separated pieces, but each one that
// fasthttp on its own reads as the parameter, joined by '&' again. (The
// comparison of fasthttp's re-encoded Args alone would let a stripper
// re-escape or drop an empty piece.)
func FuzzAppendStripQueryParam(f *testing.F) {
	for _, s := range []string{"a=1&cube_token=x", "cube%5Ftoken=1&b", "%%&&==", "cube_token",
		"cube_token=a&cube_token=b", "a=%41&cube_token=x&b=c+d", "&cube_token=x&", "cube+token=x&cube_token",
		"CUBE_TOKEN=x&cube_token%3Dx", "a;cube_token=x&b", "cube_token=x=y&=&a", "%63ube_token&x=%ZZ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, found := AppendStripQueryParam(nil, []byte(in), QueryParamName)
		assertQueryAgreesWithFasthttp(t, in, string(out), found)
		if HasQueryParam([]byte(in), QueryParamName) != found {
			t.Fatalf("HasQueryParam(%q) = %v, AppendStripQueryParam found %v", in, !found, found)
		}
		var kept []string
		for _, piece := range strings.Split(in, "&") {
			var a fasthttp.Args
			a.Parse(piece)
			if !a.Has(QueryParamName) {
				kept = append(kept, piece)
			}
		}
		if want := strings.Join(kept, "&"); string(out) != want {
			t.Fatalf("%q stripped to %q, want the other pieces as sent: %q", in, out, want)
		}
		// Appending keeps what dst held.
		if out2, _ := AppendStripQueryParam([]byte("dst?"), []byte(in), QueryParamName); string(out2) != "dst?"+string(out) {
			t.Fatalf("appended to %q: %q, want %q", "dst?", out2, "dst?"+string(out))
		}
	})
}

func TestCookieOriginAllowed(t *testing.T) {
	const host = "8080-box.cube.test"
	tests := []struct {
		name, origin, host string
		want               bool
	}{
		{"no Origin", "", host, true},
		{"own origin", "http://8080-box.cube.test", host, true},
		{"own origin, case and port differ", "https://8080-BOX.cube.test:443", host + ":80", true},
		{"same sandbox, another port", "https://3000-box.cube.test", host, true},
		{"same sandbox, leading zeros", "https://03000-box.cube.test", host, true},
		{"another sandbox", "https://8080-evil.cube.test", host, false},
		{"an id that is a prefix", "https://8080-bo.cube.test", host, false},
		{"an id that extends it", "https://8080-box2.cube.test", host, false},
		{"the same id under another domain", "https://8080-box.evil.example", host, false},
		{"the host as a subdomain", "https://8080-box.cube.test.evil.example", host, false},
		{"the parent domain", "https://cube.test", host, false},
		{"no port prefix", "https://box.cube.test", host, false},
		{"a dash but no port digits", "https://-box.cube.test", host, false},
		{"empty id", "https://8080-", host, false},
		{"another site", "https://evil.example", host, false},
		{"opaque origin", "null", host, false},
		{"no scheme", "8080-box.cube.test", host, false},
		{"no host", "https://", host, false},
		{"no host on either side", "https://:8080", ":80", false},
		{"shared host by IP", "http://10.0.0.1:8080", "10.0.0.1", true},
		{"shared host, another IP", "http://10.0.0.2", "10.0.0.1", false},
		{"shared host by name, case differs", "https://Proxy.Cube.Test", "proxy.cube.test", true},
		{"IPv6 shared host", "http://[::1]:8080", "[::1]:80", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CookieOriginAllowed([]byte(tt.origin), []byte(tt.host)); got != tt.want {
				t.Fatalf("CookieOriginAllowed(%q, %q) = %v, want %v", tt.origin, tt.host, got, tt.want)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() {
		CookieOriginAllowed([]byte("https://3000-box.cube.test"), []byte(host))
	}); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}

// TestCookieRequestAllowed: without an Origin, a request from another
// origin's page (Sec-Fetch-Site other than same-origin or none) that is no
// navigation, a <script src> or <img> of another sandbox's page, keeps the
// cookie only when its Referer is a page of the same sandbox.
func TestCookieRequestAllowed(t *testing.T) {
	const host = "8080-box.cube.test"
	tests := []struct {
		name  string
		lines []string
		want  bool
	}{
		{"no browser headers", nil, true},
		{"Origin decides when present", []string{"Origin: https://8080-evil.cube.test", "Sec-Fetch-Site: same-origin"}, false},
		{"own Origin", []string{"Origin: https://8080-box.cube.test", "Sec-Fetch-Site: same-origin", "Sec-Fetch-Mode: cors"}, true},
		{"typed URL", []string{"Sec-Fetch-Site: none", "Sec-Fetch-Mode: navigate"}, true},
		{"user-initiated, not a navigation", []string{"Sec-Fetch-Site: none", "Sec-Fetch-Mode: no-cors"}, true},
		{"own page's script", []string{"Sec-Fetch-Site: SAME-ORIGIN", "Sec-Fetch-Mode: no-cors"}, true},
		{"link from another sandbox", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: navigate", "Referer: https://8080-evil.cube.test/"}, true},
		{"frame of another site", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: Navigate"}, true},
		{"another sandbox's script", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: https://8080-evil.cube.test/page"}, false},
		{"another site's script", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors", "Referer: https://evil.example/"}, false},
		{"no Referer", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors"}, false},
		{"empty Sec-Fetch-Mode", []string{"Sec-Fetch-Site: same-site", "Referer: https://evil.example/"}, false},
		{"Referer of the host under another domain", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: https://8080-box.cube.test.evil.example/"}, false},
		{"Referer with the host in its path", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: https://evil.example/8080-box.cube.test"}, false},
		{"Referer with the host in its query", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: https://evil.example?8080-box.cube.test"}, false},
		{"Referer without a scheme", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: 8080-box.cube.test"}, false},
		{"Referer null", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: null"}, false},
		{"same sandbox, another port", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: no-cors", "Referer: https://3000-box.cube.test:8443/app?x#y"}, true},
		{"same sandbox, origin-only Referer", []string{"Sec-Fetch-Site: same-site", "Sec-Fetch-Mode: cors", "Referer: https://3000-box.cube.test"}, true},
		{"own host, query right after it", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors", "Referer: http://8080-box.cube.test?a"}, true},
		{"own host, fragment right after it", []string{"Sec-Fetch-Site: cross-site", "Sec-Fetch-Mode: no-cors", "Referer: http://8080-box.cube.test#a"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			raw := "GET / HTTP/1.1\r\nHost: " + host + "\r\n" + strings.Join(append(tt.lines, ""), "\r\n") + "\r\n"
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				t.Fatal(err)
			}
			if got := CookieRequestAllowed(&h, h.Host()); got != tt.want {
				t.Fatalf("CookieRequestAllowed(%q) = %v, want %v", tt.lines, got, tt.want)
			}
		})
	}
	var h fasthttp.RequestHeader
	h.SetHost(host)
	h.Set("Sec-Fetch-Site", "same-site")
	h.Set("Sec-Fetch-Mode", "no-cors")
	h.Set("Referer", "https://3000-box.cube.test/app")
	if n := testing.AllocsPerRun(100, func() { CookieRequestAllowed(&h, h.Host()) }); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}

// FuzzAppendStripCookie checks the stripper against the reader and against
// net/http's cookie parser (what a Go sandbox reads): nothing left reads as
// the proxy's cookie with a value, found says whether one was there, and every other
// cookie keeps its name, value and order.
func FuzzAppendStripCookie(f *testing.F) {
	for _, s := range []string{
		"a=1; cube_proxy_auth=x; b=2", "cube_proxy_auth=x", "a=1 ;  cube_proxy_auth = x ;\tb=2  ;c",
		" a=1;;b=\"q\" ; flag;", "cube_proxy_auth; a=1", "cube_proxy_auth=\"x\"", "", ";",
	} {
		f.Add(s)
	}
	others := func(h []byte) []string {
		var out []string
		for rest := h; ; {
			piece, tail, more := cut(rest, ';')
			if k, v, ok := splitCookie(piece); ok && string(k) != CookieName {
				out = append(out, string(k)+"="+string(v))
			}
			if !more {
				return out
			}
			rest = tail
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, found := AppendStripCookie(nil, []byte(in), CookieName)
		n := 0
		for range CookieValues([]byte(in), CookieName) {
			n++
		}
		if found != (n > 0) {
			t.Fatalf("found = %v, but %q holds %d of the cookie", found, in, n)
		}
		for v := range CookieValues(out, CookieName) {
			t.Fatalf("%q left %q, still the cookie (value %q)", in, out, v)
		}
		if !found && string(out) != in {
			t.Fatalf("nothing found, but %q became %q", in, out)
		}
		if a, b := others([]byte(in)), others(out); !slices.Equal(a, b) {
			t.Fatalf("other cookies changed: %q -> %q", a, b)
		}
		if strings.ContainsAny(in, "\r\n") {
			return // net/http trims them; no header value carries them (fasthttp refuses a head with one)
		}
		r := http.Request{Header: http.Header{"Cookie": {string(out)}}}
		// A valueless "cube_proxy_auth" is a cookie with no name to a
		// browser and an empty one to net/http: no credential either way.
		if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
			t.Fatalf("net/http reads %q from %q (stripped from %q)", c.Value, out, in)
		}
	})
}

// FuzzCookieOriginAllowed checks that the cookie never counts for a
// request whose Origin is a page of another sandbox: when both hosts name
// a sandbox (as the proxy's host parser reads them), an allowed Origin names
// the same one. And that it still counts for the pages it is for: the
// request's own host and another port of the same sandbox.
func FuzzCookieOriginAllowed(f *testing.F) {
	for _, s := range [][2]string{
		{"https://3000-box.cube.test", "8080-box.cube.test"}, {"https://8080-BOX.cube.test:443", "8080-box.cube.test:80"},
		{"https://8080-box2.cube.test", "8080-box.cube.test"}, {"http://[::1]:8080", "[::1]:80"}, {"null", "8080-box.cube.test"},
		{"https://8080-box.cube.test.", "8080-box.cube.test"}, {"https://0-box.cube.test", "65536-box.cube.test"},
	} {
		f.Add(s[0], s[1])
	}
	parser := routing.NewParser(routing.ParserConfig{})
	f.Fuzz(func(t *testing.T, origin, host string) {
		// The other side: the request's own host, under any scheme, and
		// another port of the same sandbox may always use the cookie.
		var own routing.Target
		if len(hostOnly([]byte(host))) > 0 && !CookieOriginAllowed([]byte("https://"+host), []byte(host)) {
			t.Fatalf("Host %q refuses its own Origin", host)
		}
		if parser.Parse(&own, []byte(host), nil) == nil && !own.Shared {
			_, site, _ := strings.Cut(host, "-")
			if sibling := "http://1-" + site; !CookieOriginAllowed([]byte(sibling), []byte(host)) {
				t.Fatalf("Host %q (sandbox %q) refuses Origin %q, another port of it", host, own.ID(), sibling)
			}
		}
		if !CookieOriginAllowed([]byte(origin), []byte(host)) || origin == "" {
			return
		}
		_, o, _ := strings.Cut(origin, "://")
		var ot, ht routing.Target
		if parser.Parse(&ot, []byte(o), nil) != nil || parser.Parse(&ht, []byte(host), nil) != nil {
			return
		}
		if !ot.Shared && !ht.Shared && string(ot.ID()) != string(ht.ID()) {
			t.Fatalf("Origin %q (sandbox %q) may use the cookie of %q (sandbox %q)", origin, ot.ID(), host, ht.ID())
		}
	})
}

// FuzzCookieRequestAllowed checks the Referer rule as FuzzCookieOriginAllowed
// checks the Origin rule: a subresource request from another origin's page
// keeps the cookie only when net/url reads its Referer's host as the
// request's own host or a host of the same sandbox (as the proxy's host
// parser reads both), and never panics on any Referer.
func FuzzCookieRequestAllowed(f *testing.F) {
	for _, s := range [][2]string{
		{"https://3000-box.cube.test/app", "8080-box.cube.test"}, {"https://8080-evil.cube.test/", "8080-box.cube.test"},
		{"http://8080-box.cube.test?x", "8080-box.cube.test"}, {"https://evil.example/8080-box.cube.test", "8080-box.cube.test"},
		{"https://evil.example#8080-box.cube.test", "8080-box.cube.test"}, {"http://[::1]:8080/x", "[::1]:80"}, {"null", "8080-box.cube.test"},
	} {
		f.Add(s[0], s[1])
	}
	parser := routing.NewParser(routing.ParserConfig{})
	f.Fuzz(func(t *testing.T, referer, host string) {
		var h fasthttp.RequestHeader
		h.Set("Sec-Fetch-Site", "same-site")
		h.Set("Sec-Fetch-Mode", "no-cors")
		h.Set("Referer", referer)
		if !CookieRequestAllowed(&h, []byte(host)) {
			return
		}
		u, err := url.Parse(string(h.Peek("Referer")))
		// A browser's Referer is an absolute URL without userinfo (it
		// strips that): a scheme-relative "//://0", whose host net/url
		// reads as ":" where the first "://" comes after no scheme, names
		// no page a browser sends.
		if err != nil || u.Scheme == "" || u.Host == "" || u.User != nil {
			return // no page a browser names that way
		}
		if strings.EqualFold(hostOnlyString(u.Host), hostOnlyString(host)) {
			return
		}
		var rt, ht routing.Target
		if parser.Parse(&ht, []byte(host), nil) != nil {
			return // the proxy answers 400 before it looks at a cookie
		}
		if parser.Parse(&rt, []byte(u.Host), nil) != nil {
			// A port label that is no port ("00-box", "70000-box") names
			// no page the proxy serves; the sandbox it names is the one
			// the same name with a valid port names.
			_, rest, ok := strings.Cut(u.Host, "-")
			if !ok || parser.Parse(&rt, []byte("1-"+rest), nil) != nil {
				t.Fatalf("Referer %q (host %q) lets a subresource use the cookie of %q, which it does not name", referer, u.Host, host)
			}
		}
		if rt.Shared || ht.Shared || string(rt.ID()) != string(ht.ID()) {
			t.Fatalf("Referer %q (sandbox %q) lets a subresource use the cookie of %q (sandbox %q)", referer, rt.ID(), host, ht.ID())
		}
	})
}

func hostOnlyString(s string) string { return string(hostOnly([]byte(s))) }
