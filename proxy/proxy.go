// Package proxy is the fasthttp edge of CubeProxy: it parses the sandbox
// target of each request, resolves its route through the cache, picks the
// backend address, and streams the exchange (HTTP, SSE, WebSocket) to it.
package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// Proxy is the request pipeline. Its Handler serves sandbox traffic; the
// admin API is Admin.Handler, on a separate listener.
type Proxy struct {
	cfg     Config
	parser  *routing.Parser
	cache   *routing.Cache
	store   routing.Store
	pools   pools
	readers sync.Pool // *bufio.Reader of UpstreamReadBufferSize, one per exchange
	// readersOut counts readers in use: what idle streams cost in buffers.
	readersOut atomic.Int64
	streams    registry
	hangups    *hangups // set by NewServer; nil: departed clients are found by looking at their sockets
	sandboxes  sandboxes
	bg         background // goroutines of the proxy's own; Server.Shutdown stops them
	// hijacks maps a client connection to the release of a hijack handler
	// fasthttp has not run yet (see hijack).
	hijacks sync.Map
	// conns holds the client connections fasthttp serves (hijacked ones
	// left it), for the drain deadline to wake the reads fasthttp does
	// before the handler runs (connSet.cutReads).
	conns connSet
	// held are the connections Server.Shutdown closes at its end (see
	// heldConns): the admin and redirect servers', and those read from
	// in a lingering close.
	held heldConns
	// lingering counts the connections in a lingering close, from before
	// the end of their answer goes out (answerLingering, goLingerClose). The
	// drain waits for them as for a stream, until its deadline: closed
	// with the client's bytes unread, a connection is reset, and a client
	// still sending the rest of a refused upload (Python's http.client
	// reads only once it has sent it all) lost the answer it was given.
	lingering atomic.Int64

	// draining is the Server's: set once Shutdown has begun.
	draining *atomic.Bool
	// served counts the client connections fasthttp serves (hijacked ones
	// left it): Shutdown waits for the requests the drain deadline cut to
	// be answered. fasthttp's own count is off by one once Serve returned.
	served atomic.Int64
	// clientConns counts the client connections of the traffic and
	// redirect listeners from their accept to their close, hijacked ones
	// included: what client.max_conns caps (retryListener.admit counts one
	// up; fasthttp's close or the hijacker's counts it down,
	// clientConnClosed).
	clientConns atomic.Int64
	// waiting are the client connections that wait for a request, which
	// the listeners close at client.max_conns to admit new ones; nil when
	// the limit is off.
	waiting *waitList

	// heldBodies counts the bytes of the bodies read whole to be judged
	// over max_streams_per_sandbox (overLimit), against HeldBodyBudget.
	heldBodies byteBudget
	// heldShare is Config.HeldBodyPerSandbox, or no bound when negative:
	// the most a sandbox's held bodies may take of heldBodies.
	heldShare int64
	// limitWaiting counts the requests waiting for a slot over
	// max_streams_per_sandbox now (waitForSlot).
	limitWaiting atomic.Int64
	// afterSlotWait, for tests, runs when a wait for a slot (waitForSlot)
	// has ended for the request to be judged again, before it is: the
	// moment in which another request may take the slot it saw free,
	// too short to hit from outside.
	afterSlotWait func()
	// beforePool, for tests, runs between serve's look at the sandbox's
	// state and the pool lookup of forward or tunnel, where a kill lands.
	beforePool func()
	// afterPool, for tests, runs once that lookup found the sandbox not
	// killed, before a connection is taken from the pool.
	afterPool func()
	// beforeRejudge, for tests, runs as rejudge begins to judge a
	// sandbox's open exchanges; nil in production.
	beforeRejudge func(id string)
	// afterHandOff, for tests, runs in splice between the hand-off of a
	// WebSocket's sandbox connection and its tunnel's listing, where no
	// list of its pool holds the exchange; nil in production.
	afterHandOff func()
	// beforeRetry, for tests, runs in roundTrip between the release of
	// a kept-alive connection the sandbox had closed and the checkout of
	// the retry's, where no list of the pool holds the exchange; nil in
	// production.
	beforeRetry func()
	// beforeCutEnd, for tests, runs as a request or a WebSocket tunnel the
	// proxy cut (its sandbox connection closed under it) begins to end,
	// while its pool still lists it; nil in production.
	beforeCutEnd func()

	clientWriteTimeout time.Duration // from ServerConfig
	clientBodyTimeout  time.Duration // from ServerConfig

	tel     *telemetry.Telemetry // nil: no tracing
	metrics *telemetry.Metrics   // nil-safe
	// traceFields are the trace-context headers (traceparent, tracestate)
	// the proxy sets in every request's head with tracing on, the
	// propagator's own list; nil with tracing off, when they pass as sent.
	traceFields []string

	staleLogged    atomic.Int64 // unix nanos of the last stale-route log line
	storeErrLogged atomic.Int64 // unix nanos of the last store-unavailable log line
	// unix nanos of the last "out of resources" line for a failed dial
	resourceErrLogged atomic.Int64
	loopLogged        atomic.Int64 // unix nanos of the last "route names the proxy" line
	tokenlessLogged   atomic.Int64 // unix nanos of the last "restricted route has no traffic token" line

	// listeners are the addresses this process listens on (Server adds
	// each): a sandbox connection that reaches one is the proxy dialing
	// itself (see dialedSelf). Written at startup, read on each new dial.
	listeners   atomic.Pointer[[]netip.AddrPort]
	listenersMu sync.Mutex

	idPrefix [9]byte // "<8 hex>-": instance part of generated request ids
	reqSeq   atomic.Uint64
}

// New returns a proxy that resolves routes through cache (in front of store).
func New(cfg Config, store routing.Store, cache *routing.Cache) (*Proxy, error) {
	if err := cfg.CheckHeldBodies(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	p := &Proxy{
		cfg:    cfg,
		parser: routing.NewParser(cfg.Parser),
		cache:  cache,
		store:  store,
		tel:    cfg.Telemetry,
	}
	p.heldBodies.max = cfg.HeldBodyBudget
	p.heldShare = cfg.HeldBodyPerSandbox
	if p.heldShare < 0 {
		p.heldShare = math.MaxInt64
	}
	if p.tel != nil {
		p.metrics = p.tel.Metrics
		if p.tel.TracingEnabled() {
			p.traceFields = p.tel.Propagator().Fields()
		}
		p.metrics.SetPoolStats(func() (int64, int64) {
			pools, idle := p.pools.gauges()
			return int64(pools), int64(idle)
		})
		p.metrics.SetHeldBodyBytes(p.heldBodies.used.Load)
	}
	p.pools = pools{cfg: &p.cfg, p: p, m: make(map[poolKey]*upstream)}
	p.pools.dialCtx, p.pools.cancelDials = context.WithCancel(context.Background())
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("request id prefix: %w", err)
	}
	hex.Encode(p.idPrefix[:8], rnd[:])
	p.idPrefix[8] = '-'
	return p, nil
}

// Handler serves one sandbox request: parse target, resolve route, check
// state, choose backend, forward. Every answer carries X-Cube-Request-Id.
func (p *Proxy) Handler(ctx *fasthttp.RequestCtx) {
	var x exchange
	p.handle(ctx, &x)
	letGoOfHead(ctx, x.seen.lines)
}

// letGoOfHead has a request head of lines lines that is more than a
// connection keeps let go of: one of more than maxHeaderLines now
// (shedHead), one of more than keptHeadLines lines or keptHeadBytes once
// its answer is written (headDrop). Every listener's handler calls it for
// every head it answered, refused or not: a refused head (its upload
// refused before its body, a bad target) stayed with the connection, or
// with its pooled context once the refusal closed it. So does a chunked
// body's trailer, parsed into the header and bounded only by
// client.max_header_size in bytes: a trailer of 6,000 "a:b" lines left
// ≈ 585 KiB with its idle connection. Its lines are not counted (fasthttp
// offers no count but through a walk per name), and clients rarely send
// one: any request that carried a trailer lets go of its header.
func letGoOfHead(ctx *fasthttp.RequestCtx, lines uint16) {
	switch {
	case lines > maxHeaderLines:
		shedHead(ctx)
	case lines > keptHeadLines || len(ctx.Request.Header.RawHeaders()) > keptHeadBytes || len(ctx.Request.Header.PeekTrailerKeys()) > 0:
		ctx.SetUserValue(headDropKey{}, (*headDrop)(ctx))
	}
}

// Expect judges the head of a request that sent "Expect: 100-continue"
// (fasthttp's ExpectHandler), before the client is asked for its body:
// 100 when nothing refuses it, and the request runs again as usual once
// fasthttp has the body; else the status of the refusal written in ctx,
// which fasthttp sends instead. An upload to an unknown, killed or paused
// sandbox, without its token, or over the size limit is refused before
// its body is sent, as by nginx or OpenResty, whose checks run before
// they read a body.
//
// A head that frames no body is not judged: fasthttp closes the
// connection after any answer but 100, and such a client has nothing to
// hold back. It gets the 100 (which RFC 9110 allows), then its answer on
// a connection that stays open, as before fasthttp had this hook.
func (p *Proxy) Expect(ctx *fasthttp.RequestCtx) int {
	if frameless(&ctx.Request.Header) {
		return sendContinue(ctx, p.clientWriteTimeout)
	}
	x := exchange{expecting: true}
	p.handle(ctx, &x)
	letGoOfHead(ctx, x.seen.lines)
	if x.admitted {
		return sendContinue(ctx, p.clientWriteTimeout)
	}
	return ctx.Response.StatusCode()
}

// sendContinue readies the connection for the "100 Continue" fasthttp
// writes once its ExpectHandler returns it, and returns that status.
// fasthttp writes it under whatever write deadline the connection's
// previous answer left (client.write_timeout from that answer): on a
// keep-alive connection idle longer than that, the deadline had passed,
// the write failed at once, and the client saw its connection close
// instead of the 100 (curl's upload, or a Go client's POST, failed).
func sendContinue(ctx *fasthttp.RequestCtx, writeTimeout time.Duration) int {
	renewWriteDeadline(ctx, writeTimeout)
	return fasthttp.StatusContinue
}

// errManyLines refuses a head of more than maxHeaderLines lines.
var errManyLines = proxyError{status: 431, code: CodeHeaderTooLarge, msg: fmt.Sprintf("more than %d header lines", maxHeaderLines)}

// shedHead lets go of the parsed lines of a refused head (more than
// maxHeaderLines lines, or one fasthttp refused, maybe after parsing
// thousands of lines before its bad one), once its answer is decided and
// logged, and ends its connection. fasthttp keeps a connection's parsed
// head for its next requests, and, once it closes, for whichever
// connection takes its pooled context next: 200 connections idle after
// one request each held ≈ 550 KiB each when 200 heads of 6,000 short
// lines and a malformed one had been refused just before. What fasthttp
// reads of the head after the handler (after an Expect refusal: whether
// it is a HEAD, whose answer has no body, and its version) is set again.
func shedHead(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	head, http10 := h.IsHead(), !h.IsHTTP11()
	*h = fasthttp.RequestHeader{}
	if head {
		h.SetMethod(fasthttp.MethodHead)
	}
	if http10 {
		h.SetProtocol("HTTP/1.0")
	}
	h.SetConnectionClose()
	ctx.Response.SetConnectionClose()
}

