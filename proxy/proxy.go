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
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// Proxy is the request pipeline. Its Handler serves sandbox traffic; the
// admin API is Admin.Handler, on a separate listener.
type Proxy struct {
	cfg     Config
	parser  *routing.Parser
	cache   *routing.Cache
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
	// beforeTunnelListed, for tests, runs in a WebSocket's hijack handler
	// before its tunnel is listed in the registry, after fasthttp counted
	// the connection out; nil in production.
	beforeTunnelListed func()
	// beforeRefusalLingers, for tests, runs in lingerBody's and
	// redirectExpect's hijack handlers before the answer goes out, after
	// fasthttp counted the connection out; nil in production.
	beforeRefusalLingers func()
	// afterLeftLook, for tests, runs in bodyStream.clientEnded after its
	// look at whether the hangups watch found the client gone, before
	// the others; nil in production.
	afterLeftLook func(s *bodyStream)

	clientWriteTimeout time.Duration // from ServerConfig
	clientBodyTimeout  time.Duration // from ServerConfig

	tel     *telemetry.Telemetry // nil: no tracing
	metrics *telemetry.Metrics   // nil-safe
	// traceFields are the trace-context headers (traceparent, tracestate)
	// the proxy sets in every request's head with tracing on, the
	// propagator's own list; nil with tracing off, when they pass as sent.
	traceFields []string

	staleLogged    loglimit.Limit // the stale-route log line
	storeErrLogged loglimit.Limit // the store-unavailable log line
	// the "out of resources" lines, for a failed dial to a sandbox or Redis
	resourceErrLogged loglimit.Limit
	loopLogged        loglimit.Limit // the "route names the proxy" line

	resumer *resumer // nil: paused sandboxes are not resumed (Config.ResumeAddr)

	// listeners are the addresses this process listens on (Server adds
	// each): a sandbox connection that reaches one is the proxy dialing
	// itself (see dialedSelf). Written at startup, read on each new dial.
	listeners   atomic.Pointer[[]netip.AddrPort]
	listenersMu sync.Mutex

	idPrefix [9]byte // "<8 hex>-": instance part of generated request ids
	reqSeq   atomic.Uint64
}

