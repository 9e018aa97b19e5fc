package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A signed link that is let through without the 302 (on a host routed by
// its path, or a form POST) leaves the token in the page's URL, and the
// browser then sends that URL as the Referer of the page's requests: in
// full on the shared origin, where every sandbox's pages are served, to
// another tenant's sandbox too, whose server could then open the linked
// sandbox until the link expires. The token is the proxy's credential and
// is removed from a forwarded Referer's query as from the target; every
// other byte of the Referer reaches the sandbox as sent, and without
// signing keys the parameter is the app's own and passes.
func TestRefererSignedTokenStripped(t *testing.T) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	signer, sign := authSigner(t, key)
	seen := make(chan []string, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.Header.Values("Referer"):
		default:
		}
	}))
	signed := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = signer })
	unsigned := newHarness(t)
	for _, h := range []*harness{signed, unsigned} {
		putAuthRoute(h, "victim", traffic, port, 8080)
		putAuthRoute(h, "other", "", port, 8080) // another tenant's public app
	}
	tok := sign("victim", 8080, 10*time.Minute)
	page := "http://" + signed.addr + "/sandbox/victim/8080/"

	for _, tc := range []struct {
		name     string
		h        *harness
		referers []string
		wantSeen []string
	}{
		{"only parameter", signed, []string{page + "?cube_token=" + tok}, []string{page}},
		{"among others", signed, []string{page + "?a=1&cube_token=" + tok + "&b=%2F"}, []string{page + "?a=1&b=%2F"}},
		{"encoded name", signed, []string{page + "?cube%5Ftoken=" + tok + "&a=1"}, []string{page + "?a=1"}},
		{"cross-origin page", signed, []string{"http://8080-victim.cube.test/x?cube_token=" + tok}, []string{"http://8080-victim.cube.test/x"}},
		{"every line", signed, []string{page + "?cube_token=" + tok, "http://a.test/?b=1&cube_token=" + tok},
			[]string{page, "http://a.test/?b=1"}},
		// A Cookie line has the proxy restore the order of repeated
		// fields after its deletes: the Referer's lines put back as sent
		// carried the token again.
		{"every line, with a cookie", signed, []string{page + "?cube_token=" + tok, "http://a.test/?cube_token=" + tok + "&b=1"},
			[]string{page, "http://a.test/?b=1"}},
		{"no token", signed, []string{page + "?a=1&cube_tokens=x&cube-token=y#f"}, []string{page + "?a=1&cube_tokens=x&cube-token=y#f"}},
		{"no signing keys", unsigned, []string{page + "?cube_token=" + tok}, []string{page + "?cube_token=" + tok}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := http.NewRequest("GET", "http://"+tc.h.addr+"/sandbox/other/8080/app.js", nil)
			if err != nil {
				t.Fatal(err)
			}
			r.Header["Referer"] = tc.referers
			if strings.Contains(tc.name, "cookie") {
				r.Header.Set("Cookie", "app=1")
			}
			resp := tc.h.do(r)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("the other sandbox's script: %d %s", resp.StatusCode, body)
			}
			var got []string
			select {
			case got = <-seen:
			default:
				t.Fatal("the sandbox answered, but its handler saw no request")
			}
			if strings.Join(got, "\n") != strings.Join(tc.wantSeen, "\n") {
				t.Errorf("the sandbox got Referer %q, want %q", got, tc.wantSeen)
			}
		})
	}
}

// The Referer is looked at on every request when signing keys are set: one
// without the token is not copied.
func TestRefererWithoutTokenAllocatesNothing(t *testing.T) {
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(
		"GET /app.js HTTP/1.1\r\nHost: 8080-box.cube.test\r\nReferer: http://8080-box.cube.test/p?a=1&cube_tokens=2\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { stripRefererToken(&h) }); n != 0 {
		t.Errorf("stripRefererToken allocated %v times for a Referer without the token", n)
	}
	if got := string(h.Peek("Referer")); got != "http://8080-box.cube.test/p?a=1&cube_tokens=2" {
		t.Errorf("Referer %q changed", got)
	}
}

// A single Referer line keeps its place among the head's lines once its
// token is removed, as the rest of the head keeps its order: only the
// token's bytes go.
func TestRefererTokenStrippedInPlace(t *testing.T) {
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader("GET /app.js HTTP/1.1\r\nHost: 8080-box.cube.test\r\n" +
		"Referer: http://8080-box.cube.test/p?cube_token=t&a=1\r\nAccept: */*\r\n\r\n"))); err != nil {
		t.Fatal(err)
	}
	stripRefererToken(&h)
	var lines []string
	for k, v := range h.All() {
		lines = append(lines, string(k)+": "+string(v))
	}
	want := []string{"Host: 8080-box.cube.test", "Referer: http://8080-box.cube.test/p?a=1", "Accept: */*"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("head after the strip:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
