package proxy

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At log_level debug, fasthttp's message for a request it cannot parse
// goes to the process log, and the README promises that token values never
// appear in logs. SecureErrorLogMessage keeps the raw head out of most of
// those messages, but fasthttp still quotes the request line it found no
// version in, a target it refused and a header line without a colon,
// whatever credential they carry: a client's cube_token or traffic token,
// the admin token on the admin listener.
func TestFasthttpDebugLogQuotesNoCredential(t *testing.T) {
	var logs testenv.LogBuffer
	adminTok := "adm-" + authRandomHex(t, 24)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.token = adminTok
	})
	traffic := authRandomHex(t, 32)
	signed := "sig" + authRandomHex(t, 16)
	secrets := []string{adminTok, traffic, signed}
	host := "Host: 8080-box.cube.test\r\n"
	cases := []struct{ name, addr, raw string }{
		{"request line without a version", h.addr, "GET /mcp?cube_token=" + signed + "\r\n" + host + "\r\n"},
		{"target fasthttp refuses", h.addr, "GET mcp?cube_token=" + signed + " HTTP/1.1\r\n" + host + "\r\n"},
		{"target with a control byte", h.addr, "GET /mcp?cube_token=" + signed + "\x01 HTTP/1.1\r\n" + host + "\r\n"},
		{"traffic token on a line without a colon", h.addr, "GET /mcp HTTP/1.1\r\n" + host +
			auth.HeaderE2BTrafficToken + " " + traffic + "\r\n\r\n"},
		{"admin token on a line without a colon", h.admin, "GET /admin/routes HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
			auth.HeaderAdminToken + " " + adminTok + "\r\n\r\n"},
	}
	for _, tc := range cases {
		if st := rawStatus(t, tc.addr, tc.raw); st != 400 {
			t.Errorf("%s: %d, want 400", tc.name, st)
		}
	}
	// fasthttp logs once it has closed the connection, after the answer.
	testenv.WaitFor(t, 5*time.Second, "fasthttp's debug line for every refused request", func() bool {
		return testenv.CountLines(logs.String(), `"component":"fasthttp"`, "request headers") >= len(cases)
	})
	got := logs.String()
	for _, s := range secrets {
		if strings.Contains(got, s) {
			t.Errorf("the debug log holds the credential %q", s)
		}
	}
	if t.Failed() {
		t.Logf("the debug log:\n%s", got)
	}
}