// handle runs one exchange through the pipeline and finishes what the
// handler owns of it: the request, or an Expect head alone (x.expecting).
func (p *Proxy) handle(ctx *fasthttp.RequestCtx, x *exchange) {
	settleHost(&ctx.Request.Header)
	p.begin(ctx, x, &p.conns)
	var idBuf [maxRequestIDLen]byte
	// Set on the request too: a head admitted by Expect runs again under
	// the same id.
	reqID := p.requestID(&ctx.Request.Header, idBuf[:0])
	x.noteRequestID(reqID)
	p.serve(ctx, x)
	p.letGoHeldBody(ctx, x) // if forward did not get to send it
	if x.admitted {
		// The head's lookup is the request's: the one after its body
		// finds what this one cached, and would count a miss as a hit.
		ctx.SetUserValue(headLookup{}, x.cache)
		if !x.limitUntil.IsZero() {
			// The head waited for a slot: the body's run has what is
			// left of that wait (waitForSlot). Only a head that waited
			// pays for the boxed time.
			ctx.SetUserValue(headWaitEnd{}, x.limitUntil)
		}
		x.releaseFwd()
		return
	}
	if x.expecting {
		// Counted only for a refusal: an admitted head's lookup is
		// counted when the request runs.
		p.metrics.CacheLookup(x.cache)
		if p.tel != nil && p.tel.TracingEnabled() {
			// Opened only now that the head is refused, but from its
			// start: the span covers the lookup that decided it.
			x.spanCtx, x.span = p.tel.StartServerSpanAt(&ctx.Request.Header, ctx.IsTLS(), remoteIP(ctx), x.start)
		}
	}
	if !ctx.Hijacked() && (x.expecting || x.answeredEarly && !x.bodyEnded || !x.owned && !ctx.Response.ConnectionClose() && bodyLeft(ctx, x)) {
		// Answered before the client sent its body (a refusal, a paused
		// sandbox, a gateway's 401 from the head alone): fasthttp would
		// close at once, and a client still sending gets a reset instead
		// of the answer. A sandbox that answered before it had the whole
		// body has its connection closed, so even a little left of the
		// body is not read by fasthttp to keep the client's. Its answer
		// may stream (chunked, as Node's res.end after writeHead, or sized
		// over wholeBody): lingerBody writes that stream as fasthttp would,
		// and the stream, which owns the exchange, still finishes it. A
		// client that expected 100 may have stopped waiting for it.
		p.lingerBody(ctx)
	}
	// Read once: the close below and the logging after the write must
	// agree, or a drain that begins between two reads would log after the
	// write an answer whose connection it did not mark to close.
	draining := p.draining != nil && p.draining.Load()
	if draining && !ctx.Hijacked() {
		// fasthttp closes a connection whose request ends during its
		// Shutdown, but only until the drain deadline: then it stops
		// waiting and serves the connections still busy as keep-alive
		// ones again, after Server.Shutdown returned, for as long as
		// their clients keep sending.
		ctx.SetConnectionClose()
	}
	setResponseID(&ctx.Response.Header, reqID)
	p.headersReady(ctx, x)
	if !x.owned {
		if draining && !ctx.Hijacked() && !x.expecting {
			// The drain deadline may cut the write (conns.cutWrites):
			// finished once it is over (writtenAnswer).
			p.finishWritten(ctx, x)
			return
		}
		// Logged (and counted, and the span ended) before fasthttp writes
		// the answer, once the handler returns: a write the client cuts
		// (a reset, client.write_timeout) is logged as the answer sent,
		// with its whole body. fasthttp reports nothing of that write
		// that the line could wait for without a lock or a copy per
		// request; see README, Decisions ("logged before fasthttp writes
		// it").
		p.finish(ctx, x, ctx.Response.StatusCode(), nil, nil)
	}
}

// headLookup keys, in the RequestCtx of a request whose "Expect:
// 100-continue" head was admitted, the cache result of the head's lookup
// (a telemetry.CacheResult). fasthttp resets user values with the request.
type headLookup struct{}

// headWaitEnd keys, in the RequestCtx of a request whose "Expect:
// 100-continue" head waited for a slot over max_streams_per_sandbox and
// was then admitted, the end of that wait (a time.Time, the head's
// exchange.limitUntil): the head and its body are one request, whose
// waits together take stream_limit_wait at most.
type headWaitEnd struct{}

// frameless reports whether a request head frames no body: Content-Length
// 0, or neither Content-Length nor Transfer-Encoding (fasthttp's -2).
func frameless(h *fasthttp.RequestHeader) bool {
	cl := h.ContentLength()
	return cl == 0 || cl == -2
}

// HeaderRequestID is echoed (or generated) on every request and response.
const HeaderRequestID = "X-Cube-Request-Id"

// setResponseID makes id the response's only request id line: the
// sandbox's answer may carry its own (an app echoing the id it got, or
// one of its own), which would reach the client beside the proxy's, and a
// client reading the last line would log another id than the access log.
// Deleting the sandbox's line moves the head's last line into its place
// (fasthttp's swap delete), so the head's repeated fields are kept in
// order around it. Most answers carry none, and pay one walk of the head.
func setResponseID(h *fasthttp.ResponseHeader, id []byte) {
	switch ids := h.PeekAll(HeaderRequestID); {
	case len(ids) == 1 && bytes.Equal(ids[0], id):
		return // set already (captureEntry, then the handler's end)
	case len(ids) > 0:
		order := lineOrders.Get().(*lineOrder)
		order.rememberResponse(h)
		h.Del(HeaderRequestID)
		order.restore(h)
		order.release()
	}
	h.AddBytesV(HeaderRequestID, id)
}

const maxRequestIDLen = 128

func (p *Proxy) serve(ctx *fasthttp.RequestCtx, x *exchange) {
	h := &ctx.Request.Header
	// Counted first: the handler lets go of a head of many lines by its
	// count (letGoOfHead), a refused one too.
	x.seen = scanHead(h)
	if e := refusedRequestLine(h); e != nil {
		x.fail(ctx, *e, nil)
		if e == &errBadVersion {
			ctx.SetConnectionClose() // after fail: writeError resets the response
		}
		return
	}
	if e := refusedTarget(h.RequestURI()); e != nil {
		// "/../etc/passwd", "/a%00": nginx refuses them, so the platform's
		// sandboxes never got one, and a server that joins the path to a
		// directory would serve what is above it, or a file name cut at
		// the NUL.
		x.fail(ctx, *e, nil)
		return
	}
	if x.seen.transferEncoding && h.ContentLength() != -1 {
		// "Transfer-Encoding: identity": fasthttp takes it for no coding
		// at all and frames the body by Content-Length, or reads none and
		// would take the body for the next request. A front proxy that
		// reads the coding otherwise disagrees on where requests end: a
		// request smuggled past it. RFC 9112 6.3: 400, and close.
		x.fail(ctx, proxyError{status: 400, code: CodeBadRequest, msg: "Transfer-Encoding other than chunked"}, nil)
		ctx.SetConnectionClose() // after fail: writeError resets the response
		return
	}
	if x.seen.hop && tooManyConnectionOptions(h.PeekAll("Connection")) {
		// Removing what they name would cost a pass over every header each.
		x.fail(ctx, proxyError{status: 400, code: CodeBadRequest, msg: fmt.Sprintf("Connection lists more than %d options", maxConnectionOptions)}, nil)
		return
	}
	if x.seen.spaceNames > maxInvalidNames {
		// Dropping each would cost a walk over every header.
		x.fail(ctx, proxyError{status: 400, code: CodeBadRequest, msg: fmt.Sprintf("more than %d header names hold a space", maxInvalidNames)}, nil)
		return
	}
	if x.seen.lines > maxHeaderLines {
		// Handler and Expect let go of the lines (shedHead).
		x.fail(ctx, errManyLines, nil)
		return
	}
	var t routing.Target
	if err := p.parser.ParseRequest(&t, h.Host(), h.RequestURI(), h); err != nil {
		var te *routing.TargetError
		if errors.As(err, &te) {
			x.fail(ctx, proxyError{status: 400, code: te.Code, msg: te.Reason}, nil)
		} else {
			x.fail(ctx, proxyError{status: 400, code: CodeBadRequest, msg: "invalid sandbox target"}, nil)
		}
		return
	}
	id := t.ID()
	x.port = t.Port

	// again: the route is being looked up again, after a wait for a slot
	// or a held body's read (see below); the lookup that counts is the
	// first. reread: after a held body's read, which happens once.
	again, reread := false, false
	// readAt: when the store read this pass goes by began, which is what
	// forget compares a pause's time with (routeError). The first pass's
	// is the request's start; a pass after a wait or a held read stamps
	// its own.
	readAt := x.start
lookup:
	// Not ctx: fasthttp cancels every RequestCtx when a drain starts, and a
	// request already in flight is to be answered. The cache bounds the
	// lookup itself (LookupTimeout). The count of announced route changes
	// first: a change announced after it is judgeLate's to find.
	x.changes = p.cache.Changes()
	route, res, err := p.cache.Get(context.Background(), id)
	if !again {
		x.cache = cacheResult(res)
	}
	if !x.expecting && !again {
		// Only a head that carried an Expect line can have been admitted
		// by Expect: other requests skip the user value lookup.
		if x.seen.expect {
			if r, ok := ctx.UserValue(headLookup{}).(telemetry.CacheResult); ok {
				x.cache = r // admitted by Expect: its head's lookup
			}
		}
		p.metrics.CacheLookup(x.cache)
	}
	if err != nil {
		p.routeError(ctx, x, err, id, res, readAt)
		return
	}
	x.sandboxID = route.ID
	if res == routing.CacheStale {
		p.logStale(route.ID)
	}

	// The proxy's own credential, before anything with side effects.
	if p.authorize(ctx, x, route, &t) {
		return
	}

	sb := p.sandboxes.get(id)
	var addr netip.AddrPort
	for {
		switch st := sb.state(); st {
		case statePausing, statePaused:
			// A sandbox created after the pause (same id, new CreatedAt)
			// is a new sandbox, as after a kill.
			if p.sandboxes.outlive(sb, st, route.CreatedAt) {
				continue
			}
			if st == statePausing {
				x.fail(ctx, proxyError{status: 503, code: CodeSandboxPausing, msg: "sandbox is pausing", retryAfter: 1}, id)
			} else {
				x.fail(ctx, proxyError{status: 503, code: CodeSandboxPausing, msg: "sandbox is paused; resume it and retry", retryAfter: 1}, id)
			}
			return
		case stateKilled:
			// A sandbox created after the kill (same id, new CreatedAt) is a
			// new sandbox: its route is served and the tombstone forgotten.
			if !p.sandboxes.unkill(sb, route.CreatedAt) {
				x.fail(ctx, errKilled, id)
				return
			}
			// Look again: another change (a pause, a forget) may have
			// come since.
			continue
		}

		var perr *proxyError
		addr, perr = p.backend(route, t.Port)
		x.backendIP = addr.Addr() // x.upstream waits for the dial (startUpstream)
		if perr != nil {
			x.fail(ctx, *perr, id)
			return
		}

		n, ok := sb.enter()
		if !ok {
			// Forgotten since get (its route deleted, or idle a day):
			// counted there, the request would count for no other. The
			// entry that replaces it may say killed or paused.
			sb = p.sandboxes.get(id)
			continue
		}
		if lim := p.cfg.MaxStreamsPerSandbox; lim > 0 && n > int64(lim) {
			// A body declared over max_request_body gets its 413 here as
			// below the limit: a 429 told the client to retry a request
			// that can never pass, and at a limit its own streams hold
			// (a session's GET) every retry was a 429 again.
			if perr := p.bodyTooLarge(h); perr != nil {
				sb.leave()
				if !x.expecting {
					p.lingerBody(ctx) // as forward's 413: the body is unread
				}
				x.fail(ctx, *perr, id)
				return
			}
			if refusal := p.overLimit(ctx, x, sb, n, lim); refusal != nil {
				sb.leave()
				slot, gone := p.waitForSlot(ctx, x, sb, lim, refusal)
				if gone {
					// Nobody reads the 429 (a client that only
					// half-closed might): the log says why, as nginx's
					// 499.
					x.fail(ctx, proxyError{status: 499, code: CodeClientClosed, msg: "client closed the connection while the request waited for a slot"}, id)
					ctx.SetConnectionClose()
					return
				}
				if slot {
					if p.afterSlotWait != nil {
						p.afterSlotWait()
					}
					// A slot came free (or the state changed): judged
					// again as a new request, which may find the slot
					// taken again by another (and then waits on, until
					// its first wait's end). From the route: it may
					// have been deleted or moved during the wait (up to
					// stream_limit_wait, which an operator may make
					// long), and the address looked up before may
					// already be another sandbox's.
					again, readAt = true, time.Now()
					goto lookup
				}
				x.fail(ctx, *refusal, id)
				if refusal.status != fasthttp.StatusTooManyRequests {
					// The body broke off while overLimit read it: the
					// rest of it cannot be found on the connection.
					ctx.SetConnectionClose() // after fail: writeError resets the response
				}
				return
			}
			if x.held > 0 && !reread {
				// The body took its time to come (client.body_timeout
				// bounds each wait, not the read): the route and the
				// sandbox's state are looked up again, and the request
				// is answered as a new one would be. A route deleted or
				// changed meanwhile (the admin API invalidates the
				// cache) is a 404 or a new address, not the address
				// looked up before the read, which may already be
				// another sandbox's; a sandbox paused or killed is a 503
				// or 410 (the kill cut nothing of the request, which had
				// no sandbox connection yet). The body stays in memory,
				// its room taken on the entry it was read for
				// (x.heldOn): over the limit again, overLimit judges it
				// there, and reads nothing.
				sb.leave()
				again, reread, readAt = true, true, time.Now()
				goto lookup
			}
		}
		break
	}
	if x.expecting {
		// The head alone passes; what is left to refuse before the body
		// is its declared size. The request runs again with its body.
		sb.leave()
		if perr := p.bodyTooLarge(h); perr != nil {
			x.fail(ctx, *perr, id)
			return
		}
		x.admitted = true
		return
	}
	sb.lastActive.Store(x.start.UnixMilli())

	// Only a request without a body can switch protocols here: the tunnel
	// sends the head alone. Others (curl's "Upgrade: h2c" on a POST), and
	// upgrades the tunnel does not take (switchable), go through forward,
	// which drops Upgrade as a hop-by-hop header.
	if frameless(h) && upgradeRequested(h) && switchable(h) {
		p.tunnel(ctx, x, route, &t, addr, sb)
		return
	}
	p.forward(ctx, x, route, &t, addr, sb)
}

