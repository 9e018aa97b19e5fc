package proxy

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A request that found the sandbox paused just before the resume call in
// flight ended, and reaches the resumer just after, makes no second call:
// the call it would have joined has marked the sandbox running, and the
// request is served. Earlier builds made a call of their own (one wave of
// requests, two calls to the lifecycle manager, for a sandbox already
// running). The hook holds the second request between its look at the
// state and the resumer until the first request's answer is read.
func TestResumeNoSecondCallAfterTheWave(t *testing.T) {
	release := make(chan struct{})
	called := make(chan struct{}, 4)
	sc := newFakeSidecar(t, func() int {
		called <- struct{}{}
		<-release
		return 200
	})
	h, host, admin := resumeMetrics(t, sc, 0)
	held := make(chan struct{}, 1)
	letGo := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-letGo:
		default:
			close(letGo)
		}
		select {
		case <-release:
		default:
			close(release)
		}
	})
	var arrived atomic.Int32
	h.proxy.resumer.beforeResume = func() {
		if arrived.Add(1) == 2 {
			held <- struct{}{}
			<-letGo
		}
	}
	h.setSandboxState("sleepy", "paused")
	before := scrapeMetrics(t, admin)

	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			resp, err := h.client.Do(h.req("GET", host, "/", nil))
			if err != nil {
				answers <- answer{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, string(b)}
		}()
	}
	testenv.Recv(t, called, 10*time.Second, "the first request's resume call")
	testenv.Recv(t, held, 10*time.Second, "the second request at the resumer")
	close(release)
	// Only the first request can answer: the second is held.
	if a := testenv.Recv(t, answers, 10*time.Second, "the first answer"); a.status != 200 {
		t.Fatalf("the request that made the call: %d %s, want 200", a.status, a.body)
	}
	close(letGo)
	if a := testenv.Recv(t, answers, 10*time.Second, "the second answer"); a.status != 200 {
		t.Fatalf("the request that came at the call's end: %d %s, want 200", a.status, a.body)
	}
	if n := len(sc.seen()); n != 1 {
		t.Errorf("%d resume calls for one wave of requests, want 1: the sandbox was running when the second came", n)
	}
	checkResumes(t, admin, before, 1, 0)
}
