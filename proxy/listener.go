package proxy

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// retryListener keeps a listener serving through resource exhaustion.
// fasthttp takes every accept error but a timeout for a permanent one and
// stops serving: at RLIMIT_NOFILE (EMFILE), one burst of idle clients or
// sandbox connections stopped the listener, and with it the process. Like
// net/http and nginx, the proxy waits and tries again instead: meanwhile
// new connections wait in the kernel's backlog (clients see a slow
// connect, not a reset) and are served once descriptors free up.
//
// Accept is called from one goroutine (the server's accept loop), so the
// episode state needs no lock.
type retryListener struct {
	net.Listener
	log     *slog.Logger
	metrics *telemetry.Metrics

	closeOnce sync.Once
	closed    chan struct{}

	failed  int       // failed accepts since the last success
	since   time.Time // first failure of the current episode
	logged  time.Time // last "accept failing" line
	episode bool      // the current episode was logged: log its end too

	// Admin listener only (see withReserve); nil: none.
	reserve *fdReserve

	// wrap, when set, wraps each connection admitted (Proxy.adopt).
	wrap func(net.Conn) net.Conn

	// Client traffic listeners only (see limit); nil open: not counted.
	open          *atomic.Int64 // connections admitted and not yet closed, shared by the traffic listeners
	max           int64         // client.max_conns; 0 = unlimited
	answer        []byte        // the refusal as last written (refuse)
	answerRest    []byte        // the refusal after its Date, rendered once (overloadAnswer)
	scratch       []byte        // what a refused client sent is read into it and dropped
	refused       int           // refusals since the last "refusing" line
	refusedLogged time.Time     // last "refusing" line

	// At client.max_conns, the connections that wait for a request, of
	// which reclaim closes the oldest for a new one (nil: the limit is off).
	waiting         *waitList
	victims         []net.Conn // reclaim's, kept to allocate once
	reclaimed       int        // connections reclaimed since the last "not enough" line
	reclaimedLogged time.Time  // last "not enough" line
}

func newRetryListener(ln net.Listener, log *slog.Logger, m *telemetry.Metrics) *retryListener {
	return &retryListener{Listener: ln, log: log, metrics: m, closed: make(chan struct{})}
}

// Accept returns the next connection, waiting out accept errors that
// resources freeing up will cure: 5 ms, doubling to 1 s (net/http's
// schedule), so a process out of descriptors does not spin on a listening
// socket that stays readable.
func (l *retryListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	waited := false
	for {
		c, err := l.Listener.Accept()
		if err != nil && l.reserve != nil && resourceExhausted(err) {
			c, err = l.acceptReserved()
		}
		if err == nil {
			if l.failed > 0 {
				l.recovered()
			}
			if l.reserve != nil {
				return l.reserve.track(c), nil
			}
			if l.open != nil && !l.admitOrReclaim() {
				l.refuse(c)
				continue
			}
			if l.wrap != nil {
				c = l.wrap(c)
			}
			return c, nil
		}
		if errors.Is(err, syscall.ECONNABORTED) {
			// A client that reset before it was accepted: nothing to wait
			// for or report. (Go's TCP listener retries it itself.)
			continue
		}
		if !resourceExhausted(err) {
			return nil, err
		}
		if !waited && l.reserve == nil {
			// Linux's accept4 takes a descriptor before it looks for a
			// connection, so at the limit it fails with no client there
			// too. Wait for one before counting a failure: otherwise
			// the counter and the log reported a client a second that
			// never came, and the backoff they grew made the first real
			// one wait up to a second after descriptors had freed up.
			// (Elsewhere waitConn returns at once: one more try.)
			if err := waitConn(l.Listener, l.closed); err != nil {
				return nil, err
			}
			waited = true
			continue
		}
		l.metrics.AcceptError()
		now := time.Now()
		if l.failed == 0 {
			l.since = now
		}
		l.failed++
		// Once per episode and at most every 10 s when the limit keeps
		// being touched: the counter has every attempt.
		if now.Sub(l.logged) >= 10*time.Second {
			l.logged, l.episode = now, true
			l.log.Error("cannot accept connections: out of resources; retrying, new clients wait in the listen backlog",
				"addr", l.Addr().String(), "err", err, "open_files_limit", openFilesLimit())
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return nil, net.ErrClosed
		}
		delay = min(2*delay, time.Second)
	}
}