// logStale notes that a route was served past its TTL because the store
// is failing; at most once a second, so an outage does not flood the log.
func (p *Proxy) logStale(id string) {
	if !everySecond(&p.staleLogged) {
		return
	}
	p.cfg.Logger.Warn("route store failing; serving cached route past its TTL", "sandbox_id", id)
}

// everySecond reports whether a line last logged at *last (unix nanos) may
// be logged again now, and if so records now.
func everySecond(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	l := last.Load()
	return now-l >= int64(time.Second) && last.CompareAndSwap(l, now)
}

// routeError answers a failed route lookup; res is that lookup's cache
// result and readAt when it began.
func (p *Proxy) routeError(ctx *fasthttp.RequestCtx, x *exchange, err error, id []byte, res routing.CacheResult, readAt time.Time) {
	// The id the client asked for, so that the access log says which
	// sandbox was not found (the copy is on this error path only).
	x.sandboxID = string(id)
	var fe *routing.FieldError
	switch {
	case errors.Is(err, routing.ErrNotFound):
		if sb := p.sandboxes.peek(x.sandboxID); sb != nil {
			if sb.state() == stateKilled {
				x.fail(ctx, errKilled, id)
				return
			}
			// The store itself says the route is gone (not the negative
			// cache, which may predate a route written since): the
			// sandbox was removed without meta/delete, as the control
			// plane does in Redis. Its entry is forgotten, as DELETE
			// /admin/routes forgets it: a paused entry is never swept, a
			// running one only a day after its last request, and a
			// sandbox created again under the id is a new one.
			// This lookup's own result and time, not the request's
			// first: after a held read or a wait for a slot the first
			// may have been a hit, and a pause set since the request
			// began predates this read.
			if res == routing.CacheMiss {
				p.sandboxes.forget(x.sandboxID, readAt.UnixNano())
			}
		}
		x.fail(ctx, proxyError{status: 404, code: CodeNotFound, msg: "sandbox not found"}, id)
	case errors.As(err, &fe):
		// Once per store read: the requests that waited on it and the
		// negative cache's hits after it all get this same error. err
		// names the store's key (the legacy one, say), which the operator
		// has to fix.
		if fe.FirstReport() {
			p.cfg.Logger.Warn("invalid route data", "sandbox_id", string(id), "field", fe.Field, "reason", fe.Reason, "err", err)
		}
		x.fail(ctx, proxyError{status: 404, code: CodeRouteInvalid, msg: "sandbox route is invalid (field " + fe.Field + ")"}, id)
	default:
		// Once a second: while the store is down every request for an
		// uncached sandbox fails, and the access log and the store error
		// metric count them all. A Redis connection the proxy could not
		// open for want of its own descriptors is its own shortage, as
		// for a sandbox connection: "routing table unavailable" sent the
		// operator to a Redis that was fine. Not EADDRNOTAVAIL, which a
		// sandbox's dial counts: Redis is often named by a host name, and
		// a down Redis whose name resolves to ::1 first, on a host without
		// IPv6, fails with it too.
		short := resourceExhausted(err)
		switch {
		case short && everySecond(&p.resourceErrLogged):
			p.cfg.Logger.Error("cannot connect to the route store: proxy out of resources (descriptors or memory)",
				"sandbox_id", string(id), "err", err, "open_files_limit", openFilesLimit())
		case !short && everySecond(&p.storeErrLogged):
			p.cfg.Logger.Error("route store unavailable", "sandbox_id", string(id), "err", err)
		}
		if sb := p.sandboxes.peek(x.sandboxID); sb != nil && sb.state() == stateKilled {
			// meta/delete dropped the cached route, so a killed sandbox's
			// next request reads the store: while Redis was down that was
			// a 503 with Retry-After, and the clients the kill cut off
			// retried it for the whole outage instead of learning of the
			// kill. Only a route with a later CreatedAt lifts the kill,
			// and the store cannot show one now.
			x.fail(ctx, errKilled, id)
			return
		}
		if short {
			x.fail(ctx, proxyError{status: 503, code: CodeOutOfResources, msg: "proxy is out of resources; retry shortly", retryAfter: 1}, id)
			return
		}
		x.fail(ctx, proxyError{status: 503, code: CodeStoreUnavailable, msg: "routing table unavailable", retryAfter: 1}, id)
	}
}

// backend chooses the address to dial: the sandbox itself when it runs on
// this node, else the node that runs it through the mapped host port. Only
// addresses a route names are ever dialed.
func (p *Proxy) backend(r *routing.Route, port uint16) (netip.AddrPort, *proxyError) {
	hostPort, ok := r.HostPort(port)
	if !ok {
		return netip.AddrPort{}, &proxyError{status: 404, code: CodePortNotMapped, msg: fmt.Sprintf("port %d is not exposed by this sandbox", port)}
	}
	if p.cfg.NodeIP.IsValid() && r.HostIP == p.cfg.NodeIP {
		if !r.SandboxIP.IsValid() {
			return netip.AddrPort{}, &proxyError{status: 404, code: CodeRouteInvalid, msg: "route has no SandboxIP for a sandbox on this node"}
		}
		return netip.AddrPortFrom(r.SandboxIP, port), nil
	}
	return netip.AddrPortFrom(r.HostIP, hostPort), nil
}

// forward sends the request to addr and streams the response back.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, x *exchange, r *routing.Route, t *routing.Target, addr netip.AddrPort, sb *sandboxState) {
	req := &ctx.Request
	if perr := p.prepareRequest(ctx, x.seen, r, t, false); perr != nil {
		sb.leave()
		if perr.status == 413 {
			p.lingerBody(ctx)
		}
		x.fail(ctx, *perr, t.ID())
		return
	}

	if target := req.Header.RequestURI(); len(target) > 0 && target[0] == '/' {
		// Origin form (what browsers and SDKs send) goes on byte for
		// byte. Request.Write rebuilds the target from a parsed URI: one
		// parsed for a signed token (QueryArgs) had its query re-encoded
		// ("q=a%20b" as "q=a+b"), and fasthttp reads "//x?u=https://y" as
		// an absolute target, so the sandbox got "/?u=https://y". Setting
		// the target drops the parsed URI; it copies in place.
		req.SetRequestURIBytes(target)
	} else {
		// Absolute form: the path and query alone, as the sandbox serves
		// them, without path normalisation, and the Host header (set
		// above) rather than the parsed URI's host.
		uri := freshURI(req)
		uri.DisablePathNormalizing = true
		// Request.Write turns an absolute-form target's userinfo
		// ("GET http://user:pw@host/p") into an Authorization header; that
		// header is the sandbox's business and must arrive as the client
		// sent it, or not at all.
		uri.SetUsernameBytes(nil)
		uri.SetPasswordBytes(nil)
	}
	// The backend is spoken to in HTTP/1.1 whatever the client spoke (an
	// HTTP/1.0 client's connection handling is the proxy's business); the
	// client's version comes back before the response is framed for it.
	http10 := !req.Header.IsHTTP11()
	if http10 {
		req.Header.SetProtocolBytes(http11)
	}
	u := p.pool(r, addr, x, sb)
	if u == nil {
		sb.leave()
		x.fail(ctx, errKilled, t.ID())
		return
	}
	p.startUpstream(ctx, x, addr)
	resp := &ctx.Response
	body, _ := req.BodyStream().(*clientBody)
	c, err := p.roundTrip(x, u, grant{route: r, port: t.Port, via: x.via, changes: x.changes}, req, resp, p.headerTimeout(&req.Header), ctx.Conn())
	x.answeredEarly = err == nil && c.answered.Load()
	// Sent (a POST is never sent again): a body overLimit holds is not
	// kept for as long as the answer streams.
	p.letGoHeldBody(ctx, x)
	if http10 {
		req.Header.SetProtocolBytes(http10Proto)
	}
	if body != nil {
		// What the client sent (a chunked body has no Content-Length to say).
		// Without one there was no body: req.Body() would drain fasthttp's
		// (empty) body stream on every GET just to say so.
		x.bytesIn, x.bodyEnded = body.bytesRead()
	}
	if err == nil && resp.StatusCode() == fasthttp.StatusSwitchingProtocols {
		// Nobody asked to switch (upgrades go through tunnel): the bytes
		// after this head are in an unknown protocol.
		c.release(p, false)
		err = errUnaskedSwitch
	}
	if err != nil {
		sb.leave()
		if errors.Is(err, errBodyTooLarge) || malformedBody(err) {
			p.lingerBody(ctx)
		}
		p.upstreamError(ctx, x, err, t.ID(), addr)
		return
	}
	if c.manyLines {
		ctx.SetUserValue(headDropKey{}, (*headDrop)(ctx))
	}
	scopeSetCookies(&resp.Header, clientHost(&req.Header, masksHost(r, t.Port)))
	p.respond(ctx, x, c, t, addr, sb)
}

// errKilled is the answer to a request for a killed sandbox.
var errKilled = proxyError{status: 410, code: CodeSandboxKilled, msg: "sandbox was killed"}

// errRevoked and errMoved answer a request a route change cut while it
// waited for its answer (rejudge): its credential no longer passes, or the
// route no longer sends its port to the backend it was sent to.
var (
	errRevoked = proxyError{status: 403, code: CodeCredentialRevoked, msg: "the credential this request came with was revoked by a change of the sandbox's route"}
	errMoved   = proxyError{status: 502, code: CodeRouteChanged, msg: "the sandbox's route changed while the request waited for its answer"}
)

// pool returns the pool of r's connections to addr, or nil when the
// sandbox was killed since serve found it running (sb, which the request
// is counted on). pools.kill marks the pools it takes out of the map, so
// that what is checked out of them later fails; a request that looked the
// pool up only after that made a fresh one under the old sandbox's key,
// unmarked, and was sent to the dead VM after meta/delete had answered.
// The kill's state is set before its pools go (Proxy.kill): a lookup that
// missed them finds the kill here. The pool just made is killed again, or
// it would stay until the sweep.
func (p *Proxy) pool(r *routing.Route, addr netip.AddrPort, x *exchange, sb *sandboxState) *upstream {
	if p.beforePool != nil {
		p.beforePool()
	}
	u := p.pools.get(poolKey{id: r.ID, createdAt: r.CreatedAt, addr: addr}, x.start.UnixNano())
	// changedAt after the state, as unkill reads them. A route newer
	// than the kill is a sandbox created again, whose pools the kill
	// leaves alone; it is served without lifting the kill here, from a
	// route read before the kill (serve lifts it for a route read after).
	if sb.state() == stateKilled {
		if killedAt := sb.changedAt.Load(); r.CreatedAt <= killedAt {
			p.pools.kill(r.ID, killedAt)
			return nil
		}
	}
	if p.afterPool != nil {
		p.afterPool()
	}
	return u
}

// errUnaskedSwitch is a 101 answer to a request that asked for no upgrade.
var errUnaskedSwitch = errors.New("unrequested 101 Switching Protocols")

