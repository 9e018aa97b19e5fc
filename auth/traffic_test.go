package auth

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// wireHeader parses header lines exactly as the proxy's fasthttp server
// would receive them, so case folding, whitespace and duplicates behave as
// in production.
func wireHeader(t testing.TB, lines ...string) *fasthttp.RequestHeader {
	t.Helper()
	raw := "GET / HTTP/1.1\r\nHost: 8080-sbx.example.test\r\n"
	for _, l := range lines {
		raw += l + "\r\n"
	}
	raw += "\r\n"
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parse header: %v", err)
	}
	return &h
}

func TestCheckTraffic(t *testing.T) {
	wrong := testToken[:63] + "0" // right length, last byte differs
	if wrong == testToken {
		t.Fatal("test token must not end in 0")
	}
	tests := []struct {
		name   string
		public bool
		stored string
		exempt bool
		lines  []string
		want   string // "" = allowed, else rejection code
	}{
		{"public no header", true, testToken, false, nil, ""},
		{"public wrong token ignored", true, testToken, false, []string{"e2b-traffic-access-token: " + wrong}, ""},
		{"public right token", true, testToken, false, []string{"cube-traffic-access-token: " + testToken}, ""},
		{"public without stored token", true, "", false, nil, ""},
		{"e2b lower case", false, testToken, false, []string{"e2b-traffic-access-token: " + testToken}, ""},
		{"e2b upper case", false, testToken, false, []string{"E2B-TRAFFIC-ACCESS-TOKEN: " + testToken}, ""},
		{"cube mixed case", false, testToken, false, []string{"Cube-Traffic-ACCESS-token: " + testToken}, ""},
		{"missing", false, testToken, false, nil, CodeTrafficTokenMissing},
		{"other credentials are not read", false, testToken, false,
			[]string{"Authorization: Bearer " + testToken, "X-Access-Token: " + testToken, "Cookie: cube_proxy_auth=" + testToken},
			CodeTrafficTokenMissing},
		{"e2b empty counts as missing", false, testToken, false, []string{"e2b-traffic-access-token:"}, CodeTrafficTokenMissing},
		{"e2b empty falls back to cube", false, testToken, false,
			[]string{"e2b-traffic-access-token: ", "cube-traffic-access-token: " + testToken}, ""},
		{"both empty", false, testToken, false,
			[]string{"e2b-traffic-access-token:", "cube-traffic-access-token:"}, CodeTrafficTokenMissing},
		{"both present e2b right cube wrong", false, testToken, false,
			[]string{"cube-traffic-access-token: " + wrong, "e2b-traffic-access-token: " + testToken}, ""},
		{"both present e2b wrong cube right: first spelling wins", false, testToken, false,
			[]string{"cube-traffic-access-token: " + testToken, "e2b-traffic-access-token: " + wrong}, CodeTrafficTokenInvalid},
		{"right length wrong", false, testToken, false, []string{"e2b-traffic-access-token: " + wrong}, CodeTrafficTokenInvalid},
		{"prefix", false, testToken, false, []string{"e2b-traffic-access-token: " + testToken[:63]}, CodeTrafficTokenInvalid},
		{"extra byte", false, testToken, false, []string{"e2b-traffic-access-token: " + testToken + "0"}, CodeTrafficTokenInvalid},
		{"case of hex matters", false, testToken, false,
			[]string{"e2b-traffic-access-token: " + strings.ToUpper(testToken)}, CodeTrafficTokenInvalid},
		// RFC 9110 optional whitespace around a field value is not part of
		// the value; fasthttp drops it while parsing, so this is the exact token.
		{"surrounding spaces on the wire", false, testToken, false,
			[]string{"e2b-traffic-access-token:    " + testToken + "   "}, ""},
		{"surrounding tabs on the wire", false, testToken, false,
			[]string{"e2b-traffic-access-token:\t" + testToken + "\t"}, ""},
		{"inner space", false, testToken, false,
			[]string{"e2b-traffic-access-token: " + testToken[:32] + " " + testToken[32:]}, CodeTrafficTokenInvalid},
		// fasthttp's Peek returns the first occurrence of a repeated header;
		// that is the value checked (and Del removes every occurrence).
		{"duplicated header first right", false, testToken, false,
			[]string{"e2b-traffic-access-token: " + testToken, "e2b-traffic-access-token: " + wrong}, ""},
		{"duplicated header first wrong", false, testToken, false,
			[]string{"e2b-traffic-access-token: " + wrong, "e2b-traffic-access-token: " + testToken}, CodeTrafficTokenInvalid},
		{"no stored token refused", false, "", false, []string{"e2b-traffic-access-token: " + testToken}, CodeTrafficTokenNotConfigured},
		{"no stored token refused without header", false, "", false, nil, CodeTrafficTokenNotConfigured},
		{"no stored token refused on exempt port", false, "", true, nil, CodeTrafficTokenNotConfigured},
		{"exempt port needs no token", false, testToken, true, nil, ""},
		{"exempt port ignores wrong token", false, testToken, true, []string{"e2b-traffic-access-token: " + wrong}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckTraffic(tt.public, tt.stored, tt.exempt, wireHeader(t, tt.lines...))
			assertRejection(t, err, tt.want, testToken, wrong)
		})
	}
}

// TestCheckTrafficValueNotTrimmed shows that the check itself trims nothing:
// whitespace that survives parsing (or is set programmatically) is part of
// the presented token.
func TestCheckTrafficValueNotTrimmed(t *testing.T) {
	for _, v := range []string{" " + testToken, testToken + " ", " " + testToken + " ", "\t" + testToken} {
		var h fasthttp.RequestHeader
		h.Set(HeaderE2BTrafficToken, v)
		assertRejection(t, CheckTraffic(false, testToken, false, &h), CodeTrafficTokenInvalid, testToken)
	}
}

func assertRejection(t *testing.T, err error, wantCode string, secrets ...string) {
	t.Helper()
	if wantCode == "" {
		if err != nil {
			t.Fatalf("want allowed, got %v", err)
		}
		return
	}
	var r *Rejection
	if !errors.As(err, &r) {
		t.Fatalf("want *Rejection %s, got %v", wantCode, err)
	}
	if r.Code != wantCode {
		t.Fatalf("code = %s, want %s", r.Code, wantCode)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(err.Error(), s) {
			t.Fatalf("rejection %q contains a token value", err.Error())
		}
	}
}

func TestCheckTrafficAllocs(t *testing.T) {
	tests := []struct {
		name   string
		public bool
		line   string
	}{
		{"e2b", false, "e2b-traffic-access-token: " + testToken},
		{"cube", false, "cube-traffic-access-token: " + testToken},
		{"public", true, "e2b-traffic-access-token: x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := wireHeader(t, tt.line)
			allocs := testing.AllocsPerRun(1000, func() {
				if err := CheckTraffic(tt.public, testToken, false, h); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("%v allocations on the success path, want 0", allocs)
			}
		})
	}
}

func TestSameTrafficToken(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"", "", true},
		{"tok", "tok", true},
		{"tok", "", false},
		{"", "tok", false},
		{"tok", "toK", false},
		{"tok", "tok2", false},
	} {
		if got := SameTrafficToken(tc.a, tc.b); got != tc.want {
			t.Errorf("SameTrafficToken(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
