package proxy

import "testing"

// appendLogTarget logs an absolute-form target as its path and query, as
// nginx logs $request_uri and as the proxy forwards it: the authority ends
// at the first '/', '?' or '#' (a '/' in the query is no path), a missing
// path is "/", and an origin-form target is kept whole even when its query
// holds a URL (a redirect parameter is not an authority).
func TestAppendLogTarget(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"/p?q=1", "/p?q=1"},
		{"/login?next=http://h.test/x", "/login?next=http://h.test/x"},
		{"*", "*"},
		{"", ""},
		{"http://h.test/p?q=1", "/p?q=1"},
		{"http://u:pw@h.test/p", "/p"},
		{"http://h.test", "/"},
		{"http://h.test?x=/y", "/?x=/y"},
		{"http://h.test#f/g", "/#f/g"},
	} {
		if got := string(appendLogTarget(nil, []byte(tc.target))); got != tc.want {
			t.Errorf("%q logged as %q, want %q", tc.target, got, tc.want)
		}
	}
}