// errTooManyConnectionOptions is an answer whose Connection lines list more
// than maxConnectionOptions options.
var errTooManyConnectionOptions = fmt.Errorf("response Connection lists more than %d options", maxConnectionOptions)

// respond relays the response whose head is in ctx.Response and whose body
// is still on c: small bodies whole, the rest as a stream. It ends the
// exchange's hold on c and on the sandbox's request count, now or when
// the stream ends.
func (p *Proxy) respond(ctx *fasthttp.RequestCtx, x *exchange, c *upstreamConn, t *routing.Target, addr netip.AddrPort, sb *sandboxState) {
	req, resp := &ctx.Request, &ctx.Response
	x.upStatus = resp.StatusCode()
	x.upTime = time.Since(x.start)
	x.kind = telemetry.RouteHTTP
	keepAlive := !resp.Header.ConnectionClose()
	size := int64(resp.Header.ContentLength())
	if err := removeHopResponse(&resp.Header, false); err != nil {
		c.release(p, false)
		sb.leave()
		p.upstreamError(ctx, x, err, t.ID(), addr)
		return
	}
	if !req.Header.IsHTTP11() {
		// No transfer coding means anything to an HTTP/1.0 client (a HEAD
		// answer would still list the backend's).
		delResponseField(&resp.Header, fasthttp.HeaderTransferEncoding)
	}
	// The client gets HTTP/1.1 framing whatever the backend spoke (an
	// HTTP/1.0 status line with a chunked body would be read as data).
	if !resp.Header.IsHTTP11() {
		resp.Header.SetProtocol(http11)
	}

	if req.Header.IsHead() || noBody(x.upStatus) {
		// The head is the whole answer; the connection is free again. A
		// backend that declared a body here may send one all the same
		// (Python's http.server with do_HEAD = do_GET), maybe after the
		// proxy has answered: the connection is checked before its next
		// use (acquire), or those bytes would be read as the next request's
		// answer.
		resp.SkipBody = true
		c.release(p, keepAlive)
		// Activity is dated by the answer, as a stream's is by its end: a
		// request the sandbox took minutes to answer (a tool call, an
		// upload) was activity all along, and an idle reaper polling
		// last_active must not find the sandbox idle since it began.
		sb.done(x.start.Add(x.upTime).UnixMilli())
		return
	}
	if size >= 0 && size <= wholeBody {
		// Small bodies are read whole and go out with the head in one write
		// (a writev when they outgrow the write buffer); the connection is
		// back in the pool before the client is answered. A client that
		// leaves while a sandbox is slow to send such a body ends the
		// exchange, as one that leaves before the head does (and as nginx
		// ends it): once the body has been awaited clientCheck since the
		// head came, its socket is watched. A body that came with its head
		// (nearly every small answer) arms nothing: arming and ending the
		// watch on every answer cost ≈ 2 % of a small request's CPU.
		watch := c.br.Buffered() < int(size)
		if watch {
			c.watchClientAfter(ctx.Conn(), nil, x.start.Add(x.upTime))
		}
		err := readWholeBody(ctx, c.br, int(size))
		x.bytesOut = size
		if watch && c.endClientWait() {
			err = errClientLeft
		} else if err != nil && c.interrupted.Load() {
			err = c.cutErr()
		}
		c.release(p, err == nil && keepAlive)
		sb.done(x.start.Add(x.upTime).UnixMilli())
		if err != nil {
			p.upstreamError(ctx, x, err, t.ID(), addr)
		}
		return
	}

	if size == -1 {
		// A chunked body broken before its first data byte, in the bytes
		// that came with the head, would fail the first read with the head
		// still unsent (fasthttp holds it for the data it seems to
		// announce): the client would get nothing it could read, and the
		// log a 200. Nothing has gone out, so the answer is a 502, as for a
		// small body that breaks off.
		cr := chunkedReader{br: c.br}
		if err := cr.framingError(); err != nil {
			c.release(p, false)
			sb.done(x.start.Add(x.upTime).UnixMilli())
			p.upstreamError(ctx, x, err, t.ID(), addr)
			return
		}
	}
	s := bodyStreamPool.Get().(*bodyStream)
	s.p = p
	s.conn = c
	s.keepAlive = keepAlive
	switch {
	case size >= 0:
		s.mode, s.left, s.fixed = bodyFixed, size, true
	case size == -1:
		s.mode = bodyChunked
		s.chunked.reset(c.br)
	default:
		s.mode = bodyUntilClose
	}
	if size < 0 {
		size = -1 // chunked or close-delimited: unknown length, sent chunked
	}
	// The head goes out at once rather than with the first body byte (an
	// SSE or MCP GET stream may be silent for a long time), unless body
	// bytes came with it: then head and first chunk leave in one write. A
	// fixed-length body always goes out behind a flushed head, because
	// WriteTo writes it straight to the connection.
	resp.ImmediateHeaderFlush = s.fixed || !s.bodyReady()
	s.sse = isEventStream(resp.Header.ContentType())
	if s.sse {
		x.kind = telemetry.RouteSSE
		s.resumable = req.Header.IsGet()
		s.probing = s.resumable
	}
	// Every body relayed as it comes is an open stream while it lasts (a
	// drain waits for it), a download of known size too.
	x.stream = true
	x.sized = s.fixed
	x.owned = true
	s.x = *x
	s.rc = ctx
	s.heartbeat = p.cfg.HeartbeatInterval
	if ce := resp.Header.ContentEncoding(); len(ce) > 0 && string(ce) != "identity" {
		// A compressed event stream (Node's compression() gzips them) has
		// no place for a plain-text comment: one would break the client's
		// decoder. The hangups watch (Linux) still finds a client that left.
		s.heartbeat = 0
	}
	s.atBoundary = true
	s.started = time.Now()
	s.sb = sb
	s.client = ctx.Conn()
	// Any streamed body may fall silent for long (a command's output, a long
	// poll, a download generated as it is sent), not only an event stream:
	// its client's hang-up must end it at once, as it ends a direct request.
	// An event stream is watched from the start (it is long-lived by
	// nature); any other body only once it has lasted clientCheck, so that
	// the many short chunked answers never pay the watch's epoll_ctl calls.
	if s.sse {
		s.hupKey = p.hangups.watch(s.client, s)
	} else {
		c.watchClientAfter(s.client, s, s.started)
	}
	if p.clientWriteTimeout > 0 {
		s.writeTimeout = p.clientWriteTimeout
		s.clientDeadline = s.started.Add(p.clientWriteTimeout)
		_ = ctx.SetWriteDeadline(s.clientDeadline)
	}
	if detachable(req, s) {
		x.headLater = true // the hijack writes the head (detach.go)
		p.detach(ctx, s)
		return
	}
	p.streams.add(s)
	resp.SetBodyStream(s, int(size))
}

var (
	http11      = []byte("HTTP/1.1")
	http10Proto = []byte("HTTP/1.0")
)

// wholeBody is the largest fixed-length response body read whole before
// answering. For such a body a read into the pooled response body and one
// writev cost less proxy CPU than splice(2) through a pipe (lab: 29.8 vs
// 31.1 µs per 64 KiB response). The limit bounds what one exchange holds in
// memory, and the platform's proxy (proxy_buffering on, 64 KiB buffers)
// delays a body of this size as much anyway.
const wholeBody = 64 << 10

// noBody reports whether a status forbids a response body (RFC 9110 6.4.1).
func noBody(status int) bool {
	return status < 200 || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified
}

// readWholeBody reads exactly n body bytes from br into ctx's response
// body. What br holds is copied; the rest is read from the socket straight
// into the body (bufio reads past its buffer when asked for more than it
// holds). A body over keptBody goes into a lent buffer.
func readWholeBody(ctx *fasthttp.RequestCtx, br *bufio.Reader, n int) error {
	resp := &ctx.Response
	var b []byte
	if n > keptBody {
		l := lentBodyPool.Get().(*lentBody)
		l.resp, l.kept = resp, resp.SwapBody(nil)
		b = l.buf[:n]
		ctx.SetUserValue(lentBodyKey{}, l)
	} else {
		b = slices.Grow(resp.SwapBody(nil)[:0], n)[:n]
	}
	_, err := io.ReadFull(br, b)
	resp.SwapBody(b)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // the backend closed before Content-Length bytes
	}
	return err
}

// keptBody is the largest answer body read into the response's own
// buffer. fasthttp keeps that buffer with the client connection between
// requests, so an idle keep-alive connection held the largest body it was
// answered with: ≈ 120 KiB counted per idle connection after a 64 KiB
// answer, against ≈ 53 KiB after a small one, twice README's sizing.
const keptBody = 8 << 10

// lentBody is a buffer lent to one answer's body, larger than keptBody,
// and given back once the answer is written: fasthttp closes a request's
// io.Closer user values when it resets the request, after writing the
// answer and before resetting the response.
type lentBody struct {
	buf  []byte // wholeBody bytes
	resp *fasthttp.Response
	kept []byte // the response's own buffer, given back to it
}

// lentBodyKey keys the request's lentBody among its user values.
type lentBodyKey struct{}

var lentBodyPool = sync.Pool{New: func() any { return &lentBody{buf: make([]byte, wholeBody)} }}

// Close gives the response its own buffer back and the lent one to the
// pool. A response reset that released its buffer to fasthttp's pool on
// the way (a server with ReduceMemoryUsage) may have left the lent one
// there: then it is not pooled again, so that no two owners share it.
func (l *lentBody) Close() error {
	b := l.resp.SwapBody(l.kept)
	l.resp, l.kept = nil, nil
	if cap(b) == wholeBody && &b[:1][0] == &l.buf[0] {
		lentBodyPool.Put(l)
	}
	return nil
}

// keptHeadLines is the most lines a sandbox's answer head may have for
// the client connection to keep its parsed form. fasthttp keeps a
// response header's storage (a line's key and value, ≈ 115 bytes a short
// line) from one answer to the next, and with the request's context from
// one connection to the next: after one answer of 2,500 short lines,
// every connection that later took that context from fasthttp's pool, its
// own answers small, from any sandbox, counted ≈ 366 KiB while it idled.
const keptHeadLines = 64

// keptHeadBytes is the largest request head whose parsed form a client
// connection keeps (its lines' copies and the raw head): 1,000 connections
// that each sent a head of 990 short lines and closed left 1,000 later
// connections counting ≈ 135 KiB each for their one-line requests.
const keptHeadBytes = 8 << 10

// headDrop lets go of the storage of a request's headers, its own and its
// answer's, once its answer is written: fasthttp closes a request's io.Closer user values
// when it resets the request, after writing the answer (or releasing a
// hijacked connection's context) and before resetting the response. The
// header starts afresh; only a request after an answer of more than
// keptHeadLines lines pays for it.
type headDrop fasthttp.RequestCtx

// headDropKey keys the request's headDrop among its user values.
type headDropKey struct{}

// Close gives the request and the response fresh headers, whose old
// storage the collector takes. fasthttp is done with both: what it needs
// of the request's head for the connection's next request (keep-alive)
// it took before writing the answer.
func (d *headDrop) Close() error {
	ctx := (*fasthttp.RequestCtx)(d)
	ctx.Request.Header = fasthttp.RequestHeader{}
	ctx.Response.Header = fasthttp.ResponseHeader{}
	return nil
}

