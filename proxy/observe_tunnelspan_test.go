package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A WebSocket tunnel's upstream span ends as an HTTP stream's does: an
// error, typed by the proxy's code, when the sandbox reset the tunnel, the
// idle timeout, a kill or the drain deadline ended it; no error when
// either side closed it or the client left. The server span was an error
// in those cases, but the upstream span of a tunnel never was, so a trace
// of a sandbox crashing under its WebSockets showed the sandbox's exchange
// as fine.
func TestTunnelUpstreamSpanOutcome(t *testing.T) {
	t.Parallel()
	sandboxCloses := func(_ *testing.T, c streamEndCtl) { _ = c.sandbox.Close() }
	cases := []struct {
		name    string
		opts    func(*harnessOpts)
		act     func(*testing.T, streamEndCtl)
		errType string // the upstream span's error.type; "" for no error
	}{
		{name: "sandbox resets", act: resetSandbox, errType: CodeUpstreamReset},
		{name: "idle timeout", opts: shortIdle, act: leaveAlone, errType: CodeUpstreamTimeout},
		{name: "killed", act: killSandbox, errType: CodeSandboxKilled},
		{name: "drain deadline", opts: shortDrain, act: drainNow, errType: CodeDrainTimeout},
		{name: "sandbox closes", act: sandboxCloses},
		{name: "client closes", act: hangUpClient},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tel := obsTelemetry(t, exp)
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.Telemetry = tel
				if tc.opts != nil {
					tc.opts(o)
				}
			})
			sandbox := make(chan net.Conn, 1)
			b := newScriptBackend(t, func(c net.Conn, _ *http.Request, _ int) bool {
				rawWrite(c, switchedHead)
				sandbox <- c
				_, _ = io.Copy(io.Discard, c) // until the proxy (or the row) closes it
				return false
			})
			ctl := streamEndCtl{h: h, id: fmt.Sprintf("sbxtunnelspan%d", i)}
			host := h.route(ctl.id, b.port)
			ctl.client = dialRaw(t, h.addr)
			br := bufio.NewReader(ctl.client)
			fmt.Fprintf(ctl.client, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
				t.Fatalf("upgrade: %v %v", resp, err)
			}
			if _, err := io.ReadFull(br, make([]byte, 2)); err != nil {
				t.Fatalf("the tunnel's first bytes: %v", err)
			}
			ctl.sandbox = <-sandbox
			tc.act(t, ctl)
			_, _ = io.Copy(io.Discard, br) // to the tunnel's end (at once for a closed client)

			server, client := waitSandboxSpans(t, exp, ctl.id)
			if got := attrOf(server, "cube.error.code"); got != tc.errType {
				t.Fatalf("server span's cube.error.code %q, want %q: the row did not end the tunnel as meant", got, tc.errType)
			}
			got := attrOf(client, "error.type")
			switch {
			case tc.errType == "" && (client.Status.Code == codes.Error || got != ""):
				t.Errorf("upstream span %v %q, error.type %q: want no error", client.Status.Code, client.Status.Description, got)
			case tc.errType != "" && (client.Status.Code != codes.Error || got != tc.errType):
				t.Errorf("upstream span %v %q, error.type %q: want an error of type %q", client.Status.Code, client.Status.Description, got, tc.errType)
			}
			if s := attrOf(client, "http.response.status_code"); s != "101" {
				t.Errorf("upstream span's status %q, want the sandbox's 101", s)
			}
		})
	}
}
