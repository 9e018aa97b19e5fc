package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// ServerConfig holds the listener-side settings.
type ServerConfig struct {
	// ClientReadTimeout bounds the TLS handshake and first request headers together, from the accept, and a later request's headers (default 60 s, nginx's client_header_timeout).
	ClientReadTimeout time.Duration
	// ClientBodyTimeout bounds each wait for the next bytes of a request
	// body (default 60 s, nginx's client_body_timeout), not the whole body.
	ClientBodyTimeout time.Duration
	// ClientWriteTimeout is how long a client may take to accept each
	// piece of a response (default 60 s); a stream lives as long as the
	// client keeps reading.
	ClientWriteTimeout time.Duration
	// ClientIdleTimeout closes keep-alive client connections idle this long (default 75 s, nginx's keepalive_timeout).
	ClientIdleTimeout time.Duration
	// MaxRequestHeaderSize bounds request line + headers (default 32 KiB, nginx's default total; larger: 431).
	MaxRequestHeaderSize int
	// MaxClientConns caps the client connections open at once across the
	// traffic listeners (HTTP, HTTPS, the redirect listener), hijacked
	// ones (detached SSE streams, WebSocket tunnels) included until they
	// close: each holds memory. A connection over it is refused at accept
	// (see retryListener.refuse). 0 = unlimited (the default): the memory
	// a connection may take depends on the container, which the proxy
	// does not know.
	MaxClientConns int
	// DrainTimeout is how long Shutdown lets requests, downloads, POST
	// answers (SSE ones too) and WebSockets finish before cutting them
	// (default 30 s). GET SSE streams end at once, cleanly, so clients
	// reconnect to another instance.
	DrainTimeout time.Duration
	// SharedPorts says the listeners were opened with SO_REUSEPORT, so
	// another process may serve the same ports (a takeover). The drain
	// then closes the admin listener at its start, with the traffic ones:
	// left open, it would answer half the health checks on the shared
	// port with 503 (draining) while the other process serves the node,
	// and half the scrapes with the old process's counters.
	SharedPorts bool
}

// WithDefaults returns c with every unset field at the default NewServer
// applies (see Config.WithDefaults for why it is exported).
func (c ServerConfig) WithDefaults() ServerConfig {
	c.setDefaults()
	return c
}

// Config returns the listener settings the server runs with, defaults applied.
func (s *Server) Config() ServerConfig { return s.cfg }

