package routing

import (
	"bytes"
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The proxy passes *fasthttp.RequestHeader; the tests use the real type too.
var _ HeaderPeeker = (*fasthttp.RequestHeader)(nil)

var idRegexp = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,127}$`)

func testParsers() map[string]*Parser {
	return map[string]*Parser{
		// plain: no domain check, one configured shared host.
		"plain": NewParser(ParserConfig{SharedHosts: []string{"Proxy.Example.com."}}),
		// domains: allow-list in mixed case, with a trailing dot and a wildcard spelling.
		"domains": NewParser(ParserConfig{Domains: []string{"Sandbox.Example.com.", "*.e2b.dev"}}),
		// devdomains: an allow-list that keeps *.localhost for local development.
		"devdomains": NewParser(ParserConfig{Domains: []string{"sandbox.example.com", "localhost"}}),
		// onedomain: the usual deployment, one domain, here in the
		// leading-dot spelling of a cookie domain.
		"onedomain": NewParser(ParserConfig{Domains: []string{".sandbox.example.com"}}),
	}
}

// headers builds a request head; a name given twice makes two lines.
func headers(kv ...string) *fasthttp.RequestHeader {
	var h fasthttp.RequestHeader
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &h
}

type parseCase struct {
	name   string
	parser string // key of testParsers; "" means plain
	host   string
	hdr    []string
	port   uint16
	id     string
	shared bool
	code   string // expected TargetError code; "" means success
}

func parseCases() []parseCase {
	id128 := "a" + strings.Repeat("b", 127)
	id129 := "a" + strings.Repeat("b", 128)
	cube := func(id, port string) []string { return []string{"X-Cube-Sandbox-Id", id, "X-Cube-Sandbox-Port", port} }
	e2b := func(id, port string) []string { return []string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port} }
	return []parseCase{
		{name: "empty", host: "", code: CodeInvalidHost},
		{name: "port only", host: ":8080", code: CodeInvalidHost},
		{name: "basic", host: "50005-abc.example.com", port: 50005, id: "abc"},
		{name: "uppercase host", host: "50005-ABC.Example.COM", port: 50005, id: "abc"},
		{name: "trailing dot", host: "50005-abc.example.com.", port: 50005, id: "abc"},
		{name: "host port", host: "50005-abc.example.com:443", port: 50005, id: "abc"},
		{name: "trailing dot and port", host: "50005-abc.example.com.:443", port: 50005, id: "abc"},
		{name: "two trailing dots", host: "50005-abc.example.com..", code: CodeInvalidHost},
		{name: "bare label", host: "50005-abc", port: 50005, id: "abc"},
		{name: "bare label trailing dot", host: "50005-abc.", port: 50005, id: "abc"},
		{name: "dev localhost domain", host: "8080-web.localhost:3000", port: 8080, id: "web"},
		{name: "id with dashes", host: "3000-my-sandbox-1.example.com", port: 3000, id: "my-sandbox-1"},
		{name: "ipv6 literal with port", host: "[::1]:8080", hdr: cube("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "ipv6 literal", host: "[2001:db8::1]", hdr: cube("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "ipv6 unbracketed", host: "::1", hdr: cube("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "ipv4 with port", host: "127.0.0.1:8081", hdr: cube("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "ipv4 trailing dot", host: "10.0.0.1.", hdr: cube("abc", "1"), port: 1, id: "abc", shared: true},
		{name: "localhost e2b headers", host: "localhost:8081", hdr: e2b("abc", "49983"), port: 49983, id: "abc", shared: true},
		{name: "localhost uppercase, lower-case header names", host: "LOCALHOST", hdr: []string{"e2b-sandbox-id", "Abc", "e2b-sandbox-port", "80"}, port: 80, id: "abc", shared: true},
		{name: "both spellings, cube wins", host: "127.0.0.1", hdr: append(cube("cube", "1"), e2b("e2b", "2")...), port: 1, id: "cube", shared: true},
		{name: "incomplete cube pair, e2b used", host: "127.0.0.1", hdr: append([]string{"X-Cube-Sandbox-Id", "cube"}, e2b("e2b", "2")...), port: 2, id: "e2b", shared: true},
		// A gateway that appends its own target header behind the client's
		// (Envoy's default append) must not be overruled by the client's line.
		{name: "id header twice, different ids", host: "127.0.0.1", hdr: append(cube("client", "1"), "X-Cube-Sandbox-Id", "gateway"), code: CodeInvalidSandboxID},
		{name: "port header twice, different ports", host: "127.0.0.1", hdr: append(cube("abc", "1"), "X-Cube-Sandbox-Port", "2"), code: CodeInvalidPort},
		{name: "empty id line before a real one", host: "127.0.0.1", hdr: []string{"X-Cube-Sandbox-Id", "", "X-Cube-Sandbox-Id", "abc", "X-Cube-Sandbox-Port", "1"}, code: CodeInvalidSandboxID},
		{name: "e2b id header twice, different ids", host: "127.0.0.1", hdr: append(e2b("client", "1"), "E2b-Sandbox-Id", "gateway"), code: CodeInvalidSandboxID},
		{name: "id header twice, Kelvin sign for k", host: "127.0.0.1", hdr: append(cube("k", "1"), "X-Cube-Sandbox-Id", "\u212a"), code: CodeInvalidSandboxID},
		{name: "id header twice, same id", host: "127.0.0.1", hdr: append(cube("abc", "1"), "X-Cube-Sandbox-Id", "ABC"), port: 1, id: "abc", shared: true},
		{name: "e2b lines twice behind a whole cube pair", host: "127.0.0.1", hdr: append(append(cube("cube", "1"), e2b("a", "2")...), e2b("b", "3")...), port: 1, id: "cube", shared: true},
		{name: "incomplete pair", host: "127.0.0.1", hdr: []string{"X-Cube-Sandbox-Id", "abc", "E2b-Sandbox-Port", "1"}, code: CodeMissingTargetHeaders},
		{name: "ip without headers", host: "127.0.0.1", code: CodeMissingTargetHeaders},
		{name: "shared host configured", host: "proxy.example.com", hdr: cube("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "shared host case, dot and port", host: "PROXY.example.com.:443", hdr: e2b("abc", "50005"), port: 50005, id: "abc", shared: true},
		{name: "shared host without headers", host: "proxy.example.com", code: CodeMissingTargetHeaders},
		{name: "headers on sandbox host ignored", host: "50005-abc.example.com", hdr: cube("evil", "22"), port: 50005, id: "abc"},
		{name: "port zero", host: "0-x", code: CodeInvalidPort},
		{name: "port too big", host: "65536-x", code: CodeInvalidPort},
		{name: "port max", host: "65535-x", port: 65535, id: "x"},
		{name: "leading zeros", host: "0050005-x", port: 50005, id: "x"},
		// README: leading zeros allowed, 10 digits at most.
		{name: "ten digits", host: "0000050005-x", port: 50005, id: "x"},
		{name: "eleven digits", host: "00000050005-x", code: CodeInvalidPort},
		{name: "too many digits", host: "00000000050005-x", code: CodeInvalidPort},
		{name: "huge port", host: "99999999999999999999999-x", code: CodeInvalidPort},
		{name: "empty id", host: "50005-", code: CodeInvalidSandboxID},
		{name: "empty port", host: "-abc", code: CodeInvalidPort},
		{name: "no dash", host: "abc", code: CodeInvalidHost},
		{name: "no dash with domain", host: "www.example.com", code: CodeInvalidHost},
		{name: "non-numeric port", host: "x-abc", code: CodeInvalidPort},
		{name: "dot ends the id", host: "50005-a.b.example.com", port: 50005, id: "a"},
		{name: "underscore in id", host: "50005-a_b.example.com", port: 50005, id: "a_b"},
		{name: "id starts with underscore", host: "50005-_ab.example.com", code: CodeInvalidSandboxID},
		{name: "id starts with dash", host: "50005--ab.example.com", code: CodeInvalidSandboxID},
		{name: "percent in id", host: "50005-a%2eb.example.com", code: CodeInvalidSandboxID},
		{name: "unicode in id", host: "50005-abé.example.com", code: CodeInvalidSandboxID},
		{name: "128-char id", host: "1-" + id128 + ".example.com", port: 1, id: id128},
		{name: "129-char id", host: "1-" + id129 + ".example.com", code: CodeInvalidSandboxID},
		{name: "200-char label", host: "1-" + strings.Repeat("a", 198), code: CodeInvalidSandboxID},
		{name: "300-char label", host: "1-" + strings.Repeat("a", 298) + ".example.com", code: CodeInvalidHost},
		// RFC 1035's 253 bytes, the trailing root dot not counted.
		{name: "253-byte host", host: "1-abc." + strings.Repeat("a", 243) + ".com", port: 1, id: "abc"},
		{name: "253-byte host and root dot", host: "1-abc." + strings.Repeat("a", 243) + ".com.", port: 1, id: "abc"},
		{name: "254-byte host", host: "1-abc." + strings.Repeat("a", 244) + ".com", code: CodeInvalidHost},
		{name: "empty domain label", host: "50005-abc..example.com", code: CodeInvalidHost},
		{name: "space in domain", host: "50005-abc.exa mple.com", code: CodeInvalidHost},
		{name: "bad host port", host: "50005-abc.example.com:https", code: CodeInvalidHost},
		{name: "host port five digits", host: "50005-abc.example.com:99999", port: 50005, id: "abc"},
		{name: "host port six digits", host: "50005-abc.example.com:123456", code: CodeInvalidHost},
		{name: "bad ipv4", host: "1.2.3.4.5", code: CodeInvalidHost},
		{name: "ipv4 leading zero", host: "127.0.0.01", code: CodeInvalidHost},
		{name: "unterminated ipv6", host: "[::1", code: CodeInvalidHost},
		{name: "junk after ipv6", host: "[::1]x", code: CodeInvalidHost},
		{name: "ipv4 in brackets", host: "[1.2.3.4]", code: CodeInvalidHost},
		{name: "ipv6 zone", host: "[fe80::1%25eth0]:80", code: CodeInvalidHost},
		{name: "header id with dot", host: "127.0.0.1", hdr: cube("a.b", "1"), code: CodeInvalidSandboxID},
		{name: "header id with percent", host: "127.0.0.1", hdr: cube("a%20b", "1"), code: CodeInvalidSandboxID},
		{name: "header id with space", host: "127.0.0.1", hdr: cube("a b", "1"), code: CodeInvalidSandboxID},
		{name: "header id unicode", host: "127.0.0.1", hdr: cube("ab\u00e9", "1"), code: CodeInvalidSandboxID},
		{name: "header id uppercase", host: "127.0.0.1", hdr: cube("My_Box-1", "1"), port: 1, id: "my_box-1", shared: true},
		{name: "header id 128", host: "127.0.0.1", hdr: cube(id128, "1"), port: 1, id: id128, shared: true},
		{name: "header id 129", host: "127.0.0.1", hdr: cube(id129, "1"), code: CodeInvalidSandboxID},
		{name: "header port leading zeros", host: "127.0.0.1", hdr: cube("abc", "0050005"), port: 50005, id: "abc", shared: true},
		{name: "header port zero", host: "127.0.0.1", hdr: cube("abc", "0"), code: CodeInvalidPort},
		{name: "header port text", host: "127.0.0.1", hdr: cube("abc", "http"), code: CodeInvalidPort},
		{name: "header port too big", host: "127.0.0.1", hdr: cube("abc", "65536"), code: CodeInvalidPort},
		{name: "header port ten digits", host: "127.0.0.1", hdr: cube("abc", "0000050005"), port: 50005, id: "abc", shared: true},
		{name: "header port eleven digits", host: "127.0.0.1", hdr: cube("abc", "00000050005"), code: CodeInvalidPort},
		{name: "domain allowed", parser: "domains", host: "50005-abc.sandbox.example.com", port: 50005, id: "abc"},
		{name: "domain allowed, case, dot, port", parser: "domains", host: "50005-ABC.SANDBOX.example.com.:443", port: 50005, id: "abc"},
		{name: "second domain", parser: "domains", host: "50005-abc.e2b.dev", port: 50005, id: "abc"},
		{name: "domain not allowed", parser: "domains", host: "50005-abc.evil.com", code: CodeDomainNotAllowed},
		{name: "subdomain of allowed", parser: "domains", host: "50005-abc.x.sandbox.example.com", code: CodeDomainNotAllowed},
		{name: "suffix lookalike", parser: "domains", host: "50005-abc.evilsandbox.example.com", code: CodeDomainNotAllowed},
		{name: "bare label with allow-list", parser: "domains", host: "50005-abc", code: CodeDomainNotAllowed},
		{name: "ip with allow-list still shared", parser: "domains", host: "127.0.0.1", hdr: cube("abc", "1"), port: 1, id: "abc", shared: true},
		{name: "shared host not configured", parser: "domains", host: "proxy.example.com", hdr: cube("abc", "1"), code: CodeDomainNotAllowed},
		// README: *.localhost hosts are sandbox hosts only while domains is
		// empty or lists localhost; localhost itself stays shared.
		{name: "dev localhost with allow-list", parser: "domains", host: "8080-web.localhost:3000", code: CodeDomainNotAllowed},
		{name: "dev localhost listed", parser: "devdomains", host: "8080-Web.LOCALHOST.:3000", port: 8080, id: "web"},
		{name: "one domain, leading dot", parser: "onedomain", host: "3000-abc.sandbox.example.com", port: 3000, id: "abc"},
		{name: "one domain, another refused", parser: "onedomain", host: "3000-abc.evil.com", code: CodeDomainNotAllowed},
		{name: "one domain, a bare label refused", parser: "onedomain", host: "3000-abc", code: CodeDomainNotAllowed},
		// Two colons are only an IPv6 literal, which names no sandbox: any
		// other such host is malformed, not a shared host.
		{name: "two colons, not ipv6", host: "abc:1:2", hdr: cube("abc", "1"), code: CodeInvalidHost},
		{name: "allow-list listing localhost keeps it shared", parser: "devdomains", host: "localhost", hdr: cube("abc", "1"), port: 1, id: "abc", shared: true},
	}
}

func TestParse(t *testing.T) {
	parsers := testParsers()
	for _, tc := range parseCases() {
		t.Run(tc.name, func(t *testing.T) {
			p := parsers[tc.parser]
			if p == nil {
				p = parsers["plain"]
			}
			host := []byte(tc.host)
			orig := bytes.Clone(host)
			var tgt Target
			// A previous good parse must not leak into a failed one.
			if err := p.Parse(&tgt, []byte("9-leftover.sandbox.example.com"), nil); err != nil {
				t.Fatal(err)
			}
			err := p.Parse(&tgt, host, headers(tc.hdr...))
			if !bytes.Equal(host, orig) {
				t.Fatalf("Parse modified its input: %q -> %q", orig, host)
			}
			if tc.code != "" {
				var te *TargetError
				if !errors.As(err, &te) {
					t.Fatalf("Parse(%q) = %v (target %d %q), want TargetError %s", tc.host, err, tgt.Port, tgt.ID(), tc.code)
				}
				if te.Code != tc.code {
					t.Fatalf("Parse(%q) code %s (%s), want %s", tc.host, te.Code, te.Reason, tc.code)
				}
				checkReason(t, te.Reason, tc.host, tc.hdr)
				if tgt.Port != 0 || len(tgt.ID()) != 0 || tgt.Shared {
					t.Fatalf("failed Parse left target %d %q %v", tgt.Port, tgt.ID(), tgt.Shared)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q) = %v", tc.host, err)
			}
			if tgt.Port != tc.port || string(tgt.ID()) != tc.id || tgt.Shared != tc.shared {
				t.Fatalf("Parse(%q) = %d %q shared=%v, want %d %q shared=%v", tc.host, tgt.Port, tgt.ID(), tgt.Shared, tc.port, tc.id, tc.shared)
			}
		})
	}
}

// checkReason asserts an error message repeats no more than maxEcho bytes of
// any input: each quoted literal in it holds at most maxEcho bytes, and the
// text around them repeats no longer run of any input.
func checkReason(t *testing.T, reason string, inputs ...any) {
	t.Helper()
	if reason == "" {
		t.Fatal("empty reason")
	}
	var all []string
	for _, in := range inputs {
		switch v := in.(type) {
		case string:
			all = append(all, v)
		case []string:
			all = append(all, v...)
		}
	}
	// Input is echoed Go-quoted: compare unquoted, or escapes and the
	// closing quote could match input bytes by chance.
	var outside strings.Builder
	for rest := reason; rest != ""; {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			outside.WriteString(rest)
			break
		}
		outside.WriteString(rest[:i])
		q, err := strconv.QuotedPrefix(rest[i:])
		if err != nil {
			outside.WriteString(rest[i:])
			break
		}
		if u, _ := strconv.Unquote(q); len(u) > maxEcho {
			t.Fatalf("reason quotes %d bytes, more than %d: %q", len(u), maxEcho, reason)
		}
		outside.WriteByte(0) // a literal's place: no run continues across it
		rest = rest[i+len(q):]
	}
	text := outside.String()
	for _, s := range all {
		for i := 0; i+maxEcho+1 <= len(s); i++ {
			if strings.Contains(text, s[i:i+maxEcho+1]) {
				t.Fatalf("reason echoes more than %d bytes of input: %q", maxEcho, reason)
			}
		}
	}
	if len(reason) > 400 {
		t.Fatalf("reason too long (%d bytes): %q", len(reason), reason)
	}
}

// An absolute-form target must name the sandbox and port Host names;
// other targets are not looked at.
func TestParseRequest(t *testing.T) {
	p := testParsers()["plain"]
	cube := headers("X-Cube-Sandbox-Id", "abc", "X-Cube-Sandbox-Port", "8080")
	none := headers()
	for _, tc := range []struct {
		host, target string
		h            *fasthttp.RequestHeader
		code         string // "" = success: 8080 abc
	}{
		{"8080-abc.x.test", "/p", none, ""},
		{"8080-abc.x.test", "*", none, ""},
		{"8080-abc.x.test", "//8080-other.x.test/p", none, ""},
		{"8080-abc.x.test", "/p?u=http://8080-other.x.test/", none, ""},
		{"8080-abc.x.test", "http://8080-abc.x.test/p", none, ""},
		{"8080-abc.x.test", "http://8080-abc.x.test", none, ""},
		{"8080-abc.x.test", "http://8080-abc.x.test?q", none, ""},
		{"8080-abc.x.test", "http://8080-abc.x.test#f", none, ""},
		{"8080-abc.x.test", "wss://U:P@08080-ABC.other.test.:1/p", none, ""},
		// The host follows the last "@", as url.Parse reads it.
		{"8080-abc.x.test", "http://u@v@8080-abc.x.test/p", none, ""},
		{"127.0.0.1", "http://8080-abc.x.test/p", cube, ""},
		{"8080-abc.x.test", "http://[::1]:80/p", cube, ""},
		{"8080-abc.x.test", "http://8080-other.x.test/p", none, CodeInvalidHost},
		{"8080-abc.x.test", "http://8081-abc.x.test/p", none, CodeInvalidHost},
		{"8080-abc.x.test", "http://8080-abc.x.test@8080-other.x.test/p", none, CodeInvalidHost},
		{"8080-abc.x.test", "http://other.x.test/p", none, CodeInvalidHost},
		{"8080-abc.x.test", "http:///p", none, CodeInvalidHost},
		{"8080-abc.x.test", "http://[::1]/p", none, CodeInvalidHost},
		{"127.0.0.1", "http://8080-other.x.test/p", cube, CodeInvalidHost},
		// Host is read first: its error is the one reported.
		{"8080-", "http://8080-abc.x.test/p", none, CodeInvalidSandboxID},
	} {
		var tgt Target
		err := p.ParseRequest(&tgt, []byte(tc.host), []byte(tc.target), tc.h)
		if tc.code == "" {
			if err != nil || tgt.Port != 8080 || string(tgt.ID()) != "abc" {
				t.Errorf("ParseRequest(%q, %q) = %d %q, %v; want 8080 abc", tc.host, tc.target, tgt.Port, tgt.ID(), err)
			}
			continue
		}
		var te *TargetError
		if !errors.As(err, &te) || te.Code != tc.code {
			t.Errorf("ParseRequest(%q, %q) = %v, want %s", tc.host, tc.target, err, tc.code)
			continue
		}
		checkReason(t, te.Reason, tc.host, tc.target)
		if tgt.Port != 0 || len(tgt.ID()) != 0 || tgt.Shared {
			t.Errorf("failed ParseRequest(%q, %q) left target %d %q %v", tc.host, tc.target, tgt.Port, tgt.ID(), tgt.Shared)
		}
	}
}

func TestParseNilHeaders(t *testing.T) {
	var tgt Target
	err := NewParser(ParserConfig{}).Parse(&tgt, []byte("localhost"), nil)
	var te *TargetError
	if !errors.As(err, &te) || te.Code != CodeMissingTargetHeaders {
		t.Fatalf("got %v, want %s", err, CodeMissingTargetHeaders)
	}
}

func TestParseNoAllocs(t *testing.T) {
	p := NewParser(ParserConfig{Domains: []string{"example.com"}, SharedHosts: []string{"proxy.example.com"}})
	hosts := [][]byte{
		[]byte("50005-abc.example.com"),
		[]byte("50005-ABCDEF-0123456789.Example.Com.:443"),
		[]byte("127.0.0.1:8080"),
		[]byte("[::1]:8080"),
		[]byte("proxy.example.com"),
	}
	h := headers("X-Cube-Sandbox-Id", "abc", "X-Cube-Sandbox-Port", "8080")
	var tgt Target
	for _, host := range hosts {
		allocs := testing.AllocsPerRun(100, func() {
			if err := p.Parse(&tgt, host, h); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Parse(%q): %v allocs, want 0", host, allocs)
		}
		for _, target := range [][]byte{[]byte("/p?q"), append(append([]byte("http://u@"), host...), "/p"...), []byte("/sandbox/abc/8080/p?q")} {
			allocs := testing.AllocsPerRun(100, func() {
				if err := p.ParseRequest(&tgt, host, target, h); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("ParseRequest(%q, %q): %v allocs, want 0", host, target, allocs)
			}
		}
	}
}

func BenchmarkParse(b *testing.B) {
	p := NewParser(ParserConfig{Domains: []string{"example.com", "sandbox.example.org"}, SharedHosts: []string{"proxy.example.com"}})
	h := headers("X-Cube-Sandbox-Id", "abc", "X-Cube-Sandbox-Port", "8080")
	for _, bc := range []struct{ name, host string }{
		{"host", "50005-i4kzt3dwwqkz1jbdmqqd2.sandbox.example.org:443"},
		{"headers", "127.0.0.1:8080"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			host := []byte(bc.host)
			var tgt Target
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Parse(&tgt, host, h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzParse feeds any Host, target headers and request target to both
// test parsers. Parse must agree with modelParser, the README's rules
// written out plainly: the same sandbox, port and kind of host, or a
// refusal (a *TargetError with a code) where the rules refuse; so a parser
// that reads another sandbox or port out of a host is caught, not only one
// that crashes. A target's canonical host parses back to it; a valid id and
// port, in each spelling clients use, parse to them. ParseRequest is Parse
// for an origin-form target and for an absolute-form one naming Host in
// another spelling, and it never accepts an absolute-form target whose host,
// as net/url reads it (as an RFC 9112 front proxy routes by it), names
// another sandbox or port.
func FuzzParse(f *testing.F) {
	for _, tc := range parseCases() {
		id, port := "", ""
		if len(tc.hdr) >= 4 {
			id, port = tc.hdr[1], tc.hdr[3]
		}
		f.Add(tc.host, id, port, "/")
		f.Add(tc.host, id, port, "http://"+tc.host+"/p")
	}
	f.Add("8080-a.example.com", "", "", "http://8080-b.example.com/p")
	f.Add("8080-a.example.com", "", "", "http://8080-a.example.com?@8080-b.example.com/p")
	f.Add("127.0.0.1", "a", "8080", "http://8080-a.example.com#x")
	f.Add("8080-a.example.com", "", "", "http://u:p@[::1]:80/p")
	f.Add("127.0.0.1", "a", "8080", "/sandbox/abc/8080/p?q")
	f.Add("127.0.0.1", "", "", "/sandbox/abc?next=/home") // no port segment
	f.Add("proxy.example.com", "", "", "sandbox/abc/08080?q")
	f.Add("8080-a.example.com", "", "", "/sandbox/abc/8080")
	f.Add("x.8080-a.sandbox.example.com", "", "", "/sandbox/abc/8080/") // under a sandbox host
	// Nested domains, one a suffix of the other: the id never takes a
	// label of the longer domain, and a name under a sandbox host of
	// either routes no path.
	f.Add("3000-abc.eu.cube.app", "", "", "/")
	f.Add("3000-eu.cube.app", "", "", "/")
	f.Add("3000-a.b.cube.app", "", "", "/")
	f.Add("x.3000-abc.eu.cube.app", "", "", "/sandbox/abc/3000/")
	f.Add("eu.cube.app:443", "", "", "//sandbox/abc-1_x/3000?q")
	f.Add("3000-abc.cube.app:80", "", "", "http://3000-abc.eu.cube.app/")
	f.Add("[::1]:8081", "", "", "/sandbox/8080/08080/")
	f.Add("0003000-8080.cube.app.", "", "", "/Sandbox/abc/3000/")
	// Absolute form under the path root: routed by the path when both
	// Host and the target's host serve paths.
	f.Add("127.0.0.1:8081", "", "", "http://127.0.0.1:8081/sandbox/abc/3000/p?q")
	f.Add("127.0.0.1", "a", "8080", "HTTPS://proxy.example.com//sandbox/abc/3000")
	f.Add("127.0.0.1", "", "", "http://3000-abc.cube.app/sandbox/other/3000/")
	f.Add("3000-abc.cube.app", "", "", "http://127.0.0.1/sandbox/abc/3000/")
	f.Add("127.0.0.1", "", "", "http://127.0.0.1?/sandbox/abc/3000/")
	f.Add("127.0.0.1", "", "", "http://127.0.0.1/sandbox/abc%2F3000/")
	parsers := testParsers()
	plain, domains := parsers["plain"], parsers["domains"]
	nested := NewParser(ParserConfig{Domains: []string{"cube.app", "EU.cube.app."}})
	models := map[string]modelParser{
		"plain":   {shared: []string{"localhost", "proxy.example.com"}},
		"domains": {domains: []string{"sandbox.example.com", "e2b.dev"}, shared: []string{"localhost"}},
		"nested":  {domains: []string{"cube.app", "eu.cube.app"}, shared: []string{"localhost"}},
	}
	f.Fuzz(func(t *testing.T, host, id, port, target string) {
		h := headers("X-Cube-Sandbox-Id", id, "X-Cube-Sandbox-Port", port)
		// The other side: a valid id and port, in any of the spellings a
		// client is told to use, name that sandbox and port.
		if n, err := strconv.Atoi(port); err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == port && ValidID(id) {
			for _, c := range []struct {
				p      *Parser
				host   string
				h      *fasthttp.RequestHeader
				shared bool
			}{
				{plain, port + "-" + id, nil, false},
				{domains, port + "-" + id + ".sandbox.example.com", nil, false},
				{domains, port + "-" + id + ".E2B.dev.:443", nil, false},
				{nested, port + "-" + id + ".cube.app", nil, false},
				{nested, port + "-" + id + ".eu.cube.app:80", nil, false},
				{plain, "127.0.0.1:8081", h, true},
				{plain, "proxy.example.com", headers("E2b-Sandbox-Id", id, "E2b-Sandbox-Port", port), true},
			} {
				var tgt Target
				if err := c.p.Parse(&tgt, []byte(c.host), c.h); err != nil || int(tgt.Port) != n || string(tgt.ID()) != id || tgt.Shared != c.shared {
					t.Fatalf("Parse(%q) for id %q port %s: port %d id %q shared %v, %v", c.host, id, port, tgt.Port, tgt.ID(), tgt.Shared, err)
				}
			}
		}
		for name, p := range map[string]*Parser{"plain": plain, "domains": domains, "nested": nested} {
			in := []byte(host)
			var tgt Target
			err := p.Parse(&tgt, in, h)
			if string(in) != host {
				t.Fatalf("%s: Parse modified its input", name)
			}
			want, ok := models[name].parse(host, id, port)
			got := modelTarget{port: int(tgt.Port), id: string(tgt.ID()), shared: tgt.Shared}
			if ok != (err == nil) || ok && got != want {
				t.Fatalf("%s: Parse(%q) with id %q port %q = %+v, %v; the README's rules say %+v, %v", name, host, id, port, got, err, want, ok)
			}
			checkParseRequest(t, name, p, models[name], host, target, id, port, h, err)
			if err != nil {
				var te *TargetError
				if !errors.As(err, &te) || te.Code == "" {
					t.Fatalf("%s: error %v is not a TargetError with a code", name, err)
				}
				checkReason(t, te.Reason, host, id, port)
				continue
			}
			if tgt.Port < 1 || !idRegexp.Match(tgt.ID()) || !ValidID(string(tgt.ID())) {
				t.Fatalf("%s: Parse(%q) gave port %d id %q", name, host, tgt.Port, tgt.ID())
			}
			canon := strconv.Itoa(int(tgt.Port)) + "-" + string(tgt.ID())
			switch name {
			case "domains":
				canon += ".sandbox.example.com"
			case "nested":
				canon += ".eu.cube.app"
			}
			var again Target
			if err := p.Parse(&again, []byte(canon), nil); err != nil {
				t.Fatalf("%s: canonical %q of %q does not parse: %v", name, canon, host, err)
			}
			if again.Port != tgt.Port || !bytes.Equal(again.ID(), tgt.ID()) || again.Shared {
				t.Fatalf("%s: canonical %q parsed to %d %q", name, canon, again.Port, again.ID())
			}
		}
	})
}

// checkParseRequest holds ParseRequest(host, target) to Parse(host), whose
// error was hostErr, and to the host net/url reads out of target.
func checkParseRequest(t *testing.T, name string, p *Parser, m modelParser, host, target, id, port string, h HeaderPeeker, hostErr error) {
	t.Helper()
	var byHost, tgt Target
	_ = p.Parse(&byHost, []byte(host), h)
	same := func(err error) bool {
		return (err == nil) == (hostErr == nil) && tgt.Port == byHost.Port && bytes.Equal(tgt.ID(), byHost.ID())
	}
	// Origin form, and Host itself spelled as an absolute-form target:
	// the same answer as Parse.
	for _, tg := range []string{"/", "/" + target, "http://u:p@" + host + "/p?q", "HTTPS://" + host} {
		if pathRootModel.MatchString(tg) {
			checkPathRequest(t, name, p, host, tg, h)
			continue
		}
		if err := p.ParseRequest(&tgt, []byte(host), []byte(tg), h); !same(err) {
			t.Fatalf("%s: ParseRequest(%q, %q) = %d %q, %v; Parse: %d %q, %v", name, host, tg, tgt.Port, tgt.ID(), err, byHost.Port, byHost.ID(), hostErr)
		}
	}
	if pathRootModel.MatchString(target) {
		checkPathRequest(t, name, p, host, target, h)
		return
	}
	if _, rest, ok := strings.Cut(target, "://"); ok && !strings.HasPrefix(target, "/") {
		// Absolute form (the scheme is not looked at): the authority
		// ends at the first '/', '?' or '#'; a path under the root
		// follows it.
		if end := strings.IndexAny(rest, "/?#"); end >= 0 && pathRootModel.MatchString(rest[end:]) {
			authority := rest[:end]
			if at := strings.LastIndexByte(authority, '@'); at >= 0 {
				authority = authority[at+1:]
			}
			checkAbsolutePathRequest(t, name, p, host, authority, target, rest[end:], h)
			return
		}
	}
	err := p.ParseRequest(&tgt, []byte(host), []byte(target), h)
	if hostErr != nil {
		var te, hte *TargetError
		if !errors.As(err, &te) || !errors.As(hostErr, &hte) || te.Code != hte.Code {
			t.Fatalf("%s: ParseRequest(%q, %q) = %v; Parse refused the host: %v", name, host, target, err, hostErr)
		}
		return
	}
	if err != nil {
		var te *TargetError
		if !errors.As(err, &te) || te.Code != CodeInvalidHost {
			t.Fatalf("%s: ParseRequest(%q, %q) = %v, want a TargetError %s", name, host, target, err, CodeInvalidHost)
		}
		checkReason(t, te.Reason, host, target, id, port)
		return
	}
	if !same(nil) {
		t.Fatalf("%s: ParseRequest(%q, %q) = %d %q; Parse: %d %q", name, host, target, tgt.Port, tgt.ID(), byHost.Port, byHost.ID())
	}
	u, uerr := url.Parse(target)
	if uerr != nil || strings.HasPrefix(target, "/") || u.Host == "" {
		return
	}
	byURL, ok := m.parse(u.Host, id, port)
	if !ok || byURL.port != int(tgt.Port) || byURL.id != string(tgt.ID()) {
		t.Fatalf("%s: ParseRequest(%q, %q) accepted %d %q; the target's host %q names %+v, %v", name, host, target, tgt.Port, tgt.ID(), u.Host, byURL, ok)
	}
}

// checkAbsolutePathRequest holds ParseRequest for an absolute-form target
// whose path is under PathRoot to the README: routed by its path as the
// origin form on both Host and the target's own host, the prefix counted
// from the target's start; or by a sandbox Host; or refused with a code.
func checkAbsolutePathRequest(t *testing.T, name string, p *Parser, host, authority, target, path string, h HeaderPeeker) {
	t.Helper()
	var tgt, byHost, byAuthority, named Target
	err := p.ParseRequest(&tgt, []byte(host), []byte(target), h)
	switch {
	case err != nil:
		var te *TargetError
		if !errors.As(err, &te) || te.Code == "" {
			t.Fatalf("%s: error %v is not a TargetError with a code", name, err)
		}
	case tgt.PathPrefix == 0:
		if p.Parse(&named, []byte(host), nil) != nil || named.Shared {
			t.Fatalf("%s: ParseRequest(%q, %q) routed by host %d %q, which names no sandbox", name, host, target, tgt.Port, tgt.ID())
		}
		// Routed by Host, the target's own host must name the same
		// sandbox and port: a request a front proxy judged by the
		// target's host reaches no other sandbox.
		if p.Parse(&byAuthority, []byte(authority), h) != nil || byAuthority.Port != tgt.Port || !bytes.Equal(byAuthority.ID(), tgt.ID()) {
			t.Fatalf("%s: ParseRequest(%q, %q) routed by Host to %d %q; the target's host %q names %d %q",
				name, host, target, tgt.Port, tgt.ID(), authority, byAuthority.Port, byAuthority.ID())
		}
	default:
		herr := p.ParseRequest(&byHost, []byte(host), []byte(path), h)
		aerr := p.ParseRequest(&byAuthority, []byte(authority), []byte(path), h)
		for _, o := range []struct {
			err error
			t   *Target
		}{{herr, &byHost}, {aerr, &byAuthority}} {
			if o.err != nil || o.t.Port != tgt.Port || !bytes.Equal(o.t.ID(), tgt.ID()) || o.t.PathPrefix+len(target)-len(path) != tgt.PathPrefix {
				t.Fatalf("%s: ParseRequest(%q, %q) = %d %q prefix %d; its path on Host and on its host: %+v %v, %+v %v",
					name, host, target, tgt.Port, tgt.ID(), tgt.PathPrefix, byHost, herr, byAuthority, aerr)
			}
		}
	}
}