// acceptReserved accepts a connection on the reserve after an accept
// failed for want of descriptors. Linux's accept4 takes a descriptor
// before it looks for a connection, so at the limit it fails when none
// waits too: the first Accept, and the next one after each connection. A
// reserved descriptor spent then was free for anything else (a client's
// accept, a sandbox or Redis dial) until an admin connection came, and
// the reserve stayed short when something took it: a route lookup at the
// limit got Redis's answer instead of 503 proxy_out_of_resources
// (TestAdminReserveSpentOnlyOnAConnection). So it waits for a connection
// first, and spends a descriptor only on one.
func (l *retryListener) acceptReserved() (net.Conn, error) {
	if err := waitConn(l.Listener, l.closed); err != nil {
		// Closed while waiting.
		return nil, err
	}
	c, err := l.Listener.Accept()
	if err != nil && resourceExhausted(err) && l.reserve.release() {
		// Our own descriptor for this connection: accept again at once.
		c, err = l.Listener.Accept()
	}
	return c, err
}

// withReserve makes l hold reserveFDs descriptors of its own (opens of
// the null device), spent on its accepts when the process is out of
// descriptors: the admin listener's health probes must be answered while
// clients hold every other one (a liveness probe that times out restarts
// the proxy and cuts every stream it serves). Each one spent is taken
// back when its connection closes, before anything else can take the
// descriptor that close frees.
func (l *retryListener) withReserve() *retryListener {
	l.reserve = &fdReserve{}
	l.reserve.fill()
	return l
}

// reserveFDs is the admin listener's reserve: a probe, a scrape that keeps
// its connection and an admin call or two at once.
const reserveFDs = 8

// fdReserve is a listener's reserve of descriptors (see withReserve).
type fdReserve struct {
	mu     sync.Mutex
	files  []*os.File
	closed bool // the listener closed: fill no more
}

// fill opens descriptors up to reserveFDs; those it cannot open (the
// process is out of them) it leaves to the next fill.
func (r *fdReserve) fill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.closed && len(r.files) < reserveFDs {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return
		}
		r.files = append(r.files, f)
	}
}

// release closes one reserved descriptor; false when none is left.
func (r *fdReserve) release() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.files) == 0 {
		return false
	}
	f := r.files[len(r.files)-1]
	r.files = r.files[:len(r.files)-1]
	f.Close()
	return true
}

// track refills the reserve now (a connection accepted without it may
// find descriptors free again) and when c closes. A TCP connection stays
// one (its CloseWrite and SyscallConn are what the lingering answers use).
func (r *fdReserve) track(c net.Conn) net.Conn {
	r.fill()
	if tc, ok := c.(*net.TCPConn); ok {
		return &reserveConn{TCPConn: tc, r: r}
	}
	return c
}

// reserveConn refills its listener's reserve once it is closed.
type reserveConn struct {
	*net.TCPConn
	r    *fdReserve
	once sync.Once
}

// Close closes the connection and takes its descriptor back into the
// reserve if the reserve is short.
func (c *reserveConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(c.r.fill)
	return err
}

// close gives the reserve's descriptors back for good.
func (r *fdReserve) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, f := range r.files {
		f.Close()
	}
	r.files = nil
}

// recovered ends an episode of failed accepts.
func (l *retryListener) recovered() {
	if l.episode {
		l.log.Warn("accepting connections again",
			"addr", l.Addr().String(), "failed_accepts", l.failed, "after", time.Since(l.since).Round(time.Millisecond).String())
	}
	l.failed, l.episode = 0, false
}

// Close also ends a wait between retries, so a drain is not held up.
func (l *retryListener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		if l.reserve != nil {
			l.reserve.close()
		}
	})
	return l.Listener.Close()
}

// resourceExhausted reports an accept or dial error that passes once the
// process or the system has descriptors (or buffers) again. Not
// ECONNABORTED: a connection aborted by its peer (or by ss -K) is no
// shortage of the proxy's, and a dial that gets it is the sandbox's 502.
func resourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