func (c *ServerConfig) setDefaults() {
	if c.ClientReadTimeout == 0 {
		c.ClientReadTimeout = 60 * time.Second // nginx's client_header_timeout
	}
	if c.ClientBodyTimeout == 0 {
		c.ClientBodyTimeout = time.Minute
	}
	if c.ClientWriteTimeout == 0 {
		c.ClientWriteTimeout = 60 * time.Second
	}
	if c.ClientIdleTimeout == 0 {
		c.ClientIdleTimeout = 75 * time.Second // the platform's keepalive_timeout
	}
	if c.MaxRequestHeaderSize == 0 {
		c.MaxRequestHeaderSize = 32 << 10
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
}

// Server runs the proxy's sandbox-traffic listeners (HTTP, HTTPS) and the
// admin listener, and drains them on shutdown.
type Server struct {
	cfg ServerConfig
	p   *Proxy

	traffic  *fasthttp.Server
	adminSrv *fasthttp.Server
	// metricsSrv serves the metrics listener (ServeMetrics); nil with
	// adminSrv.
	metricsSrv *fasthttp.Server
	redirect   *fasthttp.Server // plain HTTP answered with a redirect to HTTPS (opt-in)
	// redirectPort is the HTTPS port the redirects name ("" for 443).
	redirectPort string
	// redirectConns are the redirect listener's connections, each with the
	// arrival of its current request's first byte (access log on only):
	// what tells a first request's body that stalled or was cut from a
	// connection that sent nothing (requestFailed), and where the access
	// log's request_time starts (begin). Apart from the traffic
	// listeners' (Proxy.conns): the drain's cutReads is not for these.
	redirectConns connSet

	draining atomic.Bool
	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
	// rechecking: a round of Proxy.recheckInvalidated is running.
	rechecking atomic.Bool
	// rejudging: a round of Proxy.rejudgeOpen is running.
	rejudging atomic.Bool
	// handshakes are the TLS handshakes of ServeTLS's connections under
	// way, which the drain ends after their grace.
	handshakes handshakes
	// served are the listeners the Serve methods were given, by kind,
	// and which kinds the drain has closed (see admit).
	served servedListeners
}

// servedListeners are a Server's listeners of one kind: traffic (the HTTP,
// HTTPS and redirect listeners) or admin (the admin and metrics ones),
// each closed at its own point of the drain.
type servedListeners struct {
	mu      sync.Mutex
	traffic []net.Listener
	admin   []net.Listener
	// trafficClosed, adminClosed: the drain has closed that kind.
	trafficClosed, adminClosed bool
}

// admit records ln, a listener of the admin kind or not, as served, or
// closes it and reports false when the drain has already closed its kind.
// fasthttp's shutdown closes only the listeners its Serve has recorded, and
// the program starts each Serve in a goroutine of its own, then drains as
// soon as a signal has come: after a SIGTERM as the proxy started, the drain
// often ran first, and a listener served later was never closed, accepting
// and serving clients through the drain until the process exited over them.
func (s *Server) admit(ln net.Listener, admin bool) bool {
	s.served.mu.Lock()
	defer s.served.mu.Unlock()
	if admin && s.served.adminClosed || !admin && s.served.trafficClosed {
		_ = ln.Close()
		return false
	}
	if admin {
		s.served.admin = append(s.served.admin, ln)
	} else {
		s.served.traffic = append(s.served.traffic, ln)
	}
	return true
}

// closeServed closes the served listeners of a kind, and any of that kind
// served from now on (admit), also those whose Serve has begun but whose
// fasthttp server has not recorded them yet. fasthttp's own close of them
// then fails with net.ErrClosed, which Shutdown ignores.
func (s *Server) closeServed(admin bool) {
	s.served.mu.Lock()
	lns := s.served.traffic
	if admin {
		lns, s.served.adminClosed = s.served.admin, true
	} else {
		s.served.trafficClosed = true
	}
	s.served.mu.Unlock()
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// NewServer returns a server for p and admin (admin may be nil).
func NewServer(cfg ServerConfig, p *Proxy, admin *Admin) *Server {
	cfg.setDefaults()
	// The proxy applies the client timeouts itself where fasthttp's do not
	// reach (streams, tunnels, streamed request bodies), and asks the
	// server whether it drains.
	p.clientWriteTimeout = cfg.ClientWriteTimeout
	p.clientBodyTimeout = cfg.ClientBodyTimeout
	s := &Server{cfg: cfg, p: p, stop: make(chan struct{})}
	p.draining = &s.draining
	if cfg.MaxClientConns > 0 {
		// Off (nil) without the limit: no lock per state change.
		p.waiting = &waitList{}
	}
	warnDescriptorBudget(p.cfg.Logger, cfg.MaxClientConns, openFilesLimit())
	// Every server sets SecureErrorLogMessage: without it fasthttp's
	// error for a request it cannot parse quotes the raw request head,
	// and that lands in the debug log with the admin token, traffic
	// tokens, Authorization and cube_token of whoever sent it.
	log := fasthttpLogger{p.cfg.Logger}
	s.traffic = s.trafficServer(log)
	s.redirect = s.redirectServer(log)
	if admin != nil {
		s.adminSrv = adminServer(cfg, admin, log)
		s.metricsSrv = metricsServer(cfg, admin, log)
		admin.draining = &s.draining
		admin.sharedPorts = cfg.SharedPorts
	}
	s.wg.Add(1)
	go s.janitor()
	if h, err := newHangups(); err != nil {
		p.cfg.Logger.Warn("departed SSE clients will be found by heartbeats only", "err", err)
	} else if h != nil {
		p.hangups = h
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			h.run()
		}()
	}
	return s
}

// trafficServer is the fasthttp server of the sandbox-traffic listeners.
func (s *Server) trafficServer(log fasthttpLogger) *fasthttp.Server {
	p, cfg := s.p, s.cfg
	return &fasthttp.Server{
		Handler:                      p.Handler,
		ExpectHandler:                p.Expect,
		ErrorHandler:                 p.clientError,
		HeaderReceived:               s.headerReceived,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		// Every answer gets the proxy's Date, replacing a sandbox's, as
		// nginx dates what it relays: an undated answer (a hand-written
		// server's) must not reach clients and caches so (RFC 9110
		// 6.6.1), and a VM resumed from a snapshot may keep a stale clock.
		// fasthttp writes a line it formats once a second.
		NoDefaultDate:        false,
		NoDefaultContentType: true,
		ReadBufferSize:       cfg.MaxRequestHeaderSize,
		Concurrency:          unlimitedConcurrency,
		// Small: it batches headers and small bodies; downloads bypass it
		// (WriteTo), streams flush per chunk, and it is held for the
		// life of every stream.
		WriteBufferSize:       4 << 10,
		ReadTimeout:           cfg.ClientReadTimeout,
		WriteTimeout:          cfg.ClientWriteTimeout,
		IdleTimeout:           cfg.ClientIdleTimeout,
		CloseOnShutdown:       true,
		Logger:                log,
		SecureErrorLogMessage: true,
		ConnState:             p.connState,
		// Hijacked connections (WebSocket tunnels, detached SSE streams)
		// are closed by their owner, which may outlive the hijack handler.
		KeepHijackedConns: true,
	}
}

// unlimitedConcurrency is the traffic servers' fasthttp Concurrency: no
// limit of fasthttp's own. Its default (256 Ki connections) answered the
// connection over it with a plain-text 503 and counted no hijacked one;
// client.max_conns is the limit, refused in the proxy's JSON shape
// (retryListener). It must stay above any max_conns, not equal to it:
// fasthttp frees a connection's worker only after the close the proxy
// counts, so a new connection the proxy admits may find every worker
// still busy. Its gate channel holds empty structs: no memory.
const unlimitedConcurrency = math.MaxInt32

// adminWriteTimeout bounds each admin answer's write.
const adminWriteTimeout = 30 * time.Second

// adminServer is the fasthttp server of the admin listener.
func adminServer(cfg ServerConfig, admin *Admin, log fasthttpLogger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler: admin.Handler,
		// A caller without the token gets no room for a body: fasthttp
		// allocates a declared length whole before the handler runs. Its
		// 413 is the ErrorHandler's: fasthttp resets the request, token
		// and all, when a chunked body runs over.
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if !admin.tokenPresented(h) {
				return fasthttp.RequestConfig{MaxRequestBodySize: maxTokenlessAdminBody}
			}
			return fasthttp.RequestConfig{}
		},
		ExpectHandler: admin.expect,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			renewWriteDeadline(ctx, adminWriteTimeout)
			clientError(ctx, err) // JSON, like every admin answer
			// A head or body over the limits closed with the rest
			// unread: the reset failed a client still sending before it
			// read the 431 or 413. Lingered as the traffic listener's.
			admin.p.lingerRefused(ctx, err)
			// As on the traffic listeners (requestFailed): a head
			// refused at a bad line may have been parsed for thousands
			// of lines before it, which the pooled context would keep.
			shedHead(ctx)
		},
		// Every body is JSON whatever its Content-Type: pre-parsed as a
		// form, a JSON body sent as multipart/form-data got the parser's
		// 400, and a form was parsed before the token was judged.
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		// As large as a traffic head: fasthttp's default 4 KiB
		// refused a control plane's tracing baggage, or an operator's
		// curl through an SSO proxy, with 431.
		ReadBufferSize:        cfg.MaxRequestHeaderSize,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          adminWriteTimeout,
		IdleTimeout:           90 * time.Second,
		MaxRequestBodySize:    maxAdminBody,
		CloseOnShutdown:       true,
		Logger:                log,
		SecureErrorLogMessage: true,
		// Held (heldConns) until fasthttp lets go of them.
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				admin.p.held.add(c)
			case fasthttp.StateClosed, fasthttp.StateHijacked:
				admin.p.held.remove(c)
			}
		},
	}
}