// prepareRequest turns the client's request into the backend's, in place:
// hop-by-hop headers out, forwarding headers in, Host kept or masked,
// body capped. Everything else (Authorization, cookies, Mcp-Session-Id...)
// passes untouched.
func (p *Proxy) prepareRequest(ctx *fasthttp.RequestCtx, seen headSeen, r *routing.Route, t *routing.Target, upgrade bool) *proxyError {
	req := &ctx.Request
	h := &req.Header

	if perr := p.bodyTooLarge(h); perr != nil {
		return perr
	}
	if cl := h.ContentLength(); (cl > 0 || cl == -1) && req.IsBodyStream() {
		b := clientBodyPool.Get().(*clientBody)
		*b = clientBody{ctx: ctx, r: ctx.RequestBodyStream(), size: int64(cl), left: p.cfg.MaxRequestBodySize, timeout: p.clientBodyTimeout, traceFields: p.traceFields}
		b.hold, _ = ctx.Conn().(readHolder)
		req.SetBodyStream(b, cl)
	}

	// A request without Content-Type must not gain fasthttp's default one.
	h.SetNoDefaultContentType(true)
	// What depends on the order of a header's lines is settled before any
	// header is deleted: fasthttp deletes a line by moving the last line
	// of the head into its place, which swaps lines of one name (a TE
	// line first put the last X-Forwarded-For line, or X-Cube-Request-Id
	// line, before the others).
	if seen.requestID > 1 {
		// The id is the first line (the client's, or the one requestID
		// put there): the others go, so that the sandbox logs the id the
		// client got back, not a second line requestID never judged. A
		// Set replaces the first line and drops the rest in order.
		var idBuf [maxRequestIDLen]byte
		h.SetBytesV(HeaderRequestID, append(idBuf[:0], h.Peek(HeaderRequestID)...))
	}
	ip, _ := netip.AddrFromSlice(ctx.RemoteIP())
	ip = ip.Unmap()
	var forBuf, fwdBuf [256]byte
	var prior [][]byte
	if seen.forwardedFor > 0 {
		prior = h.PeekAll("X-Forwarded-For")
	}
	forwardedFor := appendForwardedFor(forBuf[:0], prior, ip)
	var forwarded []byte
	if seen.forwarded > 0 {
		forwarded = appendForwarded(fwdBuf[:0], h.PeekAll("Forwarded"), ip)
	}
	// The deletes below would reorder a repeated field's lines.
	deletes := seen.hop || upgrade || h.ConnectionClose() || seen.credentials || seen.expect ||
		seen.underscore || seen.spaceNames > 0
	var order *lineOrder
	if deletes {
		order = lineOrders.Get().(*lineOrder)
		order.rememberRequest(h)
	}
	// fasthttp marks an HTTP/1.0 request (or one with both Content-Length
	// and Transfer-Encoding) Connection: close without such a line in the
	// head; Request.Write would send that mark on to the sandbox.
	if seen.hop || upgrade || h.ConnectionClose() {
		removeHopRequest(h, upgrade)
		// Lines a Connection option named are gone: the proxy's element
		// goes alone, as it did when the lines were joined after this.
		if seen.hop && seen.forwardedFor > 0 && len(h.PeekAll("X-Forwarded-For")) == 0 {
			forwardedFor = appendForwardedFor(forBuf[:0], nil, ip)
		}
		if seen.hop && seen.forwarded > 0 && len(h.PeekAll("Forwarded")) == 0 {
			forwarded = appendForwarded(fwdBuf[:0], nil, ip)
		}
	}
	if seen.credentials {
		stripProxyCredentials(h)
	}
	if seen.expect {
		// 100-continue: fasthttp has answered it (100 before the
		// handler), and the body follows without waiting: the sandbox's
		// own 100 would be dropped, and, coming while the body is sent, it
		// would hide the early answer that may follow it (earlyAnswer).
		// Any other expectation: Go's and Node's servers answer one they
		// do not know with 417, where nginx, which never passes Expect on,
		// had the request served.
		h.Del(fasthttp.HeaderExpect)
	}
	if p.cfg.Signer != nil {
		stripSignedToken(req)
	}

	masked := masksHost(r, t.Port)
	if seen.underscore {
		dropForwardingAliases(h, masked)
	}
	if seen.spaceNames > 0 {
		dropInvalidNames(h)
	}
	if order != nil {
		order.restore(h)
		order.release()
	}
	// The headers the proxy vouches for (X-Real-IP, X-Forwarded-For, its
	// element of Forwarded, X-Forwarded-Host) are set as their only line:
	// a client's further copies would reach the sandbox beside the
	// proxy's, where a framework reading the last line, or the rightmost
	// address of the joined lines, takes the forged one. A set replaces
	// the first line and drops the others in place, leaving every other
	// line where it was; deleting them first (as earlier builds did for a
	// name sent twice) moved the head's last lines into their places,
	// after the restore above, and reordered a repeated field (RFC 9110
	// §5.3). The keys are in fasthttp's canonical form (the keyX names):
	// SetCanonical does not normalize them again.
	var buf [256]byte
	h.SetCanonical(keyRealIP, ip.AppendTo(buf[:0]))
	h.SetCanonical(keyForwardedFor, forwardedFor)
	if seen.forwarded > 0 {
		// Only where the client sent one (as nginx, the proxy adds none):
		// a framework that reads it before X-Forwarded-For takes the
		// rightmost element no trusted proxy added, which is then the
		// proxy's, not a client's forgery.
		h.SetCanonical(keyForwarded, forwarded)
	}
	// An empty line counts as absent, so the scan's word is checked.
	if !seen.forwardedProto || len(h.Peek("X-Forwarded-Proto")) == 0 {
		if ctx.IsTLS() {
			h.SetCanonical(keyForwardedProto, protoHTTPS)
		} else {
			h.SetCanonical(keyForwardedProto, protoHTTP)
		}
	}

	// The backend sees the Host the client sent (fasthttp would otherwise
	// rewrite it from the parsed URI), unless the route masks it. envd
	// (port 49983) always sees the real host.
	req.UseHostHeader = true
	if masked {
		h.SetCanonical(keyForwardedHost, h.Host())
		h.SetHostBytes(maskedHost(buf[:0], r.MaskRequestHost, t.Port))
	}
	return nil
}

// freshURI returns req's URI parsed anew from its request target. A URI
// parsed before, whose QueryArgs authorize read for a signed token on a
// request the cookie let through, is written back from its parsed
// arguments, re-encoded: "q=a%20b" as "q=a+b", "r=%zz;s=1" as
// "r=%25zz%3Bs%3D1" (one parameter for a framework that splits at ';',
// two as sent), "&&" as "&". Setting the target copies it in place.
func freshURI(req *fasthttp.Request) *fasthttp.URI {
	req.SetRequestURIBytes(req.Header.RequestURI())
	return req.URI()
}

// bodyTooLarge refuses a body whose Content-Length is over
// max_request_body; a chunked one is cut where it passes the limit.
func (p *Proxy) bodyTooLarge(h *fasthttp.RequestHeader) *proxyError {
	if cl := h.ContentLength(); cl > 0 && int64(cl) > p.cfg.MaxRequestBodySize {
		return &proxyError{status: 413, code: CodeBodyTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", p.cfg.MaxRequestBodySize)}
	}
	return nil
}

// stripSignedToken removes the signed-token query parameter from the
// request target. Like the traffic token it is the proxy's credential, and
// it may come along on a request that another credential (or a public
// route) lets through. Without a signer the parameter means nothing to the
// proxy and is left to the sandbox.
func stripSignedToken(req *fasthttp.Request) {
	uri := req.Header.RequestURI()
	path, query, ok := bytes.Cut(uri, []byte{'?'})
	if !ok || !auth.HasQueryParam(query, auth.QueryParamName) {
		return
	}
	dst := append(make([]byte, 0, len(uri)), path...)
	if clean, _ := auth.AppendStripQueryParam(nil, query, auth.QueryParamName); len(clean) > 0 {
		dst = append(append(dst, '?'), clean...)
	}
	// The request's setter, not the header's: it also drops a URI parsed
	// earlier, which Write would otherwise send instead.
	req.SetRequestURIBytes(dst)
}

// envdPort is the sandbox's envd daemon, whose Host is never masked.
const envdPort = 49983

// The answers to a client's request body that could not be read to its
// end, whether the proxy was streaming it (forward) or reading it whole
// (overLimit, and fasthttp's pre-read). Package values, so that a refusal
// costs no allocation.
var (
	refusedBodyTimeout = proxyError{status: 408, code: CodeBodyTimeout, msg: "request body not received in time"}
	// A client that reset or closed its connection before the end of its
	// upload has left, as one that leaves while the sandbox works on the
	// answer: nginx's 499 (nginx itself logs 400 here, its body reader's
	// status, and sends nothing). Its half-closed form still reads this
	// answer.
	refusedBodyLeft  = proxyError{status: 499, code: CodeClientClosed, msg: "client closed the connection before the end of its request body"}
	refusedBodyBad   = proxyError{status: 400, code: CodeBadBody, msg: "malformed request body"}
	refusedBodyDrain = proxyError{status: 504, code: CodeDrainTimeout, msg: "proxy shutting down: the request was not complete before the drain deadline"}
)

// bodyFailure answers a body read that failed with err; gone says the
// client closed or reset its connection.
func bodyFailure(err error, gone bool) *proxyError {
	switch {
	case isTimeout(err):
		return &refusedBodyTimeout
	case gone:
		return &refusedBodyLeft
	}
	return &refusedBodyBad
}

// malformedBody reports whether err is a client's body found malformed
// while it streamed (its 400): the client may still be sending, so the
// answer lingers, as nginx's after "client sent invalid chunked body".
// Closed with those bytes unread, the connection was reset, and a client
// still writing could fail on the reset before it read the 400.
func malformedBody(err error) bool {
	be, ok := errors.AsType[*clientBodyError](err)
	return ok && bodyFailure(be.err, be.gone) == &refusedBodyBad
}

// upstreamError answers a failed exchange with the backend, and ends its
// client span with the error.
func (p *Proxy) upstreamError(ctx *fasthttp.RequestCtx, x *exchange, err error, id []byte, addr netip.AddrPort) {
	// The sandbox's answer head may have been parsed, however many lines
	// it had, before it was refused (a malformed line after 2,500 others,
	// two lengths, a 101 nobody asked for): its storage stays with the
	// response this answer is written in, ≈ 180–240 KiB a client
	// connection, unless let go of (headDrop). Not counted on this rare
	// path: it costs the connection's next request fresh headers.
	ctx.SetUserValue(headDropKey{}, (*headDrop)(ctx))
	var be *clientBodyError
	bodyErr := errors.As(err, &be)
	var de *dialError
	switch {
	case errors.Is(err, errDrainCut):
		// The proxy is going away: the client must not try this
		// connection again, and the sandbox is not to blame.
		x.fail(ctx, proxyError{status: 504, code: CodeDrainTimeout, msg: "proxy shutting down: the sandbox did not answer before the drain deadline"}, id)
		ctx.SetConnectionClose()
	case errors.Is(err, errSandboxKilled):
		// Killed while it waited for its answer (POST /admin/meta/delete):
		// what every later request to the sandbox is told.
		x.fail(ctx, errKilled, id)
		ctx.SetConnectionClose() // an upload may be left half sent
	case errors.Is(err, errCredentialRevoked):
		// A route change revoked what it was let through on while it
		// waited for its answer (rejudge): what the same request gets
		// now.
		x.fail(ctx, errRevoked, id)
		ctx.SetConnectionClose() // an upload may be left half sent
	case errors.Is(err, errRouteChanged):
		// The route now sends the port elsewhere, or is gone: the old
		// backend's answer is not the sandbox's any more.
		x.fail(ctx, errMoved, id)
		ctx.SetConnectionClose()
	case errors.Is(err, errProxyLoop):
		// Route data pointing at the proxy: retrying cannot help, and the
		// operator must fix the route. Once a second, as the store outage.
		if everySecond(&p.loopLogged) {
			p.cfg.Logger.Warn("route names one of the proxy's own listeners; refusing the request",
				"sandbox_id", string(id), "addr", addr.String())
		}
		x.fail(ctx, proxyError{status: 508, code: CodeProxyLoop, msg: "the route of this sandbox port points at the proxy itself"}, id)
	case errors.Is(err, errClientLeft):
		// Nobody reads this answer (a client that only half-closed
		// might); it is what the log and the metrics record, as nginx's
		// 499.
		x.fail(ctx, proxyError{status: 499, code: CodeClientClosed, msg: "client closed the connection before the sandbox answered"}, id)
		ctx.SetConnectionClose()
	case errors.Is(err, errBodyTooLarge):
		x.fail(ctx, proxyError{status: 413, code: CodeBodyTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", p.cfg.MaxRequestBodySize)}, id)
	case bodyErr:
		x.fail(ctx, *bodyFailure(be.err, be.gone), id)
		// The rest of the body cannot be found on the connection.
		ctx.SetConnectionClose()
	case errors.As(err, &de) && dialShortage(de.err):
		// The proxy is out of descriptors or local ports, not the sandbox
		// refusing: a 502 "refused" would send the operator to the
		// sandbox. Once a second, like the store outage: every request
		// fails while it lasts.
		if everySecond(&p.resourceErrLogged) {
			p.cfg.Logger.Error("cannot connect to sandboxes: proxy out of resources (descriptors or local ports)",
				"sandbox_id", string(id), "err", err, "open_files_limit", openFilesLimit())
		}
		x.fail(ctx, proxyError{status: 503, code: CodeOutOfResources, msg: "proxy is out of resources; retry shortly", retryAfter: 1}, id)
	case errors.As(err, &de) && isTimeout(de.err):
		// Neither accepted nor refused: a frozen sandbox, a full listen
		// backlog, a dropped SYN. A gateway timeout, as nginx answers for
		// proxy_connect_timeout; "refused" would be untrue.
		x.fail(ctx, proxyError{status: 504, code: CodeUpstreamConnectTimeout, msg: "sandbox port did not accept the connection in time"}, id)
	case errors.As(err, &de):
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamConnect, msg: "sandbox port refused the connection"}, id)
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		x.fail(ctx, proxyError{status: 504, code: CodeUpstreamTimeout, msg: "sandbox did not answer in time"}, id)
	case isSmallBuffer(err):
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamBadHeader, msg: "sandbox response headers are larger than upstream.max_header_size"}, id)
	case errors.Is(err, errUnaskedSwitch):
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamBadHeader, msg: "sandbox switched protocols without being asked"}, id)
	case errors.Is(err, errWrongSwitch):
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamBadHeader, msg: "sandbox switched to a protocol the client did not ask for"}, id)
	case errors.Is(err, errNoFreeConns):
		x.fail(ctx, proxyError{status: 503, code: CodeUpstreamBusy, msg: "too many open connections to this sandbox port", retryAfter: 1}, id)
	case isStaleConn(err) || errors.As(err, new(*net.OpError)):
		// A close, a reset, or a connection the kernel gave up on
		// (ETIMEDOUT, which is not a deadline of ours).
		p.cfg.Logger.Debug("upstream exchange failed", "sandbox_id", string(id), "addr", addr.String(), "err", err)
		msg := "sandbox closed the connection before answering"
		if x.upStatus != 0 {
			// A body read whole (up to 64 KiB) broke off after its head:
			// the sandbox did answer, as upstream_status in the log shows.
			msg = "sandbox closed the connection before the end of its answer"
		}
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamReset, msg: msg}, id)
	default:
		// fasthttp could not parse the answer: a bad status line, duplicate
		// or malformed Content-Length, too many interim responses...
		p.cfg.Logger.Debug("upstream sent an invalid response", "sandbox_id", string(id), "addr", addr.String(), "err", err)
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamBadHeader, msg: "sandbox sent an invalid HTTP response"}, id)
	}
	if x.cspan != nil {
		// Ended here, once the answer is chosen: its code is the span's
		// error.type. Before upstreamFailed, whose status is the proxy's,
		// not one the sandbox sent.
		cerr := err
		if errors.Is(err, errClientLeft) || bodyErr && be.gone {
			cerr = nil // the client hung up: the sandbox failed nothing
		}
		telemetry.EndClientSpan(x.cspan, x.upStatus, x.errCode, cerr)
		x.cspan = nil
	}
	x.upstreamFailed(ctx.Response.StatusCode())
}

