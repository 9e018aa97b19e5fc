package accesslog

import (
	"net/url"
	"strings"
	"testing"
)

// The cube format's uri is nginx's $uri: each case's want is what nginx
// 1.22.1 logged for that target (its $request_uri is the target as sent).
func TestCubeURIIsNginxURI(t *testing.T) {
	for _, tt := range []struct{ path, want string }{
		{"/plain/path", "/plain/path"},
		{"/a%2F%2Fb", "/a/b"},
		{"/a/%2E%2E/b", "/b"},
		{"/a/%2e/b", "/a/b"},
		{"/a//%2fb", "/a/b"},
		{"/a%25b", "/a%b"},
		{"/a%23b", "/a#b"},
		{"/a%3Fb", "/a?b"},
		{"/a/b/..", "/a/"},
		{"/a/.", "/a/"},
		{"/a/..", "/"},
		{"/a/b/%2E%2E", "/a/"},
		{"/a+b", "/a+b"},
		{"/%7e%C3%A9", `/~\xC3\xA9`},
		{"/a/..//b", "/b"},
		{"/a/.hidden/...", "/a/.hidden/..."},
		{"/a%5Cb", `/a\x5Cb`},
		{"/a;x/../b", "/b"},
		{"//", "/"},
		{"/a//", "/a/"},
		{"/a%20b//c/./d/../e%22", `/a b/c/e\x22`},
		{"/" + strings.Repeat("%41", 300), "/" + strings.Repeat("A", 300)}, // longer than the stack buffer
		// nginx refuses these (400); the proxy's line shows them as sent.
		{"/a%zzb", "/a%zzb"},
		{"/a%00b", "/a%00b"},
		{"/a%4", "/a%4"},
		{"/a/./../../b", "/a/./../../b"},
		{"/..", "/.."},
		{"*", "*"},
	} {
		if got := strings.Split(cubeLine(&Entry{Time: testTime, URI: tt.path}), cubeSep)[10]; got != tt.want {
			t.Errorf("uri %q: logged %q, want %q", tt.path, got, tt.want)
		}
	}
}

// FuzzNginxURI holds appendNginxURI to nginxURIRef, the rule its doc
// comment states written out plainly (decode every escape, then resolve the
// segments on a stack): the same $uri, or the same refusal. A resolver that
// drops a segment, keeps a "..", or decodes an escape twice is caught, not
// only one that leaves a dot segment behind.
func FuzzNginxURI(f *testing.F) {
	for _, s := range []string{"/", "//", "/a/../b", "/%2E%2E", "/a%2F..%2F", "/a/.", "/%", "/%0", "*", "",
		"/a/b/../..", "/a/b/../../..", "/.%2e/x", "/a%252e%252e/..", "/a/...", "/a/..b/", "/a//b//", "/%2F%2F",
		"/a%2Fb%2F%2E%2E%2F%2E%2E%2Fc", "/a/%00/..", "/a\x00/..", "/\xff%ff/./", "/%4g", "/a%2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := nginxURI(s)
		want, wantOK := nginxURIRef(s)
		if ok != wantOK || u != want {
			t.Fatalf("%q: resolved to %q (ok %v), the rule gives %q (ok %v)", s, u, ok, want, wantOK)
		}
		if !ok {
			return
		}
		if u == "" || u[0] != '/' {
			t.Fatalf("%q resolved to %q", s, u)
		}
		for _, seg := range strings.Split(u[1:], "/")[:strings.Count(u[1:], "/")] {
			if seg == "" || seg == "." || seg == ".." {
				t.Errorf("%q resolved to %q, which keeps segment %q", s, u, seg)
			}
		}
		if last := u[strings.LastIndexByte(u, '/')+1:]; last == "." || last == ".." {
			t.Errorf("%q resolved to %q, which ends in %q", s, u, last)
		}
		// A path nginxURIChanges passes over is logged as sent: it must be
		// one that resolves to itself.
		if !nginxURIChanges(s) && u != s {
			t.Errorf("%q resolves to %q, but nginxURIChanges says it cannot change", s, u)
		}
	})
}

// nginxURIRef is nginx's $uri of path as appendNginxURI's doc comment
// states it, written plainly: refused without a leading '/', with a bad
// escape or "%00"; else every escape decoded (net/url, which takes no '+'
// for a blank in a path), the segments resolved on a stack ("" and "."
// dropped, ".." popping one, refused at the root), and a trailing '/' kept
// where the last segment was "", "." or "..".
func nginxURIRef(path string) (string, bool) {
	if path == "" || path[0] != '/' {
		return path, false
	}
	dec, err := url.PathUnescape(path)
	// Every '%' of a path PathUnescape takes starts an escape, so a
	// "%00" in it is an escaped NUL.
	if err != nil || strings.Contains(path, "%00") {
		return path, false
	}
	var stack []string
	segs := strings.Split(dec[1:], "/")
	trailing := false
	for _, seg := range segs {
		trailing = false
		switch seg {
		case "", ".":
			trailing = true
		case "..":
			if len(stack) == 0 {
				return path, false
			}
			stack = stack[:len(stack)-1]
			trailing = true
		default:
			stack = append(stack, seg)
		}
	}
	u := "/" + strings.Join(stack, "/")
	if trailing && len(stack) > 0 {
		u += "/"
	}
	return u, true
}

// nginxURI is appendNginxURI's result on its own, s when refused.
func nginxURI(s string) (string, bool) {
	b, ok := appendNginxURI([]byte("prefix"), s)
	if !ok {
		if string(b) != "prefix" {
			panic("a refused path left " + string(b))
		}
		return s, false
	}
	return string(b[len("prefix"):]), true
}