// headerReceived gives requests that carry a body the longer body timeout;
// ReadTimeout alone would cut a large upload.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.ContentLength() != 0 {
		return fasthttp.RequestConfig{ReadTimeout: s.cfg.ClientBodyTimeout}
	}
	return fasthttp.RequestConfig{}
}

// Serve serves sandbox traffic on ln (see ServeTLS for HTTPS).
func (s *Server) Serve(ln net.Listener) error {
	if !s.admit(ln, false) {
		return nil
	}
	if err := s.traffic.Serve(s.limited(ln)); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	return nil
}

// ServeTLS serves sandbox traffic over TLS with cfg on ln, a plain TCP
// listener. Unlike Serve over tls.NewListener, the drain closes
// connections whose handshake has not completed handshakeGrace after
// their accept (a client that sent no ClientHello, or part of one), as
// fasthttp closes a plain connection that sent nothing; and the time
// cfg.GetCertificate waits (an on-demand order) is not counted against
// the client's timeouts.
func (s *Server) ServeTLS(ln net.Listener, cfg *tls.Config) error {
	l := &tlsListener{Listener: ln, handshakes: &s.handshakes, headTimeout: s.cfg.ClientReadTimeout, sendTimeout: s.cfg.ClientWriteTimeout}
	l.cfg = l.certificateWaitExcluded(cfg)
	return s.Serve(l)
}

// Claim records lns (nil ones skipped) as the proxy's own listeners before
// any serves: each Serve records its own as it starts, but in a goroutine
// of its own, so a request on the first listener serving could still be
// sent to another's port, the admin API's among them, which answers a
// loopback client without a token. A route naming one is then refused
// (508 proxy_loop) from the first request on.
func (s *Server) Claim(lns ...net.Listener) {
	for _, ln := range lns {
		if ln != nil {
			s.p.addListener(ln.Addr())
		}
	}
}

// retrying wraps ln so that running out of descriptors pauses accepting
// instead of ending Serve (see retryListener), and records its address as
// the proxy's own, which no route may send requests to (dialedSelf).
func (s *Server) retrying(ln net.Listener) *retryListener {
	s.p.addListener(ln.Addr())
	return newRetryListener(ln, s.p.cfg.Logger, s.p.metrics)
}

// limited is retrying for a listener of client traffic: its connections
// count against MaxClientConns, and one over it takes the place of
// connections waiting for a request, or is refused when none waits; those it
// accepts are adopted (Proxy.adopt: write timeout renewed on progress,
// a lingering close during the drain).
func (s *Server) limited(ln net.Listener) net.Listener {
	rl := s.retrying(ln)
	rl.limit(&s.p.clientConns, int64(s.cfg.MaxClientConns), s.p.waiting)
	rl.wrap = s.p.adopt
	return rl
}

// ServeAdmin serves the admin API on ln. Its connections are never capped:
// the operator's way in (health, metrics) must work when clients exhaust
// client.max_conns, and it keeps descriptors in reserve for when they
// exhaust RLIMIT_NOFILE.
func (s *Server) ServeAdmin(ln net.Listener) error {
	if s.adminSrv == nil {
		return errors.New("no admin API configured")
	}
	if !s.admit(ln, true) {
		return nil
	}
	if err := s.adminSrv.Serve(s.retrying(ln).withReserve()); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve admin %s: %w", ln.Addr(), err)
	}
	return nil
}