// A refused body is discarded after the answer, as nginx's lingering close
// does (lingering_time 30s, lingering_timeout 5s): each read within
// lingerTimeout, all within lingerTime. A client still sending would
// otherwise get a connection reset instead of the answer. Time bounds it,
// as it bounds nginx's, not bytes: cut at 16 MiB, a larger upload (Python's
// requests and httpx send the whole body before they read) got a broken
// pipe instead of its 404 or 502. Discarding costs less than the upload a
// public sandbox would take anyway, and a client that wants more just
// sends another request.
const (
	lingerTime    = 30 * time.Second
	lingerTimeout = 5 * time.Second
)

// lingerBody answers at once and then closes the connection after a
// lingering close. fasthttp would answer only after the handler returned,
// so discarding the body in the handler kept a slow uploader waiting for
// its 413 until it had sent 16 MiB or timed out; and fasthttp skips a
// hijack handler on a connection marked for closing, so the answer is
// written here.
func (p *Proxy) lingerBody(ctx *fasthttp.RequestCtx) {
	raw := ctx.Conn()
	ownsClose(raw)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer func() {
			_ = raw.Close()
			p.clientConnClosed()
		}()
		// The request is recycled only after this returns: its response
		// (with every header the handler set) is still here.
		ctx.Response.Header.SetConnectionClose()
		p.answerLingering(raw, c, &ctx.Response)
	})
}

// answerLingering writes resp to the client connection raw, ends raw's
// write side so that the client sees the answer end, and then reads and
// discards from r (raw, or its hijacked form) what the client still sends,
// within lingerTimeout and lingerTime, as nginx's lingering
// close does. A connection closed with unread bytes is reset, and the
// client's write of the rest fails before it reads the answer. The caller
// closes raw.
func (p *Proxy) answerLingering(raw, r net.Conn, resp *fasthttp.Response) {
	p.lingering.Add(1)
	defer p.lingering.Add(-1)
	if p.clientWriteTimeout > 0 {
		_ = raw.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
	}
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(raw)
	err := resp.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	if err != nil {
		return
	}
	if cw, ok := raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite() // the client sees the answer end
	}
	p.linger(raw, r)
}

// lingerClose closes c, a client connection whose stream ended cleanly but
// whose client sent bytes the proxy will not read (a request pipelined
// behind a detached stream, which ends with its connection): closed at
// once with them unread, the socket is reset, the client reads
// ECONNRESET instead of the end, and what of the end the proxy's kernel
// had not sent yet is lost. So its side is ended first and the rest read
// and dropped (linger), as nginx's lingering close does. The connection
// is counted closed once it is.
func (p *Proxy) lingerClose(c net.Conn) {
	defer p.clientConnClosed()
	p.lingerThenClose(c)
}

// goLingerClose runs lingerClose(c), then after (if not nil), in a
// goroutine, counted in lingering before it starts: the drain ends once
// it finds nothing open and nothing lingering, and a goroutine that
// counted itself only in linger, after its CloseWrite (a TLS close_notify
// waits up to 5 s for a client slow to read), left the drain a window to
// end in; Shutdown then closed the connection over the client's unread
// bytes, the reset the linger avoids
// (TestCloseLingeringCountedForTheDrainAtOnce).
func (p *Proxy) goLingerClose(c net.Conn, after func()) {
	p.lingering.Add(1)
	go func() {
		defer p.lingering.Add(-1)
		if after != nil {
			defer after()
		}
		p.lingerClose(c)
	}()
}

// lingerThenClose ends c's write side, reads and drops what its client
// still sends (linger), then closes c.
func (p *Proxy) lingerThenClose(c net.Conn) {
	defer func() { _ = c.Close() }()
	if p.clientWriteTimeout > 0 {
		// A TLS connection's CloseWrite writes its close_notify.
		_ = c.SetWriteDeadline(time.Now().Add(p.clientWriteTimeout))
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		p.linger(c, c)
	}
}

// closeLingering closes inner, a client connection's own (TCP or TLS)
// connection, after a lingering close in a goroutine, and reports true,
// when the client sent bytes that nobody will read; otherwise it does
// nothing and reports false, and the caller closes. fasthttp closes a
// connection once an answer that ends it is written (the drain's, an
// HTTP/1.0 or Connection: close request's, a refusal's), also when the
// client has already sent its next request (pipelined, or sent as soon as
// the answer's head came): closed with those bytes unread, the socket was
// reset, and the reset threw away what of the answer the kernel had not
// sent yet. Measured on the binary: a client that had pipelined a second
// GET behind an 8 MiB download got 4.4 of the 8 MiB and ECONNRESET during
// the drain, 4.6 to 7.6 MiB behind an HTTP/1.0 one, each logged as 200
// with every byte sent; nginx 1.22 sent all of it, then ended the
// connection (lingering_close on lingers when bytes wait behind the
// answer). lingered makes it once: the linger's own close is a
// close. After a failed write (client.write_timeout) it closes at once,
// as nginx does: the client takes nothing, and lingering would only hold
// the answer's unsent bytes.
//
// The connection is held (p.held), counted under client.max_conns and
// counted lingering (goLingerClose) before the goroutine starts: fasthttp
// counts it closed when this returns, and the drain, seeing no connection
// left, could end before a goroutine that had yet to hold it.
func (p *Proxy) closeLingering(inner net.Conn, lingered *atomic.Bool, writeFailed bool) bool {
	if writeFailed || !lingered.CompareAndSwap(false, true) || !clientSentMore(inner) {
		return false
	}
	if !p.held.add(inner) {
		return true // the drain is over: add closed it
	}
	p.clientConns.Add(1)
	p.metrics.ConnOpened()
	p.goLingerClose(inner, func() { p.held.remove(inner) })
	return true
}

// linger reads and discards from r what the client of raw still sends,
// within lingerTimeout and lingerTime, once raw's write side is closed.
// The caller closes raw, and counts it in lingering (which the drain
// waits for) from before its answer's end goes out. It reads into a 4 KiB
// buffer, and into a 64 KiB one only after a read filled the one it used
// (more is queued): a client
// without credentials that trickled a refused body held a 64 KiB buffer
// for each lingering connection, up to 30 s, ≈ 110 KiB counted per
// connection against README's 56 KiB sizing. Unlike copyGrowing's rule, a
// read that leaves the big buffer part empty gives it back, so that a
// burst followed by a pause does not hold it through the pause.
func (p *Proxy) linger(raw, r net.Conn) {
	// Held while it lingers: the drain waits for it until its deadline,
	// and Shutdown's end cuts the wait short.
	if !p.held.add(raw) {
		return
	}
	defer p.held.remove(raw)
	small := uploadBufPool.Get().(*[]byte)
	defer uploadBufPool.Put(small)
	g := growingBuf{small: *small}
	defer g.shrink()
	end := time.Now().Add(lingerTime)
	for {
		b := g.next()
		_ = r.SetReadDeadline(minTime(time.Now().Add(lingerTimeout), end))
		n, err := r.Read(b)
		switch {
		case err != nil:
			return
		case g.big != nil && n < len(b):
			g.shrink()
		default:
			g.grow(n)
		}
	}
}

func isSmallBuffer(err error) bool {
	var sb *fasthttp.ErrSmallBuffer
	return errors.As(err, &sb) || errors.Is(err, fasthttp.ErrSmallReadBuffer)
}

// errBodyTooLarge stops a chunked upload at the cap.
var errBodyTooLarge = errors.New("request body too large")

// clientBody is a streamed request body on its way to the sandbox. It caps
// a chunked body's size, and it renews the client's read deadline before
// each read: client.body_timeout bounds each wait for the client (as
// nginx's client_body_timeout does), not the whole upload, so the time the
// proxy spends blocked on a slow sandbox is not charged to the client.
// It counts what it read, for a chunked body's logs and metrics. Two
// parties let go of it, in either order: fasthttp closes it once the body
// is sent (or when the request is reset, if it never was), and forward
// when it has read the count; the second returns it to its pool.
type clientBody struct {
	ctx      *fasthttp.RequestCtx
	r        io.Reader
	left     int64 // bytes still allowed
	n        int64 // bytes read
	timeout  time.Duration
	deadline time.Time
	size     int64 // Content-Length, or -1 for a chunked body
	eof      bool  // the client's body was read to its end
	// gone: the client closed its connection before the end of its body
	// (a reset, or a close cut it short), rather than sending a malformed one.
	gone    bool
	closed  bool // fasthttp is done with it
	counted bool // forward is done with it
	// cut is the sandbox connection's interrupted flag while the body is
	// sent on it: set, the drain deadline has come (pools.abort).
	cut *atomic.Bool
	// answered is the sandbox connection's flag for an answer that ends
	// the send (earlyAnswer).
	answered *atomic.Bool
	// bw is the writer the request goes out through while send writes it,
	// and dst the body writer fasthttp hands WriteTo (see uploadWriter).
	bw  *bufio.Writer
	dst io.Writer
	// hold is the client connection, when its reads can be held
	// (readHold); bulk says the copy reads into its 64 KiB buffer
	// (copyGrowing), and held is the end of the hold armed (zero: none).
	// empty says the last read ended empty at the hold's end: no progress,
	// which the next read must not renew the body's deadline for.
	hold  readHolder
	bulk  bool
	held  time.Time
	empty bool
	// grow is the copy's buffers (copyGrowing); framing says a read of a
	// chunk's size line is under way, into no buffer of the copy's
	// (nextChunk), which a hold that runs out then gives back (heldOut).
	grow    growingBuf
	framing bool
	// traceFields are the proxy's (Proxy.traceFields), which a chunked
	// body's trailer may not name (stripTrailerFields).
	traceFields []string
	// coalesce says the copy's small pieces of a chunked body wait in
	// pend (an uploadBufPool buffer, nil when none wait) until the client
	// connection is read again (uploadWriter.beforeRead). werr is the
	// failure of a write to the sandbox made there, which the read that
	// ran the hook returns.
	coalesce bool
	pend     *[]byte
	werr     error
}

