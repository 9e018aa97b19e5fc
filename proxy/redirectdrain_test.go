package proxy

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An upload to the redirect listener that arrives during the drain gets
// its 308 with a lingering close the drain waits for, as a traffic
// listener's refusal does: the drain, finding nothing open on the traffic
// listeners, ended at once, and Shutdown closed the connection over the
// rest of the body, a reset; a client that reads only once its body is
// sent (Python's requests) got a broken pipe instead of the redirect.
func TestDrainWaitsForARedirectsLinger(t *testing.T) {
	t.Parallel() // each case waits 1.5 s on its own paced upload
	for _, tc := range []struct {
		name, expect string
		late         bool // the hijack handler waits: the drain must count it from the handler
	}{
		{"body over the redirect listener's buffer", "", false},
		{"Expect head, body sent without waiting", "Expect: 100-continue\r\n", false},
		{"Expect head, hijack handler late", "Expect: 100-continue\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 20 * time.Second })
			hooked, proceed := make(chan struct{}), make(chan struct{})
			if tc.late {
				h.proxy.beforeRefusalLingers = func() {
					close(hooked)
					<-proceed
				}
			}
			ln := listen(t, "127.0.0.1:0")
			go h.server.ServeRedirect(ln, "8443")
			bothServing(t, h, ln.Addr().String())
			// Connected before the drain, its request sent after the
			// listeners closed.
			c := dialRaw(t, ln.Addr().String())
			shut := make(chan error, 1)
			go func() { shut <- h.server.Shutdown(context.Background()) }()
			h.waitListenerClosed(5 * time.Second)
			const size = 2 << 20
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nContent-Length: %d\r\n%s\r\n", size, tc.expect)
			if tc.late {
				select {
				case <-hooked:
				case <-time.After(5 * time.Second):
					t.Fatal("the redirect's hijack handler never ran")
				}
				// fasthttp's own wait looks every 100 ms.
				select {
				case err := <-shut:
					close(proceed)
					t.Fatalf("the drain ended (%v) with a redirect about to linger", err)
				case <-time.After(500 * time.Millisecond):
				}
				close(proceed)
			}
			piece := make([]byte, 64<<10)
			// Past the second the drain gives the redirect listener.
			pause := 1500 * time.Millisecond / time.Duration(size/len(piece))
			for sent := 0; sent < size; sent += len(piece) {
				if _, err := c.Write(piece); err != nil {
					t.Fatalf("the body during the drain, at %d of %d bytes: %v", sent, size, err)
				}
				time.Sleep(pause)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 308 {
				t.Fatalf("the answer after the body: %v %v, want 308", resp, err)
			}
			drainGoesOn(t, shut, "the drain ended before the lingering client closed")
			c.Close()
			drainEnds(t, shut, 10*time.Second, "the drain did not end after the lingering client closed")
		})
	}
}

// A redirect's lingering close still open at the drain deadline is cut
// then, and the process log says so, as for the traffic listeners'.
func TestDrainDeadlineCutsARedirectsLinger(t *testing.T) {
	const drain = 500 * time.Millisecond
	logs := new(obsLogBuf)
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.DrainTimeout = drain
		o.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	ln := listen(t, "127.0.0.1:0")
	go h.server.ServeRedirect(ln, "8443")
	bothServing(t, h, ln.Addr().String())
	c := dialRaw(t, ln.Addr().String())
	start := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(context.Background()) }()
	h.waitListenerClosed(5 * time.Second)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: 50005-box.cube.test\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 308 {
		t.Fatalf("%v %v, want 308", resp, err)
	}
	// The client sends nothing more and stays: the linger waits for it.
	drainEnds(t, shut, drain+5*time.Second, "Shutdown did not return")
	if d := time.Since(start); d < drain-50*time.Millisecond {
		t.Errorf("Shutdown returned %v after the drain began, before its %v deadline", d, drain)
	}
	if out := logs.String(); !strings.Contains(out, "drain deadline reached") || !strings.Contains(out, `"lingering":1`) {
		t.Errorf("no warning naming the lingering close the deadline cut:\n%s", out)
	}
}

// bothServing waits until h's traffic listener and the redirect listener
// at addr answer: a Shutdown before a server's Serve has begun finds no
// listener of its to close, and that server then serves on.
func bothServing(t *testing.T, h *harness, addr string) {
	t.Helper()
	if code, _, _ := h.get("8080-nobox.cube.test", "/"); code != 404 {
		t.Fatalf("traffic listener: %d", code)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 308 {
		t.Fatalf("redirect listener: %d", resp.StatusCode)
	}
}