// Shutdown stops accepting connections, ends GET SSE streams cleanly at once
// (not MCP HTTP+SSE sessions: registry.keepForDeadline),
// lets everything else finish until DrainTimeout (or ctx) runs out, then
// cuts what is left: streams, tunnels, requests still waiting on their
// sandbox and requests whose client stalled sending them, which are
// answered 504. It returns when nothing is open, or at
// most about four seconds after the deadline: two for what was cut to
// unwind, one for a redirect client, one for the admin listener; then
// the connections still held (heldConns) are closed, and an admin
// request still busy gets one more.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	if al := s.p.cfg.AccessLog; al != nil {
		// Every open connection ends with a line now, the event streams
		// all at once: the access log keeps those its queue has no room
		// for, where it dropped them (4,141 of 9,900 streams' lines with a
		// shipper reading at 3 MB/s).
		al.StartDrain(int(s.p.clientConns.Load()))
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
	defer cancel()

	done := make(chan error, 1)
	go func() { done <- s.traffic.ShutdownWithContext(ctx) }()
	// The redirect listener's too (see its server's shutdown below).
	s.closeServed(false)
	// fasthttp's wait does not see a connection in its TLS handshake.
	handshaking := make(chan struct{})
	defer close(handshaking)
	go s.handshakes.endHandshakes(handshaking)
	// The redirect listener closes with the HTTPS one, and its idle
	// keep-alive connections with it: a client kept on it until the end
	// of the drain would reuse a connection about to close.
	redirected := make(chan struct{})
	go func() {
		defer close(redirected)
		_ = s.redirect.ShutdownWithContext(ctx)
	}()
	s.p.streams.endSSE()
	// With shared ports the node stays ready: what answers its admin port
	// from now on is the other process.
	var adminClosed chan struct{}
	if s.adminSrv != nil && s.cfg.SharedPorts {
		adminClosed = make(chan struct{})
		actx, acancel := context.WithCancel(context.Background())
		defer acancel() // an admin request still open at the end is cut
		go func() {
			defer close(adminClosed)
			s.shutdownAdmin(actx)
		}()
	}

	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
	}
	// Tunnels (hijacked, invisible to fasthttp), lingering closes (hijacked
	// too) and anything still streaming get until the deadline, then are
	// cut, as are requests still waiting on their sandbox (for a head, or
	// to take an upload): they are answered 504 at once rather than at
	// their own timeout.
	for {
		if ctx.Err() != nil {
			// Said in the process log too: the access log, where each cut
			// exchange has its line, may be off or in a file, and without
			// this a drain that cut looks like one that finished.
			if streams, tunnels := s.p.streams.open(); streams+tunnels > 0 || s.p.served.Load() > 0 || s.p.lingering.Load() > 0 {
				s.p.cfg.Logger.Warn("drain deadline reached: cutting what is still open",
					"streams", streams, "websockets", tunnels, "client_connections", s.p.served.Load(),
					"lingering", s.p.lingering.Load())
			}
			s.p.streams.abortAll()
			s.p.pools.abort()
			if s.p.resumer != nil {
				s.p.resumer.abort() // requests waiting on a resume call
			}
			// After pools.abort, which clientError asks whether the
			// deadline has come.
			s.p.conns.cutReads()
			break
		}
		if streams, tunnels := s.p.streams.open(); streams == 0 && tunnels == 0 && s.p.lingering.Load() == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Wait (briefly) for what was cut to unwind: streams and tunnels to
	// end, and the requests cut to be answered and logged (fasthttp's own
	// wait for its connections stopped at the deadline).
	unwind := time.Now().Add(2 * time.Second)
	cutWrites := time.Now().Add(drainWriteGrace)
	for time.Now().Before(unwind) {
		streams, tunnels := s.p.streams.open()
		if streams == 0 && tunnels == 0 && s.p.served.Load() == 0 {
			break
		}
		if ctx.Err() != nil && !time.Now().Before(cutWrites) {
			// An answer fasthttp still writes to a client that takes
			// none of it (a small one, read whole: the registry does not
			// list it), or began to write since the deadline, is cut
			// too, as nginx's worker_shutdown_timeout closes every
			// connection: it held the exit to the end of the unwind. Not
			// at the deadline itself: the 504s of what the deadline cut
			// are written after it. Again each round: fasthttp sets a
			// new write deadline for each answer.
			s.p.conns.cutWrites()
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A redirect client still sending a head (or connected and silent)
	// gets at most a second more: its answer is instant, and it must not
	// hold the exit up to the drain deadline.
	select {
	case <-redirected:
	case <-time.After(time.Second):
	}
	// A lingering close the redirect listener began during the drain (an
	// upload's 308, its body read and dropped) gets the rest of the drain,
	// as the traffic listeners' do: the loop above, finding nothing open
	// on those, may have ended before it began, and closeAll below then
	// reset the connection over the rest of the upload.
	if s.p.lingering.Load() > 0 && ctx.Err() == nil {
		for s.p.lingering.Load() > 0 && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
		if n := s.p.lingering.Load(); n > 0 {
			// As the loop above says it: closeAll cuts these.
			s.p.cfg.Logger.Warn("drain deadline reached: cutting what is still open", "lingering", n)
		}
	}
	// The admin API answers through the drain (/readyz says 503, healthz
	// says draining), so it closes last; with shared ports it closed at
	// the start, and its last requests get the same second.
	if adminClosed != nil {
		select {
		case <-adminClosed:
		case <-time.After(time.Second):
		}
	} else if s.adminSrv != nil {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		s.shutdownAdmin(actx)
		acancel()
	}
	// What fasthttp's shutdown and the registry leave (heldConns): a
	// silent client of the admin or redirect listener, a lingering close.
	// Closed, they end at once, unless a handler is still busy (an admin
	// change writing the routes file): it gets a second.
	if !s.p.held.closeAll(time.Second) {
		s.p.cfg.Logger.Warn("shutdown: connections still busy a second after they were closed", "connections", s.p.held.len())
	}
	s.stopOnce.Do(func() { close(s.stop) })
	s.p.hangups.close()
	s.p.bg.stop()
	s.wg.Wait()
	s.p.pools.closeIdle()
	if s.p.resumer != nil {
		// Its kept connection to the lifecycle manager, as the pools'.
		s.p.resumer.client.CloseIdleConnections()
	}
	// fasthttp's wait ends with ctx's error at the drain deadline, or when
	// the caller cut the drain short: the plan, not a failure.
	// Nor is the close of a listener closeServed closed first.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// shutdownAdmin shuts the admin and metrics listeners' servers down at
// once, within ctx: the metrics listener closes with the admin listener.
func (s *Server) shutdownAdmin(ctx context.Context) {
	s.closeServed(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.metricsSrv.ShutdownWithContext(ctx)
	}()
	_ = s.adminSrv.ShutdownWithContext(ctx)
	<-done
}

// janitor drops idle upstream pools and forgotten sandbox entries.
func (s *Server) janitor() {
	defer s.wg.Done()
	// Often enough that an idle upstream connection is closed within a
	// quarter of its idle timeout of it expiring: with one pool per
	// sandbox, expired connections otherwise pile up as descriptors.
	tick := min(30*time.Second, max(s.p.cfg.UpstreamIdleConnTimeout/4, 250*time.Millisecond))
	// Expired connections are closed over half a tick, at most a second.
	spread := min(tick/2, time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	var sandboxesSwept time.Time
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.p.pools.sweep(now, s.p.cfg.UpstreamIdleConnTimeout, 2*s.p.cfg.UpstreamIdleConnTimeout, spread, s.stop)
			// Route changes no invalidation announced: what is open is
			// judged against the route the cache holds now (read again
			// once its TTL is over). In the background, as the recheck
			// below: its store reads must not hold the sweeps.
			if s.rejudging.CompareAndSwap(false, true) {
				s.p.bg.run(func(ctx context.Context) {
					defer s.rejudging.Store(false)
					s.p.rejudgeOpen(ctx, s.stop)
				})
			}
			// A walk over every sandbox seen in the last day: at the
			// short ticks of a short idle_conn_timeout it cost 3 % of the
			// CPU of a cold-start burst, for hour-long thresholds.
			if now.Sub(sandboxesSwept) >= time.Minute {
				s.p.sandboxes.sweep(now, 24*time.Hour, time.Hour, s.stop)
				sandboxesSwept = now
				// Its own goroutine: a round of store reads (one per idle
				// sandbox invalidated in the last minute) must not hold
				// the pool sweeps. The proxy's background runner, so that
				// Shutdown cuts the read in flight rather than wait out
				// its timeout.
				if s.rechecking.CompareAndSwap(false, true) {
					s.p.bg.run(func(ctx context.Context) {
						defer s.rechecking.Store(false)
						s.p.recheckInvalidated(ctx)
					})
				}
			}
		}
	}
}

// connState counts open client connections. A hijacked (WebSocket)
// connection stays open; its tunnel reports the close. clientConns was
// counted up when the listener admitted the connection. With
// client.max_conns set, it also keeps the list of connections waiting for
// a request (waiting) that the listener reclaims at the limit.
func (p *Proxy) connState(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		p.served.Add(1)
		p.conns.add(c)
		p.metrics.ConnOpened()
		if p.waiting != nil {
			p.waiting.push(c)
		}
	case fasthttp.StateActive:
		if p.waiting != nil {
			p.waiting.remove(c)
		}
		// Only the access log's request_time uses it: no clock read
		// and no lock without one.
		if p.cfg.AccessLog != nil {
			p.conns.requestBegan(c, time.Now())
		}
	case fasthttp.StateIdle:
		if p.waiting != nil {
			p.waiting.push(c)
		}
	case fasthttp.StateClosed:
		p.served.Add(-1)
		p.conns.remove(c)
		p.connClosed(c)
		if abandon, ok := p.hijacks.LoadAndDelete(c); ok {
			abandon.(func())()
		}
	case fasthttp.StateHijacked:
		p.served.Add(-1)
		p.conns.remove(c)
		p.connHijacked(c)
	}
}

// connClosed counts out a client connection fasthttp closed, unless the
// listener reclaimed it and so counted it out already (reclaim).
func (p *Proxy) connClosed(c net.Conn) {
	if p.waiting != nil && p.waiting.remove(c) {
		p.metrics.ConnClosed()
		return
	}
	p.clientConnClosed()
}

// connHijacked: the owner of a hijacked connection counts its close. One
// the listener reclaimed as its request began (the two race) was counted
// out already, so it is counted back in for that.
func (p *Proxy) connHijacked(c net.Conn) {
	if p.waiting != nil && p.waiting.remove(c) {
		p.clientConns.Add(1)
	}
}

// connSet is the set of client connections fasthttp serves, each with
// when the first byte of its current request arrived (zero before one).
// A mutex and a map rather than a sync.Map: one insert and one delete per
// connection, which a map does without allocating once it has grown, and
// with the access log on one update and one read per request.
type connSet struct {
	mu sync.Mutex
	m  map[net.Conn]time.Time
	// heads holds the head of each connection's "Expect: 100-continue"
	// upload admitted and waiting for its body (admittedHead): only
	// uploads that sent Expect touch it.
	heads map[net.Conn]*admittedHead
	// writesCut is set once the drain deadline's grace is over and writes
	// to clients are cut (cutWrites): an answer whose write fails from then
	// on was cut by the drain (writtenAnswer).
	writesCut atomic.Bool
}

func (cs *connSet) add(c net.Conn) {
	cs.mu.Lock()
	if cs.m == nil {
		cs.m = make(map[net.Conn]time.Time)
	}
	cs.m[c] = time.Time{}
	cs.mu.Unlock()
}

// requestBegan records that the first byte of c's next request arrived
// at t: fasthttp says so (StateActive) once it has that byte and before it
// reads the head.
func (cs *connSet) requestBegan(c net.Conn, t time.Time) {
	cs.mu.Lock()
	if _, ok := cs.m[c]; ok { // never re-adds a connection removed
		cs.m[c] = t
	}
	cs.mu.Unlock()
}

// began returns when the first byte of c's current request arrived, or
// the zero time when that is unknown.
func (cs *connSet) began(c net.Conn) time.Time {
	cs.mu.Lock()
	t := cs.m[c]
	cs.mu.Unlock()
	return t
}

func (cs *connSet) remove(c net.Conn) {
	cs.mu.Lock()
	delete(cs.m, c)
	ah := cs.heads[c]
	if ah != nil {
		delete(cs.heads, c)
	}
	cs.mu.Unlock()
	ah.release()
}

// keepHead holds ah, the head of an upload Expect admitted on c, until
// its body's run takes it (dropHead) or fasthttp's error handler does
// (takeHead), or c closes (remove). A connection removed already keeps
// nothing.
func (cs *connSet) keepHead(c net.Conn, ah *admittedHead) {
	cs.mu.Lock()
	_, open := cs.m[c]
	if open {
		if cs.heads == nil {
			cs.heads = make(map[net.Conn]*admittedHead)
		}
		cs.heads[c] = ah
	}
	cs.mu.Unlock()
	if !open {
		ah.release()
	}
}

// takeHead returns, and no longer holds, the admitted head c holds (nil:
// none).
func (cs *connSet) takeHead(c net.Conn) *admittedHead {
	cs.mu.Lock()
	ah := cs.heads[c]
	if ah != nil {
		delete(cs.heads, c)
	}
	cs.mu.Unlock()
	return ah
}

// dropHead lets go of the admitted head c holds: its body came, and the
// request runs with its own head.
func (cs *connSet) dropHead(c net.Conn) {
	cs.takeHead(c).release()
}

// cutReads ends, at the drain deadline, every read a client connection is
// blocked in: fasthttp reads a request's head, and the first 8 KiB of a
// Content-Length body (all of a smaller one), before the handler runs, so
// neither the registry nor pools.abort reaches a client that stalled
// there. The read fails at once as a timeout, which clientError answers
// 504 drain_timeout; before, such a client held the process to the end of
// the unwind (fasthttp's own read timeout is up to client.read_timeout or
// client.body_timeout away) and was then reset, unanswered and unlogged.
// Reads in the handler (a streamed upload's) fail too, as pools.abort
// already made them; writes are left alone: streams are the registry's.
func (cs *connSet) cutReads() {
	now := time.Now()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for c := range cs.m {
		_ = c.SetReadDeadline(now)
	}
}

// drainWriteGrace is how long after the drain deadline an answer may
// still be written to a client that takes none of it (conns.cutWrites):
// the 504s of the requests the deadline cut go out within it.
const drainWriteGrace = 500 * time.Millisecond

// cutWrites ends every write to a client connection fasthttp serves: an
// answer the client does not take, past the drain deadline and its grace
// (drainWriteGrace), fails at once. A write deadline that passed is not
// moved on by progress (clientConn.progressed).
func (cs *connSet) cutWrites() {
	cs.writesCut.Store(true)
	now := time.Now()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for c := range cs.m {
		_ = c.SetWriteDeadline(now)
	}
}

// clientConnClosed counts a client connection of a traffic or redirect
// server closed, by fasthttp or by the owner of a hijacked one: its place
// under client.max_conns is free again at once.
func (p *Proxy) clientConnClosed() {
	p.clientConns.Add(-1)
	p.metrics.ConnClosed()
}

// hijack hands the client connection to fn once the handler returns, and
// makes sure abandon runs instead if fasthttp closes the connection
// without calling fn. It does that when it cannot flush the answer to a
// request the client pipelined ahead of this one (the client reset the
// connection), and what fn would have released (the sandbox connection,
// the sandbox's request count, the stream's registration) would be held
// for ever. abandon must not count the client connection closed: fasthttp
// reports that close through connState.
func (p *Proxy) hijack(ctx *fasthttp.RequestCtx, fn fasthttp.HijackHandler, abandon func()) {
	c := ctx.Conn()
	ownsClose(c)
	p.hijacks.Store(c, abandon)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(hc net.Conn) {
		p.hijacks.Delete(c)
		fn(hc)
	})
}