// New returns a proxy that resolves routes through cache, which reads its
// store on a miss.
func New(cfg Config, cache *routing.Cache) (*Proxy, error) {
	if err := cfg.CheckHeldBodies(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	p := &Proxy{
		cfg:    cfg,
		parser: routing.NewParser(cfg.Parser),
		cache:  cache,
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
	if cfg.ResumeAddr != "" {
		p.resumer = newResumer(cfg.ResumeAddr, cfg.ResumeTimeout)
	}
	p.pools = pools{cfg: &p.cfg, m: make(map[poolKey]*upstream)}
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
		p.keepAdmittedHead(ctx, &x)
		p.bodyFromContinue(ctx)
		return sendContinue(ctx, p.clientWriteTimeout)
	}
	return ctx.Response.StatusCode()
}

// bodyFromContinue gives the body of a head Expect admitted
// client.body_timeout from now, as its 100 goes out. fasthttp armed it as
// the head arrived, for the body's first 8 KiB, and the head's judgement
// may have waited on the proxy's side since (a paused sandbox's resume, up
// to lifecycle.resume_timeout; a slot, up to stream_limit_wait), which the
// client, waiting for the 100 before it sends a byte, cannot make up: a
// resume longer than the body timeout got a 408 for a body sent at once
// after the 100. nginx sends the 100 as it starts to read the body, and
// client_body_timeout runs from there. The drain's cut of reads
// (conns.cutReads, after pools.abort) wins, checked after the renewal.
func (p *Proxy) bodyFromContinue(ctx *fasthttp.RequestCtx) {
	if p.clientBodyTimeout <= 0 {
		return
	}
	c := ctx.Conn()
	_ = c.SetReadDeadline(time.Now().Add(p.clientBodyTimeout))
	if p.pools.aborted.Load() {
		_ = c.SetReadDeadline(time.Now())
	}
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
		// Counted here, not when the body has come: a client that
		// leaves after the 100 never gets the request to run, and its
		// lookup, which went to the store, was counted nowhere.
		p.metrics.CacheLookup(x.cache)
		ctx.SetUserValue(headLookup{}, x.cache)
		if !x.limitUntil.IsZero() {
			// The head waited for a slot: the body's run has what is
			// left of that wait (waitForSlot). Only a head that waited
			// pays for the boxed time.
			ctx.SetUserValue(headWaitEnd{}, x.limitUntil)
		}
		// The request's time runs from here (exchange.judged).
		ctx.SetUserValue(headStart{}, x.start)
		x.releaseFwd()
		return
	}
	if x.expecting {
		// A refused head's lookup, as an admitted one's above. Its envd
		// call is counted only for a refusal: an admitted head's is
		// counted when the request runs (countEnvd); finish ends this
		// one as a refused request.
		p.metrics.CacheLookup(x.cache)
		p.metrics.EnvdStarted(x.envd)
		if p.tel != nil && p.tel.TracingEnabled() {
			// Opened only now that the head is refused, but from its
			// start: the span covers the lookup that decided it.
			x.spanCtx, x.span = p.tel.StartServerSpanAt(&ctx.Request.Header, ctx.IsTLS(), remoteIP(ctx), x.start)
			// noteRequestID found no span to name it for: the one the
			// refusal carries leads to this trace as any other's does.
			x.noteRequestID(reqID)
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
	setRetcode(&ctx.Response.Header, x.upStatus != 0)
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

// headStart keys, in the RequestCtx of a request whose "Expect:
// 100-continue" head was admitted, when the head's run began (a
// time.Time, its exchange.start): the body's run is timed from there
// (exchange.judged).
type headStart struct{}

// headWaitEnd keys, in the RequestCtx of a request whose "Expect:
// 100-continue" head waited for a slot over max_streams_per_sandbox and
// was then admitted, the end of that wait (a time.Time, the head's
// exchange.limitUntil): the head and its body are one request, whose
// waits together take stream_limit_wait at most.
type headWaitEnd struct{}

// admittedHead is the head of an "Expect: 100-continue" upload that
// Expect admitted, held by its connection (connSet.keepHead) while
// fasthttp reads the start of its body (up to fasthttpPreRead) before the
// handler. fasthttp resets the request, head and user values, when that
// read fails (a client that leaves after the 100, a stalled body, the
// drain's cut) and then calls the error handler: without this copy its
// 499, 408 or 504 was logged, counted and traced as a head fasthttp never
// had (no host, method, target or sandbox, a new request id, no parent
// span, timed from the error handler), and an envd upload's was not
// counted in the platform's families. Pooled: an upload pays one copy of
// its head, other requests nothing.
type admittedHead struct {
	h          fasthttp.RequestHeader
	start      time.Time // the head's exchange.start
	sandboxID  string
	port       uint16
	pathPrefix int
	cache      telemetry.CacheResult
	envd       telemetry.EnvdRoute
	envdMethod telemetry.EnvdMethod
}

var admittedHeads = sync.Pool{New: func() any { return new(admittedHead) }}

// keepAdmittedHead has ctx's connection hold the head Expect admitted, x
// its exchange, until the body's run begins.
func (p *Proxy) keepAdmittedHead(ctx *fasthttp.RequestCtx, x *exchange) {
	ah := admittedHeads.Get().(*admittedHead)
	ctx.Request.Header.CopyTo(&ah.h)
	ah.start, ah.sandboxID, ah.port, ah.pathPrefix = x.start, x.sandboxID, x.port, x.pathPrefix
	ah.cache, ah.envd, ah.envdMethod = x.cache, x.envd, x.envdMethod
	p.conns.keepHead(ctx.Conn(), ah)
}

// restore gives ctx, whose request fasthttp reset, the head back, with the
// head's start (headStart) for begin, and x what the head's run found.
func (ah *admittedHead) restore(ctx *fasthttp.RequestCtx, x *exchange) {
	ah.h.CopyTo(&ctx.Request.Header)
	ctx.SetUserValue(headStart{}, ah.start)
	x.sandboxID, x.port, x.pathPrefix = ah.sandboxID, ah.port, ah.pathPrefix
	x.cache, x.envd, x.envdMethod = ah.cache, ah.envd, ah.envdMethod
}

// release returns ah to its pool; nil is none. A head of more lines or
// bytes than a connection keeps (keptHeadLines, keptHeadBytes,
// letGoOfHead) is let go of instead: its line slots outlive Reset.
func (ah *admittedHead) release() {
	if ah == nil {
		return
	}
	large := ah.h.Len() > keptHeadLines || len(ah.h.RawHeaders()) > keptHeadBytes
	ah.h.Reset()
	ah.start, ah.sandboxID = time.Time{}, ""
	if !large {
		admittedHeads.Put(ah)
	}
}

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
	if t.PathPrefix > 0 && climbsAboveRoot(h.RequestURI()[t.PathPrefix:]) {
		// "/sandbox/x/80/../y": the sandbox gets "/../y" (refusedTarget
		// judged it with the prefix). nginx resolves the dots before it
		// routes, and finds no sandbox in "/sandbox/x/y".
		x.fail(ctx, errAboveRoot, nil)
		return
	}
	id := t.ID()
	if acmeChallengeFor(h, &t) {
		// Before the lookup: the refusal holds whatever the route, and a
		// paused sandbox is not woken for it.
		x.fail(ctx, errACMEChallenge, id)
		return
	}
	x.port, x.pathPrefix = t.Port, t.PathPrefix
	if uri := h.RequestURI(); t.PathPrefix > 0 && uri[0] != '/' {
		// Absolute form ("http://<node>/sandbox/<id>/<port>/p"): the log's
		// target is its path alone (appendLogTarget), and the prefix counts
		// from the target's start.
		x.pathPrefix -= len(uri) - len(routing.TargetPath(uri))
	}
	if p.metrics != nil {
		p.countEnvd(x, h.RequestURI()[t.PathPrefix:], h.Method())
	}

	// again: the route is being looked up again, after a wait for a slot
	// or a held body's read (see below); the lookup that counts is the
	// first. reread: after a held body's read, which happens once.
	again, reread := false, false
	// readAt: when the store read this pass goes by began, which is what
	// forget compares a pause's time with (routeError). The first pass's
	// is the request's start; a pass after a wait or a held read stamps
	// its own.
	readAt := x.start
	// unmapped: the cached route, found without the request's port; the
	// lookup that follows reads the store again (Cache.Refresh).
	var unmapped *routing.Route
	// resumed: this request had the sandbox resumed once already; paused
	// again since, it is answered, not resumed again.
	resumed := false
lookup:
	// Not ctx: fasthttp cancels every RequestCtx when a drain starts, and a
	// request already in flight is to be answered. The cache bounds the
	// lookup itself (LookupTimeout); the drain deadline ends the wait
	// (dialCtx, cancelled by pools.abort), which a command_timeout longer
	// than the unwind outlived. The count of announced route changes
	// first: a change announced after it is judgeLate's to find.
	x.changes = p.cache.Changes()
	var route *routing.Route
	var res routing.CacheResult
	var err error
	if unmapped != nil {
		route, res, err = p.cache.Refresh(p.pools.dialCtx, id, unmapped)
	} else {
		route, res, err = p.cache.Get(p.pools.dialCtx, id)
	}
	if !again {
		x.cache = cacheResult(res)
	}
	if !x.expecting && !again {
		// Only a head that carried an Expect line can have been admitted
		// by Expect: other requests skip the user value lookup.
		byHead := false
		if x.seen.expect {
			var r telemetry.CacheResult
			if r, byHead = ctx.UserValue(headLookup{}).(telemetry.CacheResult); byHead {
				x.cache = r // admitted by Expect: its head's lookup, counted then (handle)
			}
		}
		if !byHead {
			p.metrics.CacheLookup(x.cache)
		}
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
			if st == statePaused && p.resumer != nil && !resumed {
				// After authorize: an unauthorized request wakes no VM.
				// Nor does one refused whatever the state: a port the
				// route does not expose goes on to its 404 (or its
				// route's re-read) below, which dials nothing, and a
				// declared body over the limit gets its 413 here (nginx
				// refuses it before any access phase could resume).
				if _, perr := p.backend(route, t.Port); perr != nil {
					break
				}
				if perr := p.bodyTooLarge(h); perr != nil {
					p.refuseEarly(ctx, x, *perr, id)
					return
				}
				resumed = true
				if err := p.resume(ctx, sb, route.ID); errors.Is(err, errDrainCut) {
					// As a request the deadline cut waiting on its sandbox.
					x.fail(ctx, proxyError{status: 504, code: CodeDrainTimeout, msg: "proxy shutting down: the sandbox was not resumed before the drain deadline"}, id)
					ctx.SetConnectionClose()
					return
				} else if clientLeft(ctx.Conn()) {
					// Gone during the call (up to resume_timeout): the
					// request is not sent on to the sandbox, where a
					// command nobody waits for (and the client may send
					// again) would run all the same. Logged as nginx's
					// 499, as a client gone during a wait for a slot.
					x.fail(ctx, proxyError{status: 499, code: CodeClientClosed, msg: "client closed the connection while the request waited for its sandbox's resume"}, id)
					ctx.SetConnectionClose()
					return
				} else if err != nil && !errors.Is(err, errResumeKilled) && sb.state() == statePaused {
					x.fail(ctx, errResumeFailed, id)
					return
				}
				// Running now, or changed since (killed, set running or
				// pausing by the control plane during the call, which may
				// then have failed): looked up again from the route, the
				// later word standing. A sandbox restored from its
				// snapshot may be on another node or address, stored
				// before the lifecycle manager answered (up to
				// resume_timeout later): the address read before the call
				// failed 502 route_changed, or, not announced, may already
				// be another sandbox's.
				again, readAt = true, time.Now()
				goto lookup
			}
			if st == statePausing {
				// Not resumed: the lifecycle manager is pausing it, and
				// a resume would race that.
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
		if perr != nil && perr.code == CodePortNotMapped && res == routing.CacheHit && unmapped == nil {
			// A port exposed after the sandbox's creation: the control
			// plane writes it to the store and tells no proxy.
			unmapped, again, readAt = route, true, time.Now()
			goto lookup
		}
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
				p.refuseEarly(ctx, x, *perr, id)
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
	n, ok := p.staleLogged.Admit(time.Now(), repeatLogEvery)
	if !ok {
		return
	}
	p.cfg.Logger.Warn("route store failing; serving cached route past its TTL", loglimit.WithSuppressed(n, "sandbox_id", id)...)
}

// resume has the lifecycle manager resume paused sandbox e (id), and
// returns nil when it did (errDrainCut: the drain deadline cut the call). The call that succeeds marks e running, as the
// platform's proxy does, until the lifecycle manager's /admin/state says
// so itself: a burst of requests that came during the pause makes one
// call, not one each. A kill or a pausing set during the call stands:
// it is the control plane's later word (a paused set again during it is
// taken as the one the call ended). The call, not each request that
// waited for it, counts in cubeproxy_sandbox_resumes_total.
func (p *Proxy) resume(ctx *fasthttp.RequestCtx, e *sandboxState, id string) error {
	reqID := string(ctx.Request.Header.Peek(HeaderRequestID))
	paused := func() bool { return e.state() == statePaused }
	err := p.resumer.resume(id, reqID, paused, func(err error) {
		if errors.Is(err, errDrainCut) || errors.Is(err, errResumeKilled) {
			return // the proxy's cut, not a failed resume
		}
		if err != nil {
			p.metrics.SandboxResume(telemetry.ResumeFailed)
			return
		}
		p.metrics.SandboxResume(telemetry.ResumeResumed)
		// Restored from its snapshot, the sandbox may be at another
		// address, which the lifecycle manager stored before its 200 and
		// whose announcement may come after it, or not at all: the
		// requests that waited read the route from the store again (the
		// cached one kept should the store fail).
		p.cache.Expire(id)
		// The times before the swap, as sandboxes.setState.
		now := time.Now().UnixNano()
		e.changedAt.Store(now)
		e.resumedAt.Store(now)
		e.casState(statePaused, stateRunning)
	})
	if err != nil && !errors.Is(err, errDrainCut) && !errors.Is(err, errResumeKilled) {
		if n, ok := e.resumeLogged.Admit(time.Now(), repeatLogEvery); ok {
			p.cfg.Logger.Warn("lifecycle manager did not resume the paused sandbox", loglimit.WithSuppressed(n, "sandbox_id", id, "request_id", reqID, "error", err)...)
		}
	}
	return err
}

// repeatLogEvery is how often a line that every request can repeat while
// a failure lasts is logged (the fields of Proxy and sandboxState that end
// in Logged); the next line carries the count held back, "suppressed".
// Without the count a line a second read the same for one failed request
// a second as for thousands.
const repeatLogEvery = time.Second

// routeError answers a failed route lookup; res is that lookup's cache
// result and readAt when it began.
func (p *Proxy) routeError(ctx *fasthttp.RequestCtx, x *exchange, err error, id []byte, res routing.CacheResult, readAt time.Time) {
	// The id the client asked for, so that the access log says which
	// sandbox was not found (the copy is on this error path only).
	x.sandboxID = string(id)
	switch {
	case errors.Is(err, context.Canceled) && p.pools.aborted.Load():
		// The drain deadline ended the wait (dialCtx): as a request it
		// cut waiting on its sandbox, not the store's failure.
		x.fail(ctx, proxyError{status: 504, code: CodeDrainTimeout, msg: "proxy shutting down: the route was not found before the drain deadline"}, id)
		ctx.SetConnectionClose()
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
			// This lookup's own result, not the request's first: after
			// a held read or a wait for a slot the first may have been
			// a hit. And the start of the store read that answered it
			// (ReadStart), not this lookup's: a lookup that joined a
			// read in flight got an answer begun before it, and a pause
			// set meanwhile, on a route stored since and not yet
			// announced, was forgotten and the paused sandbox served
			// as running. readAt only for a store that says no time.
			if res == routing.CacheMiss {
				since := readAt.UnixNano()
				if start, ok := routing.ReadStart(err); ok {
					since = start
				}
				p.sandboxes.forget(x.sandboxID, since)
			}
		}
		x.fail(ctx, proxyError{status: 404, code: CodeNotFound, msg: "sandbox not found"}, id)
	case asFieldError(err) != nil:
		fe := asFieldError(err)
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
		if short {
			if n, ok := p.resourceErrLogged.Admit(time.Now(), repeatLogEvery); ok {
				p.cfg.Logger.Error("cannot connect to the route store: proxy out of resources (descriptors or memory)",
					loglimit.WithSuppressed(n, "sandbox_id", string(id), "err", err, "open_files_limit", openFilesLimit())...)
			}
		} else if n, ok := p.storeErrLogged.Admit(time.Now(), repeatLogEvery); ok {
			p.cfg.Logger.Error("route store unavailable", loglimit.WithSuppressed(n, "sandbox_id", string(id), "err", err)...)
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

// asFieldError returns err's *routing.FieldError, nil when it has none.
// A function of its own: errors.As's target escapes, and declared in
// routeError it was an allocation on every 404, the negative cache's hits
// included.
func asFieldError(err error) *routing.FieldError {
	var fe *routing.FieldError
	if errors.As(err, &fe) {
		return fe
	}
	return nil
}

// backend chooses the address to dial: the sandbox itself, at the
// container port, when it runs on this node (mapped or not, as on the
// platform's proxy: see routing.Route.OnNode), else the node that runs it
// through the mapped host port. Only addresses a route names are ever
// dialed.
func (p *Proxy) backend(r *routing.Route, port uint16) (netip.AddrPort, *proxyError) {
	if r.OnNode(p.cfg.NodeIP) {
		if !r.SandboxIP.IsValid() {
			return netip.AddrPort{}, &proxyError{status: 404, code: CodeRouteInvalid, msg: "route has no SandboxIP for a sandbox on this node"}
		}
		return netip.AddrPortFrom(r.SandboxIP, port), nil
	}
	hostPort, ok := r.HostPort(port)
	if !ok {
		return netip.AddrPort{}, &proxyError{status: 404, code: CodePortNotMapped, msg: fmt.Sprintf("port %d is not exposed by this sandbox", port)}
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
		if req.Header.IsOptions() && serverWide(target) {
			// "OPTIONS http://host" asks about the server, not its root:
			// the last proxy sends it as "OPTIONS *" (RFC 9112 3.2.4),
			// where the parsed URI's path made it "OPTIONS /".
			req.Header.SetRequestURI("*")
		}
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
		// Dated by its end, as an answer is (respond): the sandbox may
		// have worked on it for minutes before it cut it, or before the
		// client gave up, and an idle reaper polling last_active must not
		// find it idle since the request began.
		sb.done(time.Now().UnixMilli())
		if errors.Is(err, errBodyTooLarge) || malformedBody(err) {
			p.lingerBody(ctx)
		}
		p.upstreamError(ctx, x, err, t.ID(), addr)
		return
	}
	if c.manyLines {
		ctx.SetUserValue(headDropKey{}, (*headDrop)(ctx))
	}
	scopeResponse(&resp.Header, t)
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
		// Dated by the answer, as any other (below).
		sb.done(x.start.Add(x.upTime).UnixMilli())
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
		s.coded = true
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
	// Forwarded goes out (nil: not) only where the client sent a line of
	// it. The scan's count is not enough: a head with no lines at all (an
	// HTTP/1.0 request in absolute form) has no raw copy to scan, which
	// the scan takes for a head built in code and answers seeAll.
	var forwarded []byte
	if seen.forwarded > 0 {
		if prior := h.PeekAll("Forwarded"); len(prior) > 0 {
			forwarded = appendForwarded(fwdBuf[:0], prior, ip)
		}
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
		if seen.hop && forwarded != nil && len(h.PeekAll("Forwarded")) == 0 {
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
		dropForwardingAliases(h, masked, t.PathPrefix > 0)
	}
	if seen.spaceNames > 0 {
		dropInvalidNames(h)
	}
	if order != nil {
		order.restore(h)
		order.release()
	}
	if p.cfg.Signer != nil {
		// After the restore, which would put a repeated Referer's lines
		// back as they were sent.
		stripRefererToken(h)
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
	if forwarded != nil {
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

	if t.PathPrefix > 0 {
		stripPathPrefix(h, t)
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

// serverWide reports whether the absolute-form target names a server
// alone: an authority with neither path nor query ("http://host:8080").
func serverWide(target []byte) bool {
	_, rest, ok := bytes.Cut(target, []byte("://"))
	return ok && !bytes.ContainsAny(rest, "/?")
}

// refuseEarly answers perr (bodyTooLarge's 413) before what would cost
// more than the refusal: a paused sandbox's resume, a wait for a slot. The
// body is unread, so it lingers as forward's 413 does; an Expect head's
// client has sent none.
func (p *Proxy) refuseEarly(ctx *fasthttp.RequestCtx, x *exchange, perr proxyError, id []byte) {
	if !x.expecting {
		p.lingerBody(ctx)
	}
	x.fail(ctx, perr, id)
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
	// A pooled buffer: SetRequestURIBytes copies it, and a link let through
	// (a fetch, an event stream) carries its token on every request.
	bp := uriBufPool.Get().(*[]byte)
	dst := append((*bp)[:0], path...)
	dst = append(dst, '?')
	if clean, _ := auth.AppendStripQueryParam(dst, query, auth.QueryParamName); len(clean) > len(dst) {
		dst = clean
	} else {
		dst = dst[:len(path)]
	}
	// The request's setter, not the header's: it also drops a URI parsed
	// earlier, which Write would otherwise send instead.
	req.SetRequestURIBytes(dst)
	*bp = dst
	uriBufPool.Put(bp)
}

// uriBufPool holds the buffers stripSignedToken builds a request target in.
var uriBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// stripRefererToken removes the signed-token query parameter from every
// Referer line. A link let through without the 302 (on a host routed by
// its path, a form POST, an event stream) leaves the token in the page's
// URL, and the browser sends that URL as the Referer of the page's next
// requests: in full on the shared origin, where every sandbox's pages are
// served, so another tenant's server got a credential to the linked
// sandbox. Every other byte of the Referer is kept; a request whose
// Referer has no token (nearly all) costs a scan of it and no copy.
func stripRefererToken(h *fasthttp.RequestHeader) {
	lines := h.PeekAll(fasthttp.HeaderReferer)
	found := false
	for _, l := range lines {
		if _, query, ok := bytes.Cut(l, []byte{'?'}); ok && auth.HasQueryParam(query, auth.QueryParamName) {
			found = true
			break
		}
	}
	if !found {
		return
	}
	// Copies: the lines alias the header's buffers, which the writes reuse.
	kept := make([][]byte, len(lines))
	for i, l := range lines {
		path, query, ok := bytes.Cut(l, []byte{'?'})
		kept[i] = append([]byte(nil), path...)
		if clean, _ := auth.AppendStripQueryParam(nil, query, auth.QueryParamName); ok && len(clean) > 0 {
			kept[i] = append(append(kept[i], '?'), clean...)
		}
	}
	if len(kept) == 1 {
		h.SetBytesV(fasthttp.HeaderReferer, kept[0]) // in its place
		return
	}
	h.Del(fasthttp.HeaderReferer)
	for _, l := range kept {
		h.AddBytesV(fasthttp.HeaderReferer, l)
	}
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
		if n, ok := p.loopLogged.Admit(time.Now(), repeatLogEvery); ok {
			p.cfg.Logger.Warn("route names one of the proxy's own listeners; refusing the request",
				loglimit.WithSuppressed(n, "sandbox_id", string(id), "addr", addr.String())...)
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
		if n, ok := p.resourceErrLogged.Admit(time.Now(), repeatLogEvery); ok {
			p.cfg.Logger.Error("cannot connect to sandboxes: proxy out of resources (descriptors or local ports)",
				loglimit.WithSuppressed(n, "sandbox_id", string(id), "err", err, "open_files_limit", openFilesLimit())...)
		}
		x.fail(ctx, proxyError{status: 503, code: CodeOutOfResources, msg: "proxy is out of resources; retry shortly", retryAfter: 1}, id)
	case errors.As(err, &de) && isTimeout(de.err):
		// Neither accepted nor refused: a frozen sandbox, a full listen
		// backlog, a dropped SYN. A gateway timeout, as nginx answers for
		// proxy_connect_timeout; "refused" would be untrue.
		x.fail(ctx, proxyError{status: 504, code: CodeUpstreamConnectTimeout, msg: "sandbox port did not accept the connection in time"}, id)
	case errors.As(err, &de):
		x.fail(ctx, proxyError{status: 502, code: CodeUpstreamConnect, msg: "sandbox port refused the connection"}, id)
	case errors.As(err, new(*sendTimeoutError)):
		x.fail(ctx, proxyError{status: 504, code: CodeUpstreamTimeout, msg: "sandbox stopped reading the request (none of it taken for upstream.idle_timeout)"}, id)
		ctx.SetConnectionClose() // the rest of the body is not read
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		msg := "sandbox did not answer in time"
		if x.upStatus != 0 {
			// Its head came, the rest of a body read whole did not: not
			// the missing head the README gives this message for.
			msg = "sandbox stopped sending its answer (nothing for upstream.idle_timeout)"
		}
		x.fail(ctx, proxyError{status: 504, code: CodeUpstreamTimeout, msg: msg}, id)
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

func isSmallBuffer(err error) bool {
	var sb *fasthttp.ErrSmallBuffer
	return errors.As(err, &sb) || errors.Is(err, fasthttp.ErrSmallReadBuffer)
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
