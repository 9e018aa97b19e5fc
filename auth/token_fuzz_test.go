package auth

import (
	"bufio"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"
)

// FuzzCheckTraffic checks the traffic-token decision for any lines of the
// two token headers, against the rule the README states, with net/http
// reading the same head as the reference (what the client sent, each
// value without the whitespace around it): a restricted route lets the
// request through exactly when the first e2b-traffic-access-token line,
// or, when that is absent or empty, the first cube-traffic-access-token
// line, equals the stored token byte for byte; a missing token and a wrong
// one are told apart; a public route and an exempt port let everything
// through, and a restricted route without a token lets nothing through.
func FuzzCheckTraffic(f *testing.F) {
	f.Add(testToken, testToken, "", "", "")
	f.Add(testToken, "", "", testToken, "")
	f.Add(testToken, " "+testToken+" ", "", "", "")
	f.Add(testToken, "", testToken, "x", "")
	f.Add(testToken, "wrong", "", testToken, "")
	f.Add("", testToken, "", "", "")
	f.Add(testToken, strings.ToUpper(testToken), "", "", testToken)
	f.Fuzz(func(t *testing.T, stored, e2b, e2b2, cube, cube2 string) {
		raw := "GET / HTTP/1.1\r\nHost: 8080-sbx.example.test\r\n"
		for _, l := range [][2]string{{HeaderE2BTrafficToken, e2b}, {"E2B-Traffic-Access-Token", e2b2}, {HeaderCubeTrafficToken, cube}, {"Cube-Traffic-Access-Token", cube2}} {
			if l[1] != "" {
				raw += l[0] + ": " + l[1] + "\r\n"
			}
		}
		raw += "\r\n"
		var h fasthttp.RequestHeader
		if h.Read(bufio.NewReader(strings.NewReader(raw))) != nil {
			return
		}
		ref, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // a head net/http refuses has no reference reading
		}
		first := func(name string) string {
			if v := ref.Header.Values(name); len(v) > 0 {
				return v[0]
			}
			return ""
		}
		presented := first(HeaderE2BTrafficToken)
		if presented == "" {
			presented = first(HeaderCubeTrafficToken)
		}
		if got := string(PresentedTrafficToken(&h)); got != presented {
			t.Fatalf("PresentedTrafficToken = %q, net/http reads %q\n%q", got, presented, raw)
		}
		if err := CheckTraffic(true, stored, false, &h); err != nil {
			t.Fatalf("a public route refused: %v", err)
		}
		var rej *Rejection
		err = CheckTraffic(false, stored, false, &h)
		switch {
		case stored == "":
			if !errors.As(err, &rej) || rej.Code != CodeTrafficTokenNotConfigured {
				t.Fatalf("a restricted route without a token: %v", err)
			}
			if err := CheckTraffic(false, stored, true, &h); err == nil {
				t.Fatal("a restricted route without a token let an exempt port through")
			}
			return
		case presented == "":
			if !errors.As(err, &rej) || rej.Code != CodeTrafficTokenMissing {
				t.Fatalf("no token presented: %v", err)
			}
		case presented == stored:
			if err != nil {
				t.Fatalf("the stored token %q was refused: %v", stored, err)
			}
		default:
			if !errors.As(err, &rej) || rej.Code != CodeTrafficTokenInvalid {
				t.Fatalf("token %q for stored %q: %v", presented, stored, err)
			}
		}
		if err := CheckTraffic(false, stored, true, &h); err != nil {
			t.Fatalf("an exempt port refused: %v", err)
		}
	})
}

// FuzzCheckAdminToken checks the startup check of admin_token against what
// a request can carry: a token it accepts is one that a Go client will
// send (httpguts, as net/http's Transport checks a value) and that, sent,
// the admin API takes (fasthttp reads the head, AdminAuthorized compares);
// a token it refuses for something other than an inner tab (which a header
// may carry, and the check refuses as almost surely a mistake) is one that
// no such request presents.
func FuzzCheckAdminToken(f *testing.F) {
	for _, s := range []string{"s3cret", "s3cret\n", " s3cret", "a b", "a\tb", "caf\xc3\xa9", "\x7f", "a\x00b", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		if token == "" {
			return
		}
		var h fasthttp.RequestHeader
		readOK := h.Read(bufio.NewReader(strings.NewReader("POST /admin/state HTTP/1.1\r\nHost: 127.0.0.1\r\n"+HeaderAdminToken+": "+token+"\r\n\r\n"))) == nil
		presentable := httpguts.ValidHeaderFieldValue(token) && readOK && AdminAuthorized([]byte(token), h.Peek(HeaderAdminToken))
		err := CheckAdminToken(token)
		if err == nil && !presentable {
			t.Fatalf("CheckAdminToken accepted %q, which no request presents (Go client sends it: %v; the admin API reads %q)",
				token, httpguts.ValidHeaderFieldValue(token), h.Peek(HeaderAdminToken))
		}
		if err != nil && presentable && !strings.Contains(token, "\t") {
			t.Fatalf("CheckAdminToken refused %q (%v), which a request presents", token, err)
		}
	})
}