// clientError answers requests fasthttp could not parse, in the same JSON
// shape as every other proxy error.
func clientError(ctx *fasthttp.RequestCtx, err error) {
	writeError(ctx, refusedByParser(err), nil)
	ctx.SetConnectionClose()
}

// refusedByParser is the answer to a request fasthttp refused.
func refusedByParser(err error) proxyError {
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return proxyError{status: 413, code: CodeBodyTooLarge, msg: "request body too large"}
	case isTimeout(err):
		return proxyError{status: 408, code: "request_timeout", msg: "request not received in time"}
	}
	var small *fasthttp.ErrSmallBuffer
	if errors.As(err, &small) {
		return proxyError{status: 431, code: CodeHeaderTooLarge, msg: "request headers too large"}
	}
	if errors.Is(err, fasthttp.ErrorInvalidURI) {
		// A request target with a control byte or no valid form, or
		// userinfo ("user@") in Host or in an absolute-form target,
		// which RFC 9110 4.2.4 has a recipient treat as an error.
		return proxyError{status: 400, code: CodeBadRequest, msg: "invalid request target or Host (userinfo such as user@ is not accepted)"}
	}
	return proxyError{status: 400, code: CodeBadRequest, msg: "malformed HTTP request"}
}

// clientError is the traffic listeners' requestFailed.
func (p *Proxy) clientError(ctx *fasthttp.RequestCtx, err error) {
	p.requestFailed(ctx, err, &p.conns)
}