var clientBodyPool = sync.Pool{New: func() any { return new(clientBody) }}

func (b *clientBody) Read(p []byte) (int, error) {
	if b.empty {
		b.empty = false
	} else {
		b.renew()
	}
	if b.hold != nil {
		b.holdBulk()
	}
	if err := b.stopped(); err != nil {
		return 0, err
	}
	if b.left <= 0 {
		// One byte more than allowed tells an exact-size body from an
		// oversized one. Only io.EOF means the body ended there: a chunked
		// body cut or botched right at the cap is incomplete, and taking
		// its error for the end would hand the sandbox a complete body.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if err != nil && b.werr != nil {
			return 0, b.werr // the sandbox's failure, not the client's
		}
		if n > 0 {
			return 0, errBodyTooLarge
		}
		if err != nil && b.size < 0 && framingStalled(err) {
			err = errChunkStalled
		}
		if err == nil {
			b.held, b.empty = time.Time{}, true // as below
		}
		return 0, b.ended(err)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	if err != nil && b.werr != nil {
		// The read hook's write failed (uploadWriter.beforeRead): the
		// sandbox's failure, which ended the read, not the client's.
		b.left -= int64(n)
		b.n += int64(n)
		return n, b.werr
	}
	if err != nil && b.size < 0 && framingStalled(err) {
		err = errChunkStalled
	}
	if n == 0 && err == nil && len(p) > 0 {
		// The hold's end (readHold.ranOut), which ended it.
		b.held, b.empty = time.Time{}, true
	}
	b.left -= int64(n)
	b.n += int64(n)
	return n, b.ended(err)
}

// renew moves the client's read deadline to client.body_timeout from now,
// when that is more than a little later than the one set.
func (b *clientBody) renew() {
	if b.timeout > 0 {
		if want := time.Now().Add(b.timeout); want.Sub(b.deadline) >= slack(b.timeout) {
			_ = b.ctx.SetReadDeadline(want)
			b.deadline = want
		}
	}
}

// stopped is the error that ends the copy before its next read of the
// client: the drain's cut, or an early answer. It is checked after a
// renewal of the deadline (renew): abort's and earlyAnswer's deadlines,
// set after their flags, win.
func (b *clientBody) stopped() error {
	if b.cut != nil && b.cut.Load() {
		return errDrainCut
	}
	if b.answered != nil && b.answered.Load() {
		return errAnsweredEarly
	}
	return nil
}

// holdBulk keeps the connection's hold in step with the copy (readHold):
// while the copy reads into its 64 KiB buffer, a read that waits bulkHold
// for the client ends empty, and the copy gives the buffer back
// (copyGrowing), as a download's copy does when its sandbox is silent. An
// upload whose client went silent mid-body held it until
// client.body_timeout: ≈ 132 KiB counted against GOMEMLIMIT a connection,
// for 60 s by default, where one waiting for its answer counts ≈ 63 KiB.
// The hold's end moves at most twice a second (a runtime timer update and
// a lock each), so bulk gives the buffer back (a pool round trip) at most
// once a second, and only when a read waits at the hold's end.
func (b *clientBody) holdBulk() {
	switch {
	case b.bulk:
		if want := time.Now().Add(bulkHold); b.held.IsZero() || want.Sub(b.held) >= bulkHold/2 {
			b.hold.holdReads(want, b)
			b.held = want
		}
	case !b.held.IsZero():
		b.hold.holdReads(time.Time{}, nil)
		b.held = time.Time{}
	}
}

// endHold ends the hold, if one is armed: the connection's reads are
// fasthttp's again.
func (b *clientBody) endHold() {
	b.bulk = false
	if !b.held.IsZero() {
		b.hold.holdReads(time.Time{}, nil)
		b.held = time.Time{}
	}
}

// nextChunk reads what comes before a chunked body's next data, when the
// copy is in bulk: a read of no bytes, which fasthttp's reader turns into
// a read of the next chunk's size line when the chunk before has ended
// (and of the trailer after the last, io.EOF). The copy holds its 64 KiB
// buffer through its own frame only, which makes no use of it meanwhile:
// a hold that runs out while the line is awaited (fasthttp's reader takes
// that read up again, readHold) gives the buffer back there (heldOut), and
// the copy goes on in its small buffer. Read into the big buffer, the line
// kept it until client.body_timeout: a chunked upload whose client stopped
// between two chunks counted ≈ 120 KiB for 60 s, one that stopped within
// a chunk ≈ 64. A client that stops between a chunk's data and the CRLF
// after it still holds it: that CRLF is read with the data.
func (b *clientBody) nextChunk() error {
	b.bulk, b.framing = true, true
	_, err := b.Read(nil)
	b.framing = false
	return err
}

// heldOut is the hold's end in a read fasthttp's reader takes up again
// (readHold): one of a chunk's size line (nextChunk) gives the copy's big
// buffer back, which that read does not use. Any other such read is one of
// data into the big buffer, which keeps it.
func (b *clientBody) heldOut() {
	if b.framing {
		b.grow.shrink()
	}
}

// ended records what err, from a read of the body, says of its end: read
// to its end (eof), or left by a client that closed its connection (gone).
// A malformed body is neither. It returns the error the read is to
// return: err, or, for a chunked body whose trailer names a header the
// proxy sets (stripTrailerFields), that refusal, which the client is
// answered as for a malformed body and which leaves the sandbox's copy of
// the body unended.
func (b *clientBody) ended(err error) error {
	switch {
	case err == nil:
	case err == io.EOF && b.size >= 0 && b.n < b.size:
		// fasthttp ends a Content-Length body the client closed early with
		// a plain io.EOF (and then replaces it with a message of its own).
		b.gone = true
	case err == io.EOF:
		if b.size < 0 {
			if terr := stripTrailerFields(&b.ctx.Request.Header, b.traceFields); terr != nil {
				return terr
			}
		}
		b.eof = true
	default:
		b.gone = closedMidBody(err)
	}
	return err
}

// stripTrailerFields removes from the trailer of a chunked body, read
// with its end (after prepareRequest cleaned the head) and written after
// it, the fields the head loses: the proxy's token fields, so that the
// sandbox never sees the proxy's credential there either (fasthttp refuses
// only the standard credentials, Authorization and Cookie, in a trailer),
// and every name droppedTrailerName picks. A trailer that names a header
// the proxy sets in the head, Forwarded, X-Cube-Request-Id, or, with
// tracing on, one of traceFields, is refused (the error says which), as
// fasthttp refuses X-Forwarded-* and X-Real-IP there: PHP's built-in
// server (php -S) joins such a field onto the head's
// ($_SERVER["HTTP_FORWARDED"] "for=127.0.0.1, for=6.6.6.6", the request id
// "<id>, forged", a traceparent of two, which no tracer takes: the
// sandbox's spans left the proxy's trace), so that an app trusting the
// last Forwarded element took the client's. Removing only the
// trailer's copy is not to be had: fasthttp deletes a name from head and
// trailer at once, and the head's request id is still read after the
// body (the answer's id, the log). The names dropped here are ones the
// head no longer has, or never had.
// More than maxInvalidNames fields to drop refuse the trailer, as the
// head refuses as many names with a space.
func stripTrailerFields(h *fasthttp.RequestHeader, traceFields []string) error {
	for _, name := range h.PeekTrailerKeys() {
		refused := bytes.EqualFold(name, []byte("Forwarded")) || bytes.EqualFold(name, []byte(HeaderRequestID))
		for _, f := range traceFields {
			refused = refused || bytes.EqualFold(name, []byte(f))
		}
		if refused {
			return fmt.Errorf("request trailer field %q: the proxy sets it in the head", name)
		}
	}
	// fasthttp deletes a trailer line by moving the trailer's last line
	// into its place: a field sent there on several lines is put back in
	// its order after the deletes. Most bodies have no trailer.
	var order *lineOrder
	if len(h.PeekTrailerKeys()) > 0 {
		order = lineOrders.Get().(*lineOrder)
		order.rememberTrailer(h)
		defer order.release()
	}
	for _, name := range proxyTokenHeaders {
		h.Del(name)
	}
	// What the head's Connection lines named, read once: serve refused a
	// head naming more than maxConnectionOptions, so a trailer of many
	// fields costs a few comparisons each, not a walk over the head.
	var opts [maxConnectionOptions][]byte
	options := connectionOptions(opts[:0], h.RawHeaders())
	var found [4][]byte
	doomed := found[:0]
	for _, name := range h.PeekTrailerKeys() {
		if droppedTrailerName(name, options) {
			if len(doomed) == maxInvalidNames {
				// Each delete walks the whole header, as in the head
				// (dropInvalidNames), which refuses as many: 3,000 such
				// names in a 30 KB trailer cost ≈ 10 ms of CPU.
				return fmt.Errorf("request trailer holds more than %d fields the proxy drops", maxInvalidNames)
			}
			// A copy: deleting reuses the header's buffers.
			doomed = append(doomed, bytes.Clone(name))
		}
	}
	for _, name := range doomed {
		h.DelBytes(name)
	}
	if order != nil {
		order.restore(h)
	}
	return nil
}

// droppedTrailerName reports whether a request trailer field must not
// reach the sandbox: a name with a space, or the '_' or '.' spelling of a
// header the proxy strips or vouches for (the proxy's credentials,
// X-Real-IP, X-Forwarded-For, X-Forwarded-Host), which the head loses too
// (dropInvalidNames, dropForwardingAliases); a hop-by-hop header
// (hopHeaders: fasthttp refuses all but Upgrade there), or one of the
// head's Connection options, which removeHopRequest took from the head as
// hop-by-hop by declaration. PHP's built-in server (php -S) reads a
// chunked body's trailer fields as request headers, each filed as the
// head's are ($_SERVER["HTTP_X_REAL_IP"] for X_Real_IP, X.Real.IP or
// "X Real IP") and overwriting the head's: relayed, a trailer forged the
// client address over the proxy's X-Real-IP and handed the sandbox's code
// a client's admin token (measured with PHP 8.2), and gave back a field
// the head's Connection named, or an Upgrade the proxy removed from a
// request that does not switch protocols.
// X-Forwarded-Host's is dropped whatever the route: fasthttp refuses the
// real name in a trailer, so only a spelling meant to pass for it comes.
// So is X-Cube-Request-Id's, which the head keeps: there it can replace
// only the client's own id (an id the proxy makes is added after it),
// while a trailer's replaced, in php -S, the id the proxy made or checked
// with any value. The routing headers (X-Cube-Sandbox-Id/-Port,
// E2b-Sandbox-Id/-Port) pass: the head passes them as sent, and their '_'
// spellings, which php -S files over them, so a trailer's copy (joined
// onto the head's there) tells the sandbox nothing the head could not.
func droppedTrailerName(name []byte, connOptions [][]byte) bool {
	if bytes.IndexByte(name, ' ') >= 0 {
		return true
	}
	if (bytes.IndexByte(name, '_') >= 0 || bytes.IndexByte(name, '.') >= 0) && droppedAlias(name, true) {
		return true
	}
	for _, hop := range hopHeaders {
		if bytes.EqualFold(name, []byte(hop)) {
			return true
		}
	}
	for _, opt := range connOptions {
		if bytes.EqualFold(name, opt) {
			return true
		}
	}
	return false
}

// errChunkStalled is a chunked body's read that reached the read deadline
// (client.body_timeout) inside the chunk framing: a timeout, as a stall
// anywhere else in the body is (the 408 request_body_timeout).
var errChunkStalled = fmt.Errorf("%w: client stalled within a chunk's framing", os.ErrDeadlineExceeded)

