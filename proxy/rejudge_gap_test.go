package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A WebSocket whose upgrade was judged, and whose route changes after its
// sandbox connection left the pool's busy list for the tunnel's (splice)
// but before the tunnel was listed there, is judged as it is listed: the
// change's walk found it on neither list. Opened with the rotated token,
// it is cut (credential_revoked), not left relaying until the janitor's
// next look.
func TestRouteChangeDuringTunnelHandOffIsJudged(t *testing.T) {
	const host = "8080-rh.cube.test"
	// The janitor's look (rejudgeOpen) comes each 30 s here, after the
	// waits below: what they see cut is the change's own doing.
	h, logs := logHarness(t, "json", func(o *harnessOpts) { o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute })
	b := newRJBackend(t)
	putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenA, ""))
	var changed atomic.Bool
	h.proxy.afterHandOff = func() {
		if changed.CompareAndSwap(false, true) {
			putRJ(t, h, "rh", rjFields(b.port, "1", rjTokenB, ""))
			rereadsDone(t, h, "rh")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+h.addr+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: rjCreds{token: rjTokenA}.header()})
	if !changed.Load() {
		t.Fatalf("the upgrade did not reach its hand-off (%v): the case tests nothing", err)
	}
	if err == nil {
		// The 101 may have gone out before the cut: the tunnel is cut.
		defer ws.CloseNow()
		wsCut(t, ws, "WebSocket across the change")
	}
	testenv.WaitFor(t, 10*time.Second, "the access log line with error_code "+CodeCredentialRevoked, func() bool {
		return strings.Contains(logs.String(), `"error_code":"`+CodeCredentialRevoked+`"`)
	})
}