// requestFailed answers a request fasthttp refused or dropped before the
// handler ran, on a connection of conns, with the request id every
// traffic answer carries, and counts and logs it like any other answer: a
// flood of 400s or 431s must show, and so must clients that leave halfway.
func (p *Proxy) requestFailed(ctx *fasthttp.RequestCtx, err error, conns *connSet) {
	// A head fasthttp refused may have been parsed up to its bad line,
	// thousands of lines before it, which the context would keep.
	defer shedHead(ctx)
	renewWriteDeadline(ctx, p.clientWriteTimeout)
	var buf [maxRequestIDLen]byte
	// The head of an upload Expect admitted, whose body's start fasthttp
	// failed to read (admittedHead): the failure is that request's.
	ah := conns.takeHead(ctx.Conn())
	defer ah.release()
	e, request := p.failure(ctx, err, conns, ah != nil)
	if !request {
		// No request to count or log (fasthttp reports a first read
		// that failed before any byte as a malformed request); the
		// answer still carries an id, as every traffic answer does.
		writeError(ctx, e, nil)
		ctx.SetConnectionClose()
		ctx.Response.Header.SetBytesV(HeaderRequestID, p.requestID(&ctx.Request.Header, buf[:0]))
		setRetcode(&ctx.Response.Header, false)
		return
	}
	x := exchange{noHead: ah == nil} // before begin: a dropped head's span claims none
	var sandboxID []byte
	if ah != nil {
		// Logged, counted and traced as the request the head began,
		// timed from it (begin reads headStart), as its run after the
		// body would have been.
		ah.restore(ctx, &x)
		sandboxID = []byte(x.sandboxID)
	}
	p.begin(ctx, &x, conns)
	x.early = true
	if ah != nil {
		// How much of the body fasthttp read is not told: not what the
		// head declared.
		x.bytesIn = 0
		// Counted in flight only now: the head's run left it to the
		// body's (countEnvd), which finish ends.
		p.metrics.EnvdStarted(x.envd)
	}
	reqID := p.requestID(&ctx.Request.Header, buf[:0])
	x.noteRequestID(reqID)
	x.fail(ctx, e, sandboxID)
	ctx.SetConnectionClose()
	ctx.Response.Header.SetBytesV(HeaderRequestID, reqID)
	setRetcode(&ctx.Response.Header, false)
	p.headersReady(ctx, &x)
	p.finish(ctx, &x, ctx.Response.StatusCode(), nil, nil)
	p.lingerRefused(ctx, err)
}

