package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An "Expect: 100-continue" client sends its body only once the 100 came,
// and the proxy sends the 100 only once it has judged the head, which may
// wait on the proxy's side: a paused sandbox's resume (up to
// lifecycle.resume_timeout), a slot over max_streams_per_sandbox (up to
// stream_limit_wait). fasthttp arms client.body_timeout for the body's
// first 8 KiB as the head arrives, so that wait was counted against the
// client: one whose sandbox took longer to resume than its body timeout
// sent its body at once after the 100 and got 408 request_timeout, and
// one whose sandbox took most of it had what was left. nginx sends the
// 100 as it starts to read the body, and client_body_timeout runs from
// there. The timeout now runs from the 100: here the resume takes three
// body timeouts, and the body sent at once after the 100 is served.
func TestExpectContinueBodyTimeoutRunsFromTheContinue(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 500 * time.Millisecond
	called := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	releaseOnce := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseOnce)
	sc := newFakeSidecar(t, func() int {
		called <- struct{}{}
		<-release
		return 200
	})
	h, host := resumeHarness(t, sc, 30*time.Second, func(o *harnessOpts) { o.srv.ClientBodyTimeout = bodyTimeout })
	h.setSandboxState("sleepy", "paused")

	c := dialRaw(t, h.addr)
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(c, "POST /run HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", host); err != nil {
		t.Fatal(err)
	}
	testenv.Recv(t, called, 10*time.Second, "the resume call for the Expect head")
	// The lifecycle manager takes longer than the client's body timeout.
	time.Sleep(3 * bodyTimeout)
	releaseOnce()

	br := bufio.NewReader(c)
	cont, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the 100: %v", err)
	}
	if cont.StatusCode != http.StatusContinue {
		t.Fatalf("got %d before the body, want 100", cont.StatusCode)
	}
	if _, err := io.WriteString(c, "hello"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "up" {
		t.Fatalf("body sent at once after the 100: got %d %q, want the sandbox's 200 (the proxy's resume wait counted against client.body_timeout)", resp.StatusCode, body)
	}
}
