package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A request waiting on a resume call to the lifecycle manager at the drain
// deadline is cut then, as one waiting on its sandbox is: 504
// drain_timeout, logged before Shutdown returns. The call ran to its own
// timeout (2 s to connect and lifecycle.resume_timeout, 30 s, more), past
// the deadline and the unwind, and the process exited under the request,
// unanswered and unlogged; the requests that joined the call with it too.
func TestDrainCutsRequestWaitingOnAResume(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	called := make(chan struct{}, 1)
	sc := newFakeSidecar(t, func() int {
		called <- struct{}{}
		<-hang
		return 200
	})
	const drain = 300 * time.Millisecond
	h, buf, al := drainLogHarness(t, drain, func(o *harnessOpts) {
		o.cfg.ResumeAddr = sc.addr
		o.cfg.ResumeTimeout = time.Minute
	})
	port := backend(t, "127.0.0.1", http.NotFoundHandler())
	host := h.route("sleepy", port)
	h.setSandboxState("sleepy", "paused")
	joined := make(chan struct{}, 1)
	h.proxy.resumer.beforeWait = func() { joined <- struct{}{} }
	dial := func(id string) net.Conn {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n\r\n", host, id)
		return c
	}
	c := dial("resume-cut")
	select {
	case <-called:
	case <-time.After(5 * time.Second):
		t.Fatal("no resume call")
	}
	// A second request waits for the same call.
	c2 := dial("resume-joined")
	select {
	case <-joined:
	case <-time.After(5 * time.Second):
		t.Fatal("the second request never joined the call")
	}
	wantDrainCut(t, h, c, "GET", "resume-cut", drain, buf, al)
	_ = c2.SetReadDeadline(time.Now().Add(time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != 504 {
		t.Fatalf("the request that joined the call: %v %v, want 504", resp, err)
	}
	if !strings.Contains(buf.String(), `"x_cube_request_id":"resume-joined"`) {
		t.Error("the request that joined the call was not logged")
	}
}
