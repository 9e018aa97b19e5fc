package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A small answer (read whole, written by fasthttp after the handler) that
// the drain deadline cuts: its sandbox answered during the drain, to a
// client that takes none of it, and the deadline's cut of client writes
// (conns.cutWrites) ended fasthttp's write with most of it unsent. Earlier
// builds logged it as sent, 200 with no error_code, as they log every such
// answer when the handler returns; it is logged with error_code
// drain_timeout, as a stream the deadline cuts. One its client takes is
// logged as sent, once it is.
func TestDrainCutSmallAnswerLogged(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tls   bool
		reads bool // the client reads the answer
		code  string
	}{
		{"client takes none of it", false, false, CodeDrainTimeout},
		{"TLS client takes none of it", true, false, CodeDrainTimeout},
		{"client reads it", false, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const drain = 300 * time.Millisecond
			h, logs, _ := drainLogHarness(t, drain)
			body := strings.Repeat("x", 60<<10) // under wholeBody: read whole
			arrived, answer := make(chan struct{}), make(chan struct{})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				<-answer
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				_, _ = io.WriteString(w, body)
			}))
			host := h.route("drainwrite", port)
			// Small buffers both ways: the answer does not fit in them.
			ln := listenSmallSendBuffer(t, 4<<10)
			var c net.Conn = dialSmallWindow(t, ln.Addr().String())
			if tc.tls {
				ca := testenv.NewCA(t, "drain write CA")
				cert := ca.Certificate(t, "*.cube.test")
				go func() { _ = h.server.ServeTLS(ln, &tls.Config{Certificates: []tls.Certificate{cert}}) }()
				c = tls.Client(c, &tls.Config{RootCAs: ca.Pool(), ServerName: host})
			} else {
				go func() { _ = h.server.Serve(ln) }()
			}
			id := "drain-" + strings.ReplaceAll(tc.name, " ", "-")
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n\r\n", host, id)
			wait(t, arrived, "the request at the sandbox")

			shutdownDone := make(chan error, 1)
			go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
			testenv.WaitFor(t, 5*time.Second, "the drain to begin", h.proxy.draining.Load)
			read := make(chan int64, 1)
			if tc.reads {
				go func() {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						read <- -1
						return
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					read <- n
				}()
			}
			close(answer) // answered during the drain, read whole, then written
			drainEnds(t, shutdownDone, drain+10*time.Second, "Shutdown did not return")

			var got int64
			if tc.reads {
				if got = <-read; got != int64(len(body)) {
					t.Fatalf("a client reading got %d body bytes of %d", got, len(body))
				}
			} else {
				// What the client can still get: what the kernel holds.
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				got, _ = io.Copy(io.Discard, c)
				if got >= int64(len(body)) {
					t.Fatalf("the client got %d bytes, the whole answer: the case tests nothing", got)
				}
			}
			e := logs.waitJSON(t, id)
			if e["status"] != float64(200) || e["error_code"] != tc.code {
				t.Errorf("answer written during the drain, %d bytes of it received: logged status %v, error_code %q; want 200 %q",
					got, e["status"], e["error_code"], tc.code)
			}
		})
	}
}