// framingStalled reports whether err, from fasthttp's reader of a chunked
// body, is a read of the chunk framing that reached the connection's read
// deadline, which fasthttp does not hand over as a timeout: it wraps it in
// an ErrBrokenChunk, without unwrapping, in the CRLF after a chunk's data
// and in a size line after its digits (an extension, the line's end), and
// returns its own ErrTimeout, no net.Error, at the trailer's start. Such a
// stall was answered as a malformed body, a 400 bad_request_body, where
// one in a chunk's data or digits was the 408 (nginx: 408 for all).
func framingStalled(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var bc fasthttp.ErrBrokenChunk
	return errors.As(err, &bc) && strings.HasSuffix(bc.Error(), ": "+os.ErrDeadlineExceeded.Error())
}

// closedMidBody reports whether err, from reading a request body, means
// that the client's connection ended under it: a reset, or a close in the
// middle of a chunked body, which fasthttp reports as io.ErrUnexpectedEOF,
// or, when the close cut a chunk's framing (its size line, the CRLF after
// its data), as an ErrBrokenChunk whose cause (unexported) is io.EOF.
func closedMidBody(err error) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	var bc fasthttp.ErrBrokenChunk
	return errors.As(err, &bc) && strings.HasSuffix(bc.Error(), ": "+io.EOF.Error())
}

// SupportsBodyWriteTo has fasthttp's Request.Write copy the body with
// WriteTo (fasthttp.BodyWriterTo).
func (b *clientBody) SupportsBodyWriteTo() bool { return true }

// uploadSmallBuf is the buffer a body is read into while it comes in small
// pieces (a trickle, an agent's small chunks).
const uploadSmallBuf = 4 << 10

var uploadBufPool = sync.Pool{New: func() any { b := make([]byte, uploadSmallBuf); return &b }}

// WriteTo copies the body to w (the request's writer, which frames each
// write as a chunk for a chunked body) through Read, in pieces as large as
// the client sends them. fasthttp's own copy goes through a 4 KiB buffer:
// a write to the sandbox per 4 KiB, and for a chunked body a chunk and a
// flush per 4 KiB, which cost twice nginx's CPU for a large upload, and
// three and a half times for a chunked one. A trickling upload holds only
// a 4 KiB buffer (copyGrowing).
func (b *clientBody) WriteTo(w io.Writer) (int64, error) {
	small := uploadBufPool.Get().(*[]byte)
	defer uploadBufPool.Put(small)
	defer b.endHold()
	if b.bw == nil {
		return copyGrowing(w, b, *small)
	}
	if b.size < 0 {
		// fasthttp read none of a chunked body before the handler: its
		// first chunk may be a while coming (an upload fed by a command's
		// output), and the sandbox is not to wait for it to see the
		// request (or answer its head alone, a 401). A Content-Length body
		// has its first bytes read already (fasthttpPreRead).
		if err := b.bw.Flush(); err != nil {
			return 0, err
		}
	}
	b.dst = w
	if b.size < 0 && b.hold != nil {
		b.coalesce = true
		b.hold.setReadHook((*uploadWriter)(b))
	}
	n, err := copyGrowing((*uploadWriter)(b), b, *small)
	if b.coalesce {
		b.hold.setReadHook(nil)
		// What the copy read last, up to the body's end or a failure
		// (which the pieces before it reached the sandbox ahead of, as
		// they did before pieces waited).
		if ferr := (*uploadWriter)(b).flushPending(); err == nil {
			err = ferr
		}
		b.coalesce = false
	}
	b.dst = nil
	return n, err
}

// uploadWriter is a clientBody seen as the writer its pieces are copied
// to: each goes to fasthttp's body writer (dst), and then on to the
// sandbox at once. fasthttp frames and flushes each piece of a chunked
// body, but a Content-Length body only fills the request's 4 KiB writer
// (bw), which it flushes when full: what a client sent in smaller pieces
// waited there, unseen by the sandbox, for as long as the client paused
// (a slow uploader's last few KiB, the head of a file a sandbox checks
// before it takes the rest), and a sandbox's own body timeout saw silence
// the client never made. A piece that fills the writer goes straight to
// the connection and leaves nothing to flush: large uploads pay nothing.
type uploadWriter clientBody

// Write sends p on. A chunked body's small pieces wait (coalesce) while
// fasthttp's reader still holds the client's bytes: it hands the copy one
// chunk a read, and a body sent as 1-byte chunks cost a chunk, a flush and
// a write syscall to the sandbox each (256 KiB in 1-byte chunks: 0.89 s of CPU, against
// 5 ms in one chunk). They go out together before the next read of the
// client's connection (beforeRead), the read that may wait for the
// client: a trickle reaches the sandbox piece by piece, as before.
func (u *uploadWriter) Write(p []byte) (int, error) {
	if u.werr != nil {
		return 0, u.werr
	}
	if u.coalesce {
		if u.pend != nil && len(*u.pend)+len(p) > cap(*u.pend) {
			if err := u.flushPending(); err != nil {
				return 0, err
			}
		}
		if len(p) < uploadSmallBuf {
			if u.pend == nil {
				u.pend = uploadBufPool.Get().(*[]byte)
				*u.pend = (*u.pend)[:0]
			}
			*u.pend = append(*u.pend, p...)
			return len(p), nil
		}
	}
	return u.write(p)
}

// write sends p to the sandbox at once.
func (u *uploadWriter) write(p []byte) (int, error) {
	n, err := u.dst.Write(p)
	if err == nil && u.bw.Buffered() > 0 {
		err = u.bw.Flush()
	}
	return n, err
}

// flushPending sends the pieces waiting, if any, and gives their buffer
// back; a failure is kept (werr).
func (u *uploadWriter) flushPending() error {
	if u.pend == nil {
		return nil
	}
	_, err := u.write(*u.pend)
	*u.pend = (*u.pend)[:cap(*u.pend)]
	uploadBufPool.Put(u.pend)
	u.pend = nil
	if err != nil {
		u.werr = err
	}
	return err
}

// beforeRead is the client connection's read hook (readHook) while a
// chunked body is copied: the pieces waiting go to the sandbox before the
// read, which may wait for the client. The write's time is the sandbox's:
// the client's deadline is renewed after it, and the drain's cut or an
// early answer meanwhile ends the read as it would the copy's next one.
// A failed write ends the read too, with the sandbox's error, which the
// body's Read returns in place of what fasthttp's reader makes of it.
func (u *uploadWriter) beforeRead() error {
	if u.pend == nil {
		return nil
	}
	b := (*clientBody)(u)
	err := b.stopped()
	if err == nil {
		err = u.flushPending()
	}
	if err == nil {
		b.renew()
		err = b.stopped()
	}
	if err != nil && u.werr == nil {
		u.werr = err
	}
	return err
}

// Close is fasthttp letting go of b.
func (b *clientBody) Close() error {
	b.closed = true
	b.release()
	return nil
}

// bytesRead is forward letting go of b; it reports what b read, and
// whether that was the whole body.
func (b *clientBody) bytesRead() (n int64, ended bool) {
	n, ended = b.n, b.eof
	b.counted = true
	b.release()
	return n, ended
}

// fasthttpDiscardLimit is how much of a request body fasthttp reads and
// drops after the handler to keep the connection (maxUnreadStreamBodySize);
// with more left it closes the connection at once.
const fasthttpDiscardLimit = 256 << 10

// bodyLeft reports whether the client may still be sending more of its
// body than fasthttp would drop to keep the connection: the answer went
// out before the body was read (x.bytesIn is what was).
func bodyLeft(ctx *fasthttp.RequestCtx, x *exchange) bool {
	switch cl := ctx.Request.Header.ContentLength(); {
	case x.bodyEnded:
		return false
	case cl == -1: // chunked: what is left is unknown
		return true
	default:
		return int64(cl)-x.bytesIn > fasthttpDiscardLimit
	}
}

// release returns b to its pool once both fasthttp and forward are done.
// Both run on the connection's goroutine.
func (b *clientBody) release() {
	if b.closed && b.counted {
		*b = clientBody{}
		clientBodyPool.Put(b)
	}
}

// headerTimeout is how long the sandbox may take to send the head of its
// answer to a request with header h. A request that accepts an event
// stream (an MCP POST, which must; an SSE GET) may be answered by one whose
// head comes with its first event: the go-sdk gateway without an event
// store, or in JSON mode, sends the head of a tools/call's answer with its
// result, and a tool may run for many minutes. Such a request waits as
// long as a stream may be silent (upstream.idle_timeout), as through the
// platform's proxy (proxy_read_timeout bounds both waits); any other keeps
// upstream.response_header_timeout's 504.
func (p *Proxy) headerTimeout(h *fasthttp.RequestHeader) time.Duration {
	ht := p.cfg.ResponseHeaderTimeout
	if ht <= 0 || !acceptsEventStream(h) {
		return ht
	}
	if it := p.cfg.IdleStreamTimeout; it <= 0 {
		return 0 // streams may be silent forever: so may this wait
	} else if it > ht {
		return it
	}
	return ht
}

var eventStreamType = []byte("text/event-stream")

// acceptsEventStream reports whether the request's Accept lists
// text/event-stream, in any case (media types are case-insensitive, RFC
// 9110 §8.3.1) and on any of its lines (a client may send one per type),
// unless with a weight of 0, which says "not acceptable" (RFC 9110
// §12.4.2). One pass over the lines: each element is looked at once, at
// its start.
func acceptsEventStream(h *fasthttp.RequestHeader) bool {
	for _, v := range h.PeekAll(fasthttp.HeaderAccept) {
		for len(v) > 0 {
			var elem []byte
			elem, v = nextToken(v)
			if !isEventStream(elem) {
				continue
			}
			params := elem[len(eventStreamType):]
			if len(params) == 0 || (params[0] == ';' || params[0] == ' ' || params[0] == '\t') && !zeroWeight(params) {
				return true
			}
		}
	}
	return false
}

// zeroWeight reports whether the media-range parameters params (from the
// first ";" on) carry q=0, in any of its spellings (0, 0., 0.0, 0.00,
// 0.000); the first q parameter counts.
func zeroWeight(params []byte) bool {
	for len(params) > 0 {
		var p []byte
		if i := bytes.IndexByte(params, ';'); i >= 0 {
			p, params = params[:i], params[i+1:]
		} else {
			p, params = params, nil
		}
		p = bytes.TrimSpace(p)
		if len(p) < 3 || p[0]|0x20 != 'q' || p[1] != '=' {
			continue
		}
		// RFC 9110's qvalue grammar spells 0 as "0" [ "." 0*3DIGIT ]
		// with zero digits; a weight it does not allow ("00", "0.0000",
		// "-0") is no refusal, as a weight of "abc" is none: the type
		// stays accepted, as without a weight.
		w := p[2:]
		return w[0] == '0' && (len(w) == 1 || w[1] == '.' && len(w) <= 5 && len(bytes.TrimLeft(w[2:], "0")) == 0)
	}
	return false
}

// isEventStream reports whether the Content-Type ct is text/event-stream,
// in any case: media types are case-insensitive (RFC 9110 §8.3.1), and
// browsers' EventSource reads "Text/Event-Stream" as an event stream too.
func isEventStream(ct []byte) bool {
	return len(ct) >= len(eventStreamType) && bytes.EqualFold(ct[:len(eventStreamType)], eventStreamType)
}

// requestID returns the client's X-Cube-Request-Id when it is sane, or a
// new one (also set on the request, so the sandbox can log it).
func (p *Proxy) requestID(h *fasthttp.RequestHeader, dst []byte) []byte {
	if v := h.Peek(HeaderRequestID); len(v) > 0 && len(v) <= maxRequestIDLen && isToken(v) {
		return append(dst, v...)
	}
	dst = append(dst, p.idPrefix[:]...)
	var b [16]byte
	n := p.reqSeq.Add(1)
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = "0123456789abcdef"[n&0xf]
		n >>= 4
	}
	dst = append(dst, b[:]...)
	h.SetBytesV(HeaderRequestID, dst)
	return dst
}

// isToken reports whether v is printable ASCII without spaces.
func isToken(v []byte) bool {
	for _, c := range v {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