// renewWriteDeadline gives the answer an error handler composes d to go
// out in. fasthttp writes it under the write deadline the connection's
// previous answer set, which a keep-alive wait and a head stalled until the
// read timeout have used up (with nginx's 60 s for both, always): the
// client saw a bare close where the access log said the 408 was sent.
func renewWriteDeadline(ctx *fasthttp.RequestCtx, d time.Duration) {
	if d > 0 {
		_ = ctx.Conn().SetWriteDeadline(time.Now().Add(d))
	}
}

// failure is the answer to err, which fasthttp's error handler got on a
// connection of conns, and whether it ended a request (logged and
// counted) rather than a connection that carried none; admitted: the
// connection held the head of an upload Expect admitted (admittedHead),
// whose body's read failed, a request whatever the connection's record.
func (p *Proxy) failure(ctx *fasthttp.RequestCtx, err error, conns *connSet, admitted bool) (proxyError, bool) {
	if plainHTTPOnTLS(err) != nil {
		return refusedPlainHTTP, true
	}
	if !connectionError(err) || headStalled(err) {
		return p.refused(err), true
	}
	if leftMidHead(err) {
		// As one that leaves in the middle of a body (below): a client
		// that left is the proxy's 499, whatever part of its request it
		// had sent (nginx logs 400 for both, its readers' status).
		return proxyError{status: 499, code: CodeClientClosed, msg: "client closed the connection before the end of its request head"}, true
	}
	stalled, left := isTimeout(err), leftMidBody(err)
	if !(stalled || left) || !(admitted || requestBegun(ctx, conns)) {
		return p.refused(err), false
	}
	if left {
		// As a client that leaves halfway through a streamed upload
		// (forward): nginx's 499. The answer goes to nobody (a client
		// that only half-closed may read it); fasthttp writes it as it
		// wrote the 400 before, and nothing lingers for a connection
		// error (lingerRefused).
		return refusedBodyLeft, true
	}
	return p.refused(err), true
}

// refused is the answer to a request fasthttp refused on a traffic
// listener: a read that timed out once the drain deadline has come is the
// drain's cut (connSet.cutReads), not the client's slowness.
func (p *Proxy) refused(err error) proxyError {
	if isTimeout(err) && p.pools.aborted.Load() {
		return refusedBodyDrain
	}
	return refusedByParser(err)
}

// lingerRefused sends the answer an error handler composed for a refused
// request with a lingering close, when it can go out ahead of anything
// fasthttp still holds. fasthttp would close with the rest of the request
// unread (the rest of a head over the read buffer, the body after a
// malformed head): the kernel resets the connection, which fails the
// client's write of the rest before it reads the answer, and may destroy
// the answer in the client's buffers (RFC 9112 9.6). fasthttp's own write
// of the answer then finds the write side closed and sends nothing.
//
// Order: fasthttp holds answers to pipelined requests in its writer until
// it must wait for the next head. A head too large is found only by
// waiting, so nothing is held then. A malformed head may be found without
// waiting, behind held answers; it lingers only on a connection's first
// request (ConnRequestNum is still 0 in the error handler), and later ones
// keep fasthttp's plain close. A connection error (a timeout, a reset)
// has nothing more to read.
func (p *Proxy) lingerRefused(ctx *fasthttp.RequestCtx, err error) {
	if raw := plainHTTPOnTLS(err); raw != nil {
		// Written under the TLS layer, which has failed for good: what
		// fasthttp then writes through it goes nowhere.
		p.answerLingering(raw, raw, &ctx.Response)
		return
	}
	c := ctx.Conn()
	if _, ok := c.(interface{ CloseWrite() error }); !ok {
		return
	}
	if isSmallBuffer(err) || (ctx.ConnRequestNum() == 0 && !connectionError(err)) {
		p.answerLingering(c, c, &ctx.Response)
	}
}

// refusedPlainHTTP answers plain HTTP sent to the HTTPS listener, as nginx
// answers it (400, "The plain HTTP request was sent to HTTPS port").
var refusedPlainHTTP = proxyError{status: 400, code: CodeBadRequest, msg: "plain HTTP request sent to the HTTPS port: use https://"}

