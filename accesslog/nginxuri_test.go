package accesslog

import (
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

// nginxURI never panics, and what it resolves has no empty, "." or ".."
// segment left, whatever the escapes decoded to.
func FuzzNginxURI(f *testing.F) {
	for _, s := range []string{"/", "//", "/a/../b", "/%2E%2E", "/a%2F..%2F", "/a/.", "/%", "/%0", "*", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := nginxURI(s)
		if !ok {
			if u != s {
				t.Errorf("%q refused, but %q returned", s, u)
			}
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
	})
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
