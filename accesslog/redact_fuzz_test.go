package accesslog

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzRedaction checks, for any request target, that no signed token the
// proxy could read from it reaches a log line: the line's request_uri and
// args, decoded from the JSON or cube format and parsed as fasthttp parses
// the query the proxy reads the token from (QueryArgs), carry no value but
// REDACTED under a name a lenient parser reads as cube_token, nor does the request_uri's fragment, and its userinfo
// is REDACTED whole.
func FuzzRedaction(f *testing.F) {
	for _, s := range []string{"/p?cube_token=secret", "/p?a=1&cube%5Ftoken=s&b", "/p?CUBE_TOKEN=s;x=1", "/?cube_token",
		"http://h/p?x&cube_token=a&cube_token=b", "/p?%63ube_token=s#frag", "/p?cube_token=s|x||y\n", "/p?cube+token=s",
		"/p#cube_token=s", "/p?a#b&cube_token=s", "http://u:pw@h/p", "http://a@b@h?cube_token=s#cube_token=t",
		"/p?cube_token+=s", "/p?%20Cube.Token%09=s&cube_token%5B%5D=t", "/p?cube_token[x]=s#cube+token=t",
		"/p?cube_token%00x=s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		e := &Entry{Time: testTime, RequestURI: uri, URI: uri}
		if path, args, ok := strings.Cut(uri, "?"); ok {
			e.URI, e.Args = path, args
		}
		var j struct {
			RequestURI string `json:"request_uri"`
			Args       string `json:"args"`
		}
		line := appendJSON(nil, e, testTime, newStamps(jsonTime))
		if err := json.Unmarshal(line, &j); err != nil {
			t.Fatalf("invalid JSON for %q: %v", uri, err)
		}
		fields := strings.Split(cubeLine(e), cubeSep)
		for format, logged := range map[string][2]string{
			"json": {j.RequestURI, j.Args},
			"cube": {unescapeCube(fields[7]), unescapeCube(fields[8])},
		} {
			var u fasthttp.URI
			if err := u.Parse(nil, []byte(logged[0])); err == nil {
				checkRedacted(t, format+" request_uri", uri, logged[0], u.QueryArgs())
				var frag fasthttp.Args
				frag.ParseBytes(u.Hash())
				checkRedacted(t, format+" request_uri's fragment", uri, logged[0], &frag)
				if ui := string(u.Username()) + string(u.Password()); ui != "" && ui != redacted {
					t.Fatalf("%s request_uri of %q logged as %q: userinfo %q", format, uri, logged[0], ui)
				}
			}
			var a fasthttp.Args
			a.Parse(logged[1])
			checkRedacted(t, format+" args", uri, logged[1], &a)
		}
		// And nothing but secrets is lost: each field is what was sent
		// (as the format's escaping gives it back) with some spans
		// replaced by REDACTED, so a redaction that eats a neighbouring
		// parameter, or garbles the rest, fails here.
		for _, c := range []struct{ what, sent, logged string }{
			{"json request_uri", jsonRoundTrip(t, uri), j.RequestURI},
			{"json args", jsonRoundTrip(t, e.Args), j.Args},
			{"cube request_uri", uri, unescapeCube(fields[7])},
			{"cube args", e.Args, unescapeCube(fields[8])},
		} {
			if c.sent == "-" {
				continue // the cube format's empty field
			}
			checkKept(t, c.what, c.sent, c.logged)
		}
	})
}

// jsonRoundTrip is s as encoding/json writes and reads it back: invalid
// UTF-8 becomes U+FFFD, as in the access log's JSON lines.
func jsonRoundTrip(t *testing.T, s string) string {
	t.Helper()
	ref, _ := json.Marshal(s)
	var back string
	if err := json.Unmarshal(ref, &back); err != nil {
		t.Fatal(err)
	}
	return back
}

// checkKept fails unless logged is sent with zero or more of its spans
// (possibly empty) each replaced by REDACTED (keptFrom).
func checkKept(t *testing.T, what, sent, logged string) {
	t.Helper()
	if !keptFrom(sent, logged) {
		t.Fatalf("%s: %q logged as %q, which is not it with spans redacted", what, sent, logged)
	}
}

// keptFrom reports whether logged is sent with zero or more of its spans
// (possibly empty) each replaced by REDACTED. The pieces of logged between
// REDACTEDs are matched in order, each at its leftmost place after the
// last, which leaves the most room for the rest; the first must start
// sent and the last end it.
func keptFrom(sent, logged string) bool {
	pieces := strings.Split(logged, redacted)
	at := 0
	for i, p := range pieces {
		rest, ok := sent[at:], false
		switch {
		case len(pieces) == 1:
			ok = rest == p
		case i == 0:
			ok = strings.HasPrefix(rest, p)
		case i == len(pieces)-1:
			ok = strings.HasSuffix(rest, p)
		default:
			j := strings.Index(rest, p)
			ok, at = j >= 0, at+j
		}
		if !ok {
			return false
		}
		at += len(p)
	}
	return true
}

func checkRedacted(t *testing.T, what, uri, logged string, a *fasthttp.Args) {
	t.Helper()
	for k, v := range a.All() {
		if len(v) > 0 && string(v) != redacted && lenientTokenName(string(k)) {
			t.Fatalf("%s of %q logged as %q: %q (cube_token to a lenient parser) %q", what, uri, logged, k, v)
		}
	}
}

// lenientTokenName reports whether a decoded parameter name is cube_token
// to some parser a sandbox may run: in any case, trimmed of whitespace,
// with ' ' or '.' for '_' (PHP), with an array suffix ("cube_token[0]"), or
// with anything after a NUL (PHP reads a name as a C string).
func lenientTokenName(k string) bool {
	const ws = " \t\n\v\f\r"
	k = strings.TrimLeft(k, ws)
	if len(k) < len("cube_token") {
		return false
	}
	name := strings.Map(func(r rune) rune {
		if r == ' ' || r == '.' {
			return '_'
		}
		return r
	}, k[:len("cube_token")])
	rest := strings.TrimLeft(k[len("cube_token"):], ws)
	// A '#', ';' or '?' in the suffix ("cube_token[#]", a fragment's
	// name to fasthttp) ends the name where the redaction splits: no
	// parser the proxy knows files that under cube_token.
	return strings.EqualFold(name, "cube_token") && (rest == "" || (rest[0] == '[' || rest[0] == 0) && !strings.ContainsAny(rest, "#;?"))
}

// unescapeCube undoes appendCubeEscaped ("-" is an empty field).
func unescapeCube(s string) string {
	if s == "-" {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if n, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
