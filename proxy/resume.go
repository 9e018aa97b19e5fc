package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// resumeConnectTimeout bounds the connect to the lifecycle manager, as the
// platform's proxy_connect_timeout for /_sidecar_resume.
const resumeConnectTimeout = 2 * time.Second

// resumeBodyWait bounds the read of the lifecycle manager's answer's body,
// which only keeps the connection: the status is the outcome.
const resumeBodyWait = 100 * time.Millisecond

// errResumeFailed answers a request for a paused sandbox that the
// lifecycle manager did not resume. Retry-After 5, as the platform's.
var errResumeFailed = proxyError{status: 503, code: CodeResumeFailed, msg: "sandbox is paused and could not be resumed; retry", retryAfter: 5}

// resumer asks the lifecycle manager (the platform's sidecar) to resume a
// paused sandbox: POST /internal/resume?sandbox_id=&request_id=, empty
// body. Concurrent requests for one sandbox share one call. It uses
// net/http: a resume is rare and slow (a VM restore), off the hot path.
type resumer struct {
	base    string // "http://<addr>/internal/resume"
	timeout time.Duration
	client  *http.Client

	mu    sync.Mutex
	calls map[string]*resumeCall // in flight, by sandbox id

	// stop ends every call in flight, and fails every later one at once,
	// once abort cancels it at the drain deadline: a call runs to its own
	// timeout (2 s and resume_timeout), past the drain's end, and the
	// process exited under the requests waiting on it, unanswered and
	// unlogged.
	stop  context.Context
	abort context.CancelFunc

	// beforeWait, for tests, runs when a request joins a call in flight;
	// nil in production.
	beforeWait func()
	// beforeResume, for tests, runs as a request comes to resume, between
	// its look at the sandbox's state and the lock; nil in production.
	beforeResume func()
}

// errResumeKilled is a resume call a kill of its sandbox cut
// (resumer.kill): the lifecycle manager is not to blame, and the requests
// that waited on it get the kill's 410.
var errResumeKilled = errors.New("sandbox killed during its resume call")

// resumeCall is one call in flight; err is set before done is closed.
// cancel ends the call (resumer.kill); killed says a kill did.
type resumeCall struct {
	done   chan struct{}
	err    error
	ctx    context.Context
	cancel context.CancelFunc
	killed atomic.Bool
}

func newResumer(addr string, timeout time.Duration) *resumer {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: resumeConnectTimeout}).DialContext,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	r := &resumer{
		base:    "http://" + addr + "/internal/resume",
		timeout: timeout,
		// A redirect is an answer other than 200, a failure, as nginx,
		// which follows none, took it: followed, a 302 to a page that
		// answers 200 counted a sandbox still paused as resumed.
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		calls: map[string]*resumeCall{},
	}
	r.stop, r.abort = context.WithCancel(context.Background())
	return r
}

// resume asks for id to be resumed, or waits for the call already asking,
// and returns its outcome. done runs once, by the caller that made the
// call, with its outcome, before any waiter returns: there the sandbox is
// marked running, so that a request arriving after the call finds it so
// rather than making another. No lock is held across the call.
//
// paused, asked under the lock when no call is in flight, says whether
// the sandbox still needs one; when not, resume returns nil at once. A
// request that saw the sandbox paused just before a call ended, and
// comes here once done has marked it running and the call has left the
// map, otherwise made a second call for the same wave of requests.
func (r *resumer) resume(id, requestID string, paused func() bool, done func(error)) error {
	if r.beforeResume != nil {
		r.beforeResume()
	}
	r.mu.Lock()
	if c, ok := r.calls[id]; ok {
		r.mu.Unlock()
		if r.beforeWait != nil {
			r.beforeWait()
		}
		<-c.done
		return c.err
	}
	if !paused() {
		r.mu.Unlock()
		return nil // resumed (or changed) since the caller looked
	}
	c := &resumeCall{done: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(r.stop)
	r.calls[id] = c
	r.mu.Unlock()

	c.err = r.call(c, id, requestID)
	c.cancel()
	done(c.err)
	r.mu.Lock()
	delete(r.calls, id)
	r.mu.Unlock()
	close(c.done)
	return c.err
}

// kill ends id's call in flight, if any: the sandbox was killed
// (Proxy.kill), and the requests waiting on the call are to get the
// kill's 410 at once, not wait up to lifecycle.resume_timeout for the
// lifecycle manager to fail to resume a sandbox that no longer exists.
func (r *resumer) kill(id string) {
	r.mu.Lock()
	c := r.calls[id]
	r.mu.Unlock()
	if c != nil {
		c.killed.Store(true)
		c.cancel()
	}
}

// call makes one resume call; nil only on a 200, errDrainCut when the
// drain deadline ended it (abort), errResumeKilled when a kill did.
func (r *resumer) call(c *resumeCall, id, requestID string) error {
	err := r.ask(c.ctx, id, requestID)
	switch {
	case err == nil:
		return nil
	case r.stop.Err() != nil:
		return errDrainCut // the lifecycle manager is not to blame
	case c.killed.Load():
		return errResumeKilled // nor here
	}
	return err
}

// ask is call's request.
func (r *resumer) ask(parent context.Context, id, requestID string) error {
	// The connect and the answer's wait: the platform's connect and read
	// timeouts, here one deadline over both.
	ctx, cancel := context.WithTimeout(parent, resumeConnectTimeout+r.timeout)
	defer cancel()
	// sandbox_id first, as the platform's proxy writes the query and the
	// README shows it (url.Values.Encode sorts the keys, request_id
	// first), so the lifecycle manager's logs read the same behind both.
	q := "?sandbox_id=" + url.QueryEscape(id)
	if requestID != "" {
		q += "&request_id=" + url.QueryEscape(requestID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+q, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	// The status is the outcome. The body is read (a little) only so that
	// the connection can be kept, and for a moment at most: one the
	// lifecycle manager left unfinished held every request waiting on the
	// call until the call's whole timeout. Cut, the connection is dropped.
	t := time.AfterFunc(resumeBodyWait, cancel)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	t.Stop()
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lifecycle manager answered %d", resp.StatusCode)
	}
	return nil
}
