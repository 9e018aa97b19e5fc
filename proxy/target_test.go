package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// A target whose dot-segments climb above the root ("/../etc/passwd", or
// spelled "%2e%2e", or across a "%2F") is refused with 400, as nginx
// refuses it, and never reaches the sandbox: the platform's proxy kept
// those off every sandbox's server, and a hand-written one that joins the
// path to a directory would serve what lies above it. Targets that stay
// inside the root still pass byte for byte (paths are not normalised).
// The differential lab (bench/differ, target.dotdot-*) found it.
func TestTargetAboveRootRefused(t *testing.T) {
	h := newHarness(t)
	var reached atomic.Int64
	echo := echoHeaders()
	host := h.route("dots", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		echo.ServeHTTP(w, r)
	})))
	for _, target := range []string{
		"/..",
		"/../etc/passwd",
		"/a/../../etc/passwd",
		"/a/b/../../../x?y=1",
		"/%2e%2e/etc/passwd",
		"/%2E%2e/x",
		"/a/.%2E/%2e./x",
		"/a%2F..%2F..%2Fx",
		"/a//..//../x",
		"/./../x",
		"http://" + host + "/../x",
	} {
		t.Run(target, func(t *testing.T) {
			before := reached.Load()
			resp, body := authRawRequest(t, h.addr, "GET "+target+" HTTP/1.1", "Host: "+host)
			if resp.StatusCode != 400 || !strings.Contains(body, `"bad_request"`) {
				t.Errorf("status %d, want 400 bad_request: %s", resp.StatusCode, body)
			}
			if reached.Load() != before {
				t.Error("the sandbox got the request")
			}
		})
	}
	for _, target := range []string{
		"/a/../b",
		"/a/b/../../c",
		"/a/%2e%2e/b",
		"/..a/b..",
		"/.../x",
		"/a/./../b/.",
		"/p?x=/../../etc",
		"/p#/../../x",
		"//a/../b",
		"/a\\..\\..\\x",
	} {
		t.Run(target, func(t *testing.T) {
			if e := echoRawRequest(t, h.addr, "GET "+target+" HTTP/1.1", "Host: "+host); e.URI != target && !strings.HasPrefix(target, "/p#") {
				t.Errorf("sandbox got target %q, want %q", e.URI, target)
			}
		})
	}
}

func TestClimbsAboveRoot(t *testing.T) {
	for in, want := range map[string]bool{
		"/": false, "": false, "*": false, "/a": false, "/..": true, "/../": true, "/a/..": false,
		"/a/../..": true, "/%2e%2E": true, "/%2e": false, "/.%2e.": false, "/a/%2f/../..": true,
		"/a%2f..": false, "/a%2f..%2f..": true, "/a?/../..": false, "/a#/../..": false,
		"http://h/..": true, "http://h": false, "http://h/a/..": false, "/%2": false, "/%": false,
		"/..%2": false, "/a/...": false,
	} {
		if got := climbsAboveRoot([]byte(in)); got != want {
			t.Errorf("climbsAboveRoot(%q) = %v, want %v", in, got, want)
		}
	}
}
