package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// A refusal an attacker can drive at will (no credential, a wrong traffic
// token, a forged or stale sandbox cookie or link) costs no allocation:
// the 403's code and reason are fixed per kind of refusal, so a flood of
// them adds nothing for the garbage collector to do. Measured through the
// whole request path (client, proxy), as TestInstrumentationAddsNoAllocs.
func TestAuthRefusalAllocs(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts; run without -race")
	}
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	signer, sign := authSigner(t, strings.Repeat("k", 32))
	ms := routing.NewMemoryStore()
	r, err := routing.ParseRouteStrict("box", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": "1",
		"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Put(r); err != nil {
		t.Fatal(err)
	}
	client, req, resp := inmemoryProxy(t, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Signer: signer}, ms)

	other := sign("other", 8080, time.Hour) // valid, for another sandbox
	mine := sign("box", 8080, time.Hour)
	rotated := signer.CookieValue([]byte(mine), strings.Repeat("f", 64)) // bound to an old traffic token
	for _, tc := range []struct {
		name, query, header, value, code string
	}{
		{"no credential", "", "", "", auth.CodeTrafficTokenMissing},
		{"wrong traffic token", "", auth.HeaderE2BTrafficToken, strings.Repeat("0", 64), auth.CodeTrafficTokenInvalid},
		{"malformed cookie", "", "Cookie", auth.CookieName + "=garbage", auth.CodeSignedTokenMalformed},
		{"cookie for another sandbox", "", "Cookie", auth.CookieName + "=" + signer.CookieValue([]byte(other), traffic), ""},
		{"cookie of a rotated traffic token", "", "Cookie", auth.CookieName + "=" + rotated, auth.CodeSignedTokenInvalid},
		{"link for another sandbox", "?" + auth.QueryParamName + "=" + other, "", "", ""},
		{"malformed link", "?" + auth.QueryParamName + "=x", "", "", auth.CodeSignedTokenMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uri, code := "http://8080-box.cube.test/"+tc.query, []byte(tc.code)
			do := func() {
				req.Reset()
				req.SetRequestURI(uri)
				if tc.header != "" {
					req.Header.Set(tc.header, tc.value)
				}
				if err := client.Do(req, resp); err != nil {
					panic(fmt.Sprintf("request through proxy: %v", err))
				}
				if resp.StatusCode() != 403 || !bytes.Contains(resp.Body(), code) {
					panic(fmt.Sprintf("%s: %d %q, want 403 %s", tc.name, resp.StatusCode(), resp.Body(), tc.code))
				}
			}
			for range 100 { // warm pools, route cache and the connection
				do()
			}
			if n := testing.AllocsPerRun(2000, do); n != 0 {
				t.Errorf("a refusal allocates %v times per request, want 0", n)
			}
		})
	}
}