// plainHTTPOnTLS returns the connection under a TLS listener's connection
// whose first bytes were plain HTTP rather than a TLS handshake (an SDK or
// a curl given http:// and the HTTPS port), or nil. crypto/tls hands it
// over for that answer, as net/http writes its own 400 there; closed
// without a byte, the client only said "empty reply". A request method
// begins with an upper-case letter, which no TLS record type (0x14-0x18)
// or SSLv2 hello (0x80) does; the rest of the record header must be
// printable, as a method and the start of its target are. Empty lines
// before the request line (CR, LF), which a server skips (RFC 9112 2.2)
// and nginx answers as plain HTTP too, come first; no record type is
// one either.
func plainHTTPOnTLS(err error) net.Conn {
	// AsType: errors.As would move its target to the heap, an allocation
	// for every refusal the error handler sees.
	rh, ok := errors.AsType[tls.RecordHeaderError](err)
	if !ok || rh.Conn == nil {
		return nil
	}
	b := rh.RecordHeader[:]
	for len(b) > 0 && (b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	if len(b) > 0 && (b[0] < 'A' || b[0] > 'Z') {
		return nil
	}
	for _, c := range b {
		if c < ' ' || c > '~' {
			return nil
		}
	}
	return rh.Conn
}

// connectionError reports an error of the connection rather than of a
// request: a probe that connected and reset, a TLS handshake the client
// gave up on or the proxy refused (certificateRefused), a preconnected
// socket that timed out before sending. nginx logs nothing for these, and
// neither does the proxy. A request that
// stalled halfway through its headers is among the timeouts (headStalled
// tells it apart), one whose client left there among the closes and
// resets (leftMidHead), and so are a body's (requestBegun).
func connectionError(err error) bool {
	var op *net.OpError
	var rh tls.RecordHeaderError
	var cr certificateRefused
	return isTimeout(err) || errors.As(err, &op) || errors.As(err, &rh) || errors.As(err, &cr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.HasPrefix(err.Error(), "tls: ")
}

// headStalled reports a timeout that came after part of a request head
// had arrived: a request, which nginx logs as a 408 (measured, 1.22), and
// so does the proxy. fasthttp wraps the read error of a head it had begun
// ("error when reading request headers: ..."), and hands over that of a
// connection that sent nothing as the connection's own error.
func headStalled(err error) bool {
	var op *net.OpError
	return isTimeout(err) && !(errors.As(err, &op) && error(op) == err)
}

// requestBegun tells, for a bare read error (a timeout, a close, a reset)
// that fasthttp's error handler got, the read of a request body fasthttp
// reads before the handler (a small one, or a large one's first 8 KiB;
// the redirect listener's, whole) from a connection that sent nothing. A
// body's is a request: a stalled one is logged as nginx logs its
// client_body_timeout, and as the drain's cut of it, which is answered 504
// (every answered request leaves a line); one its client left halfway
// (leftMidBody) as nginx logs that too. fasthttp drops the head of such a
// request and hands over the bare read error, as for a connection that
// sent nothing. On a connection that carried a request before
// (ConnRequestNum is still its number here), fasthttp answers a silent
// wait for the next head, or its end, with no error at all and wraps a
// head's error, so a bare one is the body's. On a connection's first
// request, a connection whose first byte came (StateActive, recorded in
// conns when the access log is on: without it there is no line to write)
// sent a request; a silent one never goes active.
func requestBegun(ctx *fasthttp.RequestCtx, conns *connSet) bool {
	return ctx.ConnRequestNum() > 0 || !conns.began(ctx.Conn()).IsZero()
}

// leftMidHead reports whether err, the error fasthttp's error handler got,
// is a close or a reset in the middle of a request head: a request, which
// nginx logs (400, "client prematurely closed connection"). fasthttp wraps
// the read error of a head only once a byte of it came ("error when
// reading request headers: ...": it waits for the first byte apart, and
// hands over the bare error of a connection that sent none, on a first
// request, or no error on a later one), so no connection record is
// needed, and the request is counted with the access log off too. A
// close is io.EOF (over TLS: a close_notify, or a close at a record's
// end) or io.ErrUnexpectedEOF (a close within a TLS record); a reset is
// the connection's ECONNRESET, under TLS too. A lone blank line and then
// a close is no head (fasthttp ends such a connection without an error).
// A client that only half-closed reads the 499, as after a body's.
func leftMidHead(err error) bool {
	var op *net.OpError
	bare := err == io.EOF || err == io.ErrUnexpectedEOF || errors.As(err, &op) && error(op) == err
	return !bare && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET))
}

// leftMidBody reports whether err, the error fasthttp's error handler got,
// is the bare end of a connection under a body read (requestBegun tells
// it from a silent connection's): a close, which fasthttp's fixed-size
// body read turns into io.ErrUnexpectedEOF (a TLS close_notify too), or a
// reset. A head's read errors come wrapped ("error when reading request
// headers: ..."): a client that leaves halfway through a head is
// leftMidHead's.
func leftMidBody(err error) bool {
	if err == io.ErrUnexpectedEOF {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && error(op) == err && errors.Is(err, syscall.ECONNRESET)
}

// fasthttpLogger sends fasthttp's own messages to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if !f.l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	// Even with SecureErrorLogMessage, fasthttp's parse errors quote the
	// client's bytes: the request line it found no version in (the whole
	// head after it), a target it refused, a header line without a colon.
	// Those carry a cube_token, a traffic token, the admin token, which no
	// log may hold. Every quoted string in an error is the client's.
	a := make([]any, len(args))
	for i, v := range args {
		if err, ok := v.(error); ok {
			v = redactQuoted(err.Error())
		}
		a[i] = v
	}
	f.l.Debug(fmt.Sprintf(format, a...), "component", "fasthttp")
}

// redactQuoted returns s with the contents of each Go-quoted string in it
// (as %q writes one) replaced by REDACTED; an unterminated one runs to the
// end of s.
func redactQuoted(s string) string {
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return s
	}
	var b strings.Builder
	for i >= 0 {
		b.WriteString(s[:i])
		b.WriteString(`"REDACTED"`)
		q, err := strconv.QuotedPrefix(s[i:])
		if err != nil {
			return b.String()
		}
		s = s[i+len(q):]
		i = strings.IndexByte(s, '"')
	}
	b.WriteString(s)
	return b.String()
}
