package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request a route change refuses for the credential it came with (403
// credential_revoked, while it waited for its answer or its 101) is an
// auth rejection, counted under its code as README's Observability says
// ("one of the 403 codes under Errors"): earlier builds counted it
// nowhere, so an alert on cubeproxy_auth_rejections_total missed every
// request a token rotation refused. A stream the change cuts after its
// head went out was answered, not refused: it counts in
// cubeproxy_streams_ended_total only.
func TestRevokedCredentialCountedAsAuthRejection(t *testing.T) {
	const id, host = "rvk", "8080-rvk.cube.test"
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	revoked := func() float64 {
		v, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_auth_rejections_total", map[string]string{"reason": CodeCredentialRevoked})
		return v
	}
	other := func() float64 {
		v, _ := metricValue(scrapeMetrics(t, admin), "cubeproxy_auth_rejections_total", map[string]string{"reason": "other"})
		return v
	}
	silent, arrived := silentBackend(t)
	b := newRJBackend(t)

	for _, tc := range []struct {
		name string
		head string // sent with token A to the silent sandbox
	}{
		{"request waiting for its answer", "GET / HTTP/1.1\r\n"},
		{"WebSocket waiting for its 101", "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			putRJ(t, h, id, rjFields(silent, "1", rjTokenA, ""))
			before, otherBefore := revoked(), other()
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, tc.head+"Host: "+host+"\r\n"+auth.HeaderE2BTrafficToken+": "+rjTokenA+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the request did not reach the sandbox")
			}
			putRJ(t, h, id, rjFields(silent, "1", rjTokenB, ""))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 403 {
				t.Fatalf("status %d, want 403 %s", resp.StatusCode, CodeCredentialRevoked)
			}
			testenv.Eventually(t, 5*time.Second, func() error {
				if got := revoked() - before; got != 1 {
					return fmt.Errorf("auth_rejections_total{reason=%q} moved by %v, want 1", CodeCredentialRevoked, got)
				}
				return nil
			})
			if got := other() - otherBefore; got != 0 {
				t.Errorf(`auth_rejections_total{reason="other"} moved by %v, want 0`, got)
			}
		})
	}

	t.Run("event stream cut after its head", func(t *testing.T) {
		putRJ(t, h, id, rjFields(b.port, "1", rjTokenA, ""))
		before := revoked()
		s := openRJStream(t, h, host, "stream", rjCreds{token: rjTokenA})
		putRJ(t, h, id, rjFields(b.port, "1", rjTokenB, ""))
		s.cut(t)
		rereadsDone(t, h, id)
		testenv.WaitFor(t, 5*time.Second, "the cut stream to end", func() bool {
			st, tn := h.proxy.streams.open()
			return st == 0 && tn == 0
		})
		if got := revoked() - before; got != 0 {
			t.Errorf("auth_rejections_total{reason=%q} moved by %v for a stream answered 200, want 0", CodeCredentialRevoked, got)
		}
	})
}
