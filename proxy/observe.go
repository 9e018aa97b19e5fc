package proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// exchange is what the proxy records about one request while it runs. It
// lives on the handler's stack; a stream or tunnel that outlives the
// handler takes a copy and finishes it when it ends, so metrics, the span
// and the access log line describe the whole stream.
type exchange struct {
	start time.Time

	spanCtx context.Context
	span    trace.Span
	cspan   trace.Span // upstream exchange; nil when none was made
	// requestID is the answer's X-Cube-Request-Id, for a recording server
	// span's cube.request.id (noteRequestID).
	requestID string

	sandboxID string
	port      uint16
	// pathPrefix is the length of the "/sandbox/<id>/<port>" prefix of a
	// request routed by its path (routing.Target.PathPrefix), counted from
	// the start of the target's path (not of an absolute-form target's
	// scheme): the log's uri is the path without it, the one the sandbox
	// got.
	pathPrefix int
	// envd and envdMethod are the platform proxy's metric labels of an
	// envd call (telemetry.ClassifyEnvd), counted in flight since serve
	// routed it; EnvdNone for any other request.
	envd       telemetry.EnvdRoute
	envdMethod telemetry.EnvdMethod
	upstream   netip.AddrPort
	backendIP  netip.Addr
	cache      telemetry.CacheResult
	kind       telemetry.RouteKind
	via        authVia // how authorize let the request through
	changes    uint64  // routing.Cache.Changes when the route was read (judgeLate)
	errCode    string

	upStatus int
	upTime   time.Duration // request start to upstream response headers
	// upBegin is request start to the start of the upstream exchange: the
	// upstream time (nginx's $upstream_response_time) runs from there to
	// the end of the exchange, without the route lookup before it.
	upBegin time.Duration
	// headTime is the request's first byte to start: what the client
	// took to send its head, and the body fasthttp reads before the
	// handler (access log on only). The log's request_time includes it,
	// as nginx's $request_time does; metrics and spans start at start,
	// less judged.
	headTime time.Duration
	// judged is how long before start the request's "Expect:
	// 100-continue" head began to be judged (its run's start, headStart),
	// when Expect admitted it: 0 for any other request. The head and the
	// body's run are one request, and the head's judgement (a paused
	// sandbox's resume, a wait for a slot) is part of its time, so its
	// span and latency metrics begin there, as its log line's
	// request_time does (headTime covers it).
	judged  time.Duration
	bytesIn int64 // body bytes read from the client: never what its Content-Length claims
	// bodyEnded: the client's body was read to its end (forward, or
	// overLimit).
	bodyEnded bool
	// held is the size of the body overLimit read whole and holds in
	// memory until it is sent, counted in Proxy.heldBodies (0: none).
	held int64
	// heldOn is the sandbox entry whose share (HeldBodyPerSandbox) held
	// counts against: the one readHeldBody took it on, which serve may
	// have looked up again since.
	heldOn *sandboxState
	// limitUntil is when the request's wait for a slot over
	// max_streams_per_sandbox ends (waitForSlot), set by its first: zero
	// until then. A request that loses the slot it saw free waits on
	// until this, not anew, so that all its waits together take at most
	// stream_limit_wait.
	limitUntil time.Time
	// answeredEarly: the sandbox answered before the client's body was
	// all sent to it.
	answeredEarly bool
	bytesOut      int64
	retries       int // connects and requests retried upstream (the span's cube.upstream.retries)
	// retryCode is the error code of the first upstream attempt that
	// failed and was made again (the log's upstream_retry_code): a
	// constant, never a request's bytes.
	retryCode string

	stream bool // a body relayed as it comes (bodyStream) or a tunnel: counted as an open stream
	// sized: the stream is a fixed-length body (a download too large to
	// read whole): open while it lasts, timed as a response when done.
	sized bool
	owned bool // a bodyStream or tunnel finishes it
	// headLater: the proxy writes the head itself after the handler (a
	// tunnel's 101, a detached stream's head), to a client that may be
	// gone by then; that write counts the request, not headersReady.
	headLater bool
	// drained: the drain ended this GET event stream cleanly, at its
	// start, so that its client reconnects elsewhere (no error code: the
	// client sees a normal end; the streams-ended metric says drain).
	drained bool
	// expecting: the head of an "Expect: 100-continue" request, judged
	// before fasthttp asks the client for the body (Expect); admitted:
	// nothing refused it, and the request runs again once the body comes.
	expecting, admitted bool
	// early: answered before fasthttp numbered the request (from its
	// ErrorHandler or ExpectHandler), whose ConnRequestNum is then still
	// the one before's.
	early bool
	// noHead: fasthttp refused or dropped the head before the proxy saw
	// it: its method, target and version are logged empty, not as
	// fasthttp's defaults for a header it holds none of (GET / HTTP/1.1).
	noHead bool

	fwd *fwdHeaders // access log on: forwarding headers as the client sent them

	seen headSeen // what one pass over the request's head found (scanHead)
}

// fail answers the request with a proxy error and records its code.
//
// A 499 records that the client left before any answer reached it: the
// one fasthttp still writes goes to a socket the client closed or reset,
// and is counted as no body sent (log, metrics and span), as nginx logs
// its 499 and as the proxy's other 499s (a 101 or a stream's head the
// client was gone for) are. A client that only half-closed may still
// read it, but the proxy cannot tell: the write succeeds after a close too.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e proxyError, sandboxID []byte) {
	x.errCode = e.code
	x.kind = telemetry.RouteError
	writeError(ctx, e, sandboxID)
	if len(ctx.Request.Header.Peek("Origin")) > 0 {
		exposeToPages(&ctx.Response.Header)
	}
	switch {
	case e.status == statusClientClosed:
		x.bytesOut = 0
	case !ctx.IsHead(): // fasthttp sends no body to a HEAD
		x.bytesOut = int64(len(ctx.Response.Body()))
	}
}

// fasthttpPreRead is how much of a Content-Length body fasthttp reads
// before calling the handler (with StreamRequestBody; readBodyWithStreaming).
const fasthttpPreRead = 8 << 10

// begin starts the exchange x of ctx, a request on one of conns's
// connections: the set that holds the arrival of its first byte, from
// which the access log's request_time runs (the traffic listeners',
// Proxy.conns, or the redirect listener's, Server.redirectConns).
func (p *Proxy) begin(ctx *fasthttp.RequestCtx, x *exchange, conns *connSet) {
	x.start = time.Now()
	x.early = x.expecting
	// A head judged before its body (Expect) has no body read yet, and no
	// span: admitted, it runs again as the request, which has its own.
	if !x.expecting {
		cl := ctx.Request.Header.ContentLength()
		if cl != 0 && cl != -2 {
			// Only a head that frames a body is judged by Expect (frameless),
			// so other requests skip the user value lookup.
			if head, ok := ctx.UserValue(headStart{}).(time.Time); ok {
				x.judged = max(x.start.Sub(head), 0)
				// The body came: the connection's copy of the head
				// (admittedHead) is not needed.
				conns.dropHead(ctx.Conn())
			}
		}
		p.startSpan(ctx, x)
		// What fasthttp read of the body before the handler ran; forward
		// replaces it with the count of what it read and sent on.
		if cl > 0 {
			x.bytesIn = int64(min(cl, fasthttpPreRead))
		}
	}
	if p.cfg.AccessLog != nil {
		x.fwd = fwdHeadersPool.Get().(*fwdHeaders)
		x.fwd.capture(&ctx.Request.Header)
		// Unknown (zero) for a connection not in conns: request_time
		// then starts here.
		if first := conns.began(ctx.Conn()); !first.IsZero() {
			x.headTime = max(x.start.Sub(first), 0)
		}
	}
}

// startSpan opens the request's server span (tracing on only). A head
// fasthttp dropped (noHead) has only its defaults in the header: its span
// claims no method or path.
func (p *Proxy) startSpan(ctx *fasthttp.RequestCtx, x *exchange) {
	if p.tel == nil || !p.tel.TracingEnabled() { // off: no span to end either
		return
	}
	if x.noHead {
		x.spanCtx, x.span = p.tel.StartHeadlessServerSpan(ctx.IsTLS(), remoteIP(ctx))
		return
	}
	if x.judged > 0 {
		x.spanCtx, x.span = p.tel.StartServerSpanAt(&ctx.Request.Header, ctx.IsTLS(), remoteIP(ctx), x.start.Add(-x.judged))
		return
	}
	x.spanCtx, x.span = p.tel.StartServerSpan(&ctx.Request.Header, ctx.IsTLS(), remoteIP(ctx))
}

// startUpstream records that the exchange with addr begins and opens the
// client span (tracing on only). Set only here, the upstream address in the log
// and the span names a sandbox the proxy went on to ask, not one a 413 or
// 429 kept it from.
func (p *Proxy) startUpstream(ctx *fasthttp.RequestCtx, x *exchange, addr netip.AddrPort) {
	x.upstream = addr
	if p.cfg.AccessLog != nil { // only the log uses it: no clock read without one
		x.upBegin = time.Since(x.start)
	}
	if p.tel != nil && p.tel.TracingEnabled() {
		x.cspan = p.tel.StartClientSpan(x.spanCtx, &ctx.Request.Header, x.upstream)
	}
}

// noteRequestID keeps id, the request's X-Cube-Request-Id, for its
// server span (tracing on): the id a client reports and the access log
// shows, so that an operator can go from either to the request's trace.
// Called as soon as the id is known, before a stream or tunnel takes its
// copy of x; set when the span ends, with its other attributes, since
// each SetAttributes call grows the SDK's attribute slice.
func (x *exchange) noteRequestID(id []byte) {
	if x.span != nil && x.span.IsRecording() {
		x.requestID = string(id)
	}
}

// retried records an upstream attempt that failed with err (code its
// error code) before any answer, at at (zero: now), and that is made
// again on h: the server span's cube.upstream.retries counts it and,
// tracing on, its client span ends and the next attempt's begins
// (telemetry.ResendClientSpan), its traceparent in h.
func (p *Proxy) retried(x *exchange, h *fasthttp.RequestHeader, code string, err error, at time.Time) {
	x.retries++
	if x.retries == 1 {
		x.retryCode = code
	}
	if x.cspan == nil {
		return
	}
	if at.IsZero() {
		at = time.Now()
	}
	x.cspan = p.tel.ResendClientSpan(x.spanCtx, x.cspan, h, x.upstream, x.retries, at, code, err)
}

// headersReady records time to response headers, unless the head is
// written later (headLater): that write counts the request, with the
// status its client got.
func (p *Proxy) headersReady(ctx *fasthttp.RequestCtx, x *exchange) {
	if !x.headLater {
		p.metrics.RequestDone(ctx.Response.StatusCode(), x.kind, time.Since(x.start)+x.judged)
	}
	if x.stream {
		p.metrics.StreamOpened(x.kind)
	}
}

// finish records the end of a request. rc is nil for tunnels, whose log
// entry was captured when the handler returned.
func (p *Proxy) finish(rc *fasthttp.RequestCtx, x *exchange, status int, err error, entry *accesslog.Entry) {
	total := time.Since(x.start)
	// The metrics' time runs from the request's head (judged); the log's
	// request_time has it in headTime already.
	timed := total + x.judged
	if x.envd != telemetry.EnvdNone {
		p.metrics.EnvdDone(x.envd, x.envdMethod, status, max(x.headTime, x.judged)+total)
	}
	switch {
	case x.sized:
		p.metrics.DownloadDone(status, x.kind, timed)
	case x.stream:
		p.metrics.StreamClosed(x.kind, timed)
	default:
		p.metrics.ResponseDone(status, x.kind, timed)
	}
	if x.owned {
		why := streamEnd(x.errCode, err)
		if x.drained && why == telemetry.StreamComplete {
			why = telemetry.StreamDrain
		}
		p.metrics.StreamEnded(x.kind, why)
	}
	if status == errRevoked.status && x.errCode == CodeCredentialRevoked {
		// A route change refused the request for the credential it came
		// with, before its answer's head went out (upstreamError, or a
		// tunnel cut before its 101): an auth rejection like authorize's.
		// A stream cut after its head was answered, not refused.
		p.metrics.AuthRejected(telemetry.AuthCredentialRevoked)
	}
	p.metrics.Bytes(x.kind, x.bytesIn, x.bytesOut)
	if x.cspan != nil {
		if telemetry.ClientEnded(x.errCode) {
			// The client hung up or stopped reading, and the proxy closed
			// the sandbox's side: the upstream exchange did not fail.
			err = nil
		}
		telemetry.EndClientSpan(x.cspan, x.upStatus, x.errCode, err)
	}
	if x.span != nil {
		r := telemetry.SpanResult{
			SandboxID: x.sandboxID, Port: int(x.port), Kind: x.kind, Status: status,
			BytesIn: x.bytesIn, BytesOut: x.bytesOut, Retries: x.retries, Cache: x.cache, ErrorCode: x.errCode,
			RequestID: x.requestID,
		}
		if x.span.IsRecording() && x.upstream.IsValid() {
			r.Upstream = x.upstream.String()
		}
		telemetry.EndServerSpan(x.span, &r)
	}
	if p.cfg.AccessLog == nil {
		return
	}
	defer x.releaseFwd()
	if entry != nil {
		entry.Status, entry.BodyBytesSent, entry.BytesIn, entry.RequestTime = status, x.bytesOut, x.bytesIn, x.headTime+total
		entry.ErrorCode = x.errCode
		if x.upstream.IsValid() {
			entry.UpstreamResponseTime = x.upstreamTime(total)
		}
		p.cfg.AccessLog.Log(entry)
		return
	}
	s := logScratchPool.Get().(*logScratch)
	p.fillEntry(rc, x, status, total, s)
	p.cfg.AccessLog.Log(&s.e)
	s.e = accesslog.Entry{}
	logScratchPool.Put(s)
}

// writtenAnswer is the end of an exchange answered during the drain,
// whose answer fasthttp writes once the handler has returned: it is
// finished (logged, counted, its span ended) when that write is over,
// as fasthttp closes the request's io.Closer user values then, before
// it recycles the request, on a failed write too. An answer whose write
// the drain deadline cut (conns.cutWrites) is logged with error_code
// drain_timeout, as a stream the deadline cuts, not as sent: its client
// got part of it, or none. Only during the drain: the line is a copy
// (captureEntry), and the drain is the one cut of such a write the
// proxy makes itself; outside it the line is logged first (handle).
type writtenAnswer struct {
	p      *Proxy
	x      exchange // a copy: the handler's is gone with its stack
	status int
	entry  *accesslog.Entry // nil: the access log is off
	conn   net.Conn
}

// writtenAnswerKey keys the request's writtenAnswer among its user values.
type writtenAnswerKey struct{}

// finishWritten hands the end of exchange x, answered in ctx, to a
// writtenAnswer.
func (p *Proxy) finishWritten(ctx *fasthttp.RequestCtx, x *exchange) {
	w := &writtenAnswer{p: p, x: *x, status: ctx.Response.StatusCode(), conn: ctx.Conn()}
	w.entry = p.captureEntry(ctx, &w.x, w.status)
	ctx.SetUserValue(writtenAnswerKey{}, w)
}

// Close finishes the exchange once fasthttp's write of its answer is
// over.
func (w *writtenAnswer) Close() error {
	if w.p.conns.writesCut.Load() && writeFailed(w.conn) {
		w.x.errCode = CodeDrainTimeout
	}
	w.p.finish(nil, &w.x, w.status, nil, w.entry)
	return nil
}

// writeFailed reports whether a write to c, a traffic listener's client
// connection, has failed.
func writeFailed(c net.Conn) bool {
	switch c := c.(type) {
	case *clientConn:
		return c.writeFailed.Load()
	case *tlsConn:
		return c.writeFailed.Load()
	}
	return false
}

// streamEnd is why a stream or tunnel ended, from the error code its
// exchange ended with (the one its log line and span carry) and err, what
// it ended on.
func streamEnd(code string, err error) telemetry.StreamEnd {
	switch code {
	case "":
		if err == nil {
			return telemetry.StreamComplete
		}
		return telemetry.StreamError
	case CodeClientClosed:
		return telemetry.StreamClient
	case CodeUpstreamReset, CodeUpstreamBadHeader:
		return telemetry.StreamSandbox
	case CodeUpstreamTimeout, CodeClientWriteTimeout:
		return telemetry.StreamTimeout
	case CodeDrainTimeout:
		return telemetry.StreamDrain
	case CodeSandboxKilled:
		return telemetry.StreamKilled
	case CodeCredentialRevoked, CodeRouteChanged:
		return telemetry.StreamRouteChanged
	}
	return telemetry.StreamError
}

// captureEntry copies the log entry of an exchange that outlives its
// handler (a detached stream, a tunnel): fasthttp recycles the request when
// the handler returns, and finish completes the entry at the end. Until
// the handler returns, the response still carries the sandbox's request
// id if it sent one; the request has the id the client gets (its own, or
// the one generated), so that one goes on the response first. Nil when the
// access log is off.
func (p *Proxy) captureEntry(ctx *fasthttp.RequestCtx, x *exchange, status int) *accesslog.Entry {
	if p.cfg.AccessLog == nil {
		return nil
	}
	setResponseID(&ctx.Response.Header, ctx.Request.Header.Peek(HeaderRequestID))
	s := logScratchPool.Get().(*logScratch)
	p.fillEntry(ctx, x, status, 0, s)
	e := cloneEntry(&s.e)
	s.e = accesslog.Entry{}
	logScratchPool.Put(s)
	return e
}

// logScratch holds an entry and the bytes its address strings point into;
// pooled, so logging a request allocates nothing.
type logScratch struct {
	e   accesslog.Entry
	buf [160]byte
}

var logScratchPool = sync.Pool{New: func() any { return new(logScratch) }}

// fwdHeaders holds X-Real-IP, X-Forwarded-For, X-Forwarded-Proto, Host,
// the request target, User-Agent and X-Cube-Instance-Id as the client sent
// them. prepareRequest rewrites them for the sandbox (a route's
// MaskRequestHost replaces Host; the signed token's parameter is removed
// from the target, an absolute-form target becomes its path and query;
// any of them the client's Connection names is removed); the access log
// shows them as received (nginx's $http_x_real_ip..., $host,
// $request_uri, $http_user_agent). Pooled.
type fwdHeaders struct {
	b   []byte
	end [fwdSlots]int // value i is b[end[i-1]:end[i]]
}

var fwdHeadersPool = sync.Pool{New: func() any { return new(fwdHeaders) }}

var forwardingHeaders = [3]string{0: "X-Real-IP", fwdFor: "X-Forwarded-For", 2: "X-Forwarded-Proto"}

// fwdFor is X-Forwarded-For's slot in fwdHeaders.
const fwdFor = 1

// Slots of fwdHeaders after the forwarding headers: the Host header, the
// request target, User-Agent and X-Cube-Instance-Id.
const (
	fwdHost = len(forwardingHeaders) + iota
	fwdTarget
	fwdUserAgent
	fwdInstanceID
	fwdSlots
)

func (f *fwdHeaders) capture(h *fasthttp.RequestHeader) {
	f.b = f.b[:0]
	for i, name := range forwardingHeaders {
		if i == fwdFor {
			// Every line, joined as the sandbox gets them (appendForwardedFor;
			// nginx's $http_x_forwarded_for joins them too): a balancer that adds
			// its own line (HAProxy's option forwardfor) puts the address it
			// saw after the client's, and the first line alone is the
			// client's claim.
			f.b = appendJoinedLines(f.b, h.PeekAll(name))
		} else {
			f.b = append(f.b, h.Peek(name)...)
		}
		f.end[i] = len(f.b)
	}
	f.b = append(f.b, logHost(h)...)
	f.end[fwdHost] = len(f.b)
	f.b = appendLogTarget(f.b, h.RequestURI())
	f.end[fwdTarget] = len(f.b)
	f.b = append(f.b, h.UserAgent()...)
	f.end[fwdUserAgent] = len(f.b)
	f.b = append(f.b, h.Peek(headerInstanceID)...)
	f.end[fwdInstanceID] = len(f.b)
}

// headerInstanceID is the request header the access log's
// x_cube_instance_id shows.
const headerInstanceID = "X-Cube-Instance-Id"

// logHost returns the host a request's access log line shows (nginx's
// $host): its Host line, or, for a request in absolute form whose Host is
// missing or empty, the request target's host, userinfo dropped, which is
// the host the client asked for: the one an HTTP/1.0 request without Host
// is routed by (settleHost), and the one an empty Host's 400 was about. A Host line that is there is
// shown as sent: the proxy serves an absolute-form target only when it
// names the same sandbox.
func logHost(h *fasthttp.RequestHeader) []byte {
	if host := h.Host(); len(host) > 0 {
		return host
	}
	authority, _ := routing.TargetAuthority(h.RequestURI()) // userinfo, and so a password, dropped
	return authority
}

// appendLogTarget appends the request target as nginx logs it
// ($request_uri): an absolute-form target ("http://host/p?q") as its path
// and query ("/p?q"; "/" for an empty path), as the proxy forwards it;
// any other target as it is.
func appendLogTarget(dst, target []byte) []byte {
	if len(target) == 0 || target[0] == '/' {
		return append(dst, target...)
	}
	i := bytes.Index(target, []byte("://"))
	if i < 0 {
		return append(dst, target...) // "*" (OPTIONS) or what no route accepts
	}
	rest := target[i+len("://"):]
	j := bytes.IndexAny(rest, "/?#")
	if j < 0 || rest[j] != '/' {
		dst = append(dst, '/')
	}
	if j < 0 {
		return dst
	}
	return append(dst, rest[j:]...)
}

// get returns value i; it aliases f.b.
func (f *fwdHeaders) get(i int) string {
	start := 0
	if i > 0 {
		start = f.end[i-1]
	}
	return b2s(f.b[start:f.end[i]])
}

func (x *exchange) releaseFwd() {
	if x.fwd != nil {
		fwdHeadersPool.Put(x.fwd)
		x.fwd = nil
	}
}

// b2s views b as a string without copying. The entry is formatted by
// Log before the request buffers it points into change.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// fillEntry fills s.e from the request; its strings alias rc and s.buf.
func (p *Proxy) fillEntry(rc *fasthttp.RequestCtx, x *exchange, status int, total time.Duration, s *logScratch) {
	h := &rc.Request.Header
	e := &s.e
	buf := s.buf[:0]
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return ""
		}
		n := len(buf)
		buf = a.AppendTo(buf)
		return b2s(buf[n:])
	}
	e.RemoteAddr = addr(remoteIP(rc))
	if la, ok := rc.LocalAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(la.IP)
		e.ServerAddr = addr(ip.Unmap())
	}
	if f := x.fwd; f != nil {
		e.XRealIP, e.XForwardedFor, e.XForwardedProto = f.get(0), f.get(1), f.get(2)
		e.Host = f.get(fwdHost)
		e.UserAgent, e.InstanceID = f.get(fwdUserAgent), f.get(fwdInstanceID)
	} else {
		e.Host = b2s(logHost(h))
		e.UserAgent, e.InstanceID = b2s(h.UserAgent()), b2s(h.Peek(headerInstanceID))
	}
	if !x.noHead {
		e.Method = b2s(h.Method())
		if f := x.fwd; f != nil {
			e.RequestURI = f.get(fwdTarget)
		} else {
			e.RequestURI = b2s(h.RequestURI())
		}
		if path, args, ok := strings.Cut(e.RequestURI, "?"); ok {
			e.URI, e.Args = path, args
		} else {
			e.URI = e.RequestURI
		}
		if x.pathPrefix > 0 && x.fwd != nil && x.pathPrefix <= len(e.URI) {
			// nginx's $uri after the platform's path rewrite: the
			// sandbox's own path, "/" for none. (The target captured
			// at begin is the client's, with the prefix.)
			if e.URI = e.URI[x.pathPrefix:]; e.URI == "" {
				e.URI = "/"
			}
		}
		e.Protocol = b2s(h.Protocol())
	}
	e.Status = status
	e.BodyBytesSent = x.bytesOut
	e.BytesIn = x.bytesIn
	e.RequestTime = x.headTime + total
	e.ConnectionRequests = int64(rc.ConnRequestNum())
	if x.early {
		e.ConnectionRequests++
	}
	if x.upstream.IsValid() {
		n := len(buf)
		buf = x.upstream.AppendTo(buf)
		e.UpstreamAddr = b2s(buf[n:])
		e.UpstreamStatus = x.upStatus
		e.UpstreamResponseTime = x.upstreamTime(total)
		e.UpstreamRetries, e.UpstreamRetryCode = x.retries, x.retryCode
	}
	e.RequestID = b2s(rc.Response.Header.Peek(HeaderRequestID)) // set before any entry is filled
	e.BackendIP = addr(x.backendIP)
	e.SandboxID = x.sandboxID
	e.Port = int(x.port)
	e.RouteKind = x.kind.String()
	e.ErrorCode = x.errCode
	e.CacheResult = x.cache.String()
}

// upstreamFailed records, as the exchange's upstream status, status: the
// proxy's answer (502, 504) to an exchange the sandbox failed (refused,
// reset, an invalid or missing head) before any answer of its own. nginx
// logs $upstream_status so, and the platform's log pipelines count
// upstream failures by it; "-" there means that no sandbox was asked.
// Other failures (the client's, the drain's, the proxy's own limits) are
// not the sandbox's status, and an answer that came keeps its status.
func (x *exchange) upstreamFailed(status int) {
	if x.upStatus != 0 {
		return
	}
	switch x.errCode {
	case CodeUpstreamConnect, CodeUpstreamConnectTimeout, CodeUpstreamReset, CodeUpstreamTimeout, CodeUpstreamBadHeader:
		x.upStatus = status
	}
}

// upstreamTime is the time from the start of the upstream exchange to
// total (the end of the exchange).
func (x *exchange) upstreamTime(total time.Duration) time.Duration {
	return max(total-x.upBegin, 0)
}

// cloneEntry copies an entry's strings out of request buffers, for a
// tunnel that is logged after the request is gone.
func cloneEntry(e *accesslog.Entry) *accesslog.Entry {
	c := *e
	for _, f := range []*string{&c.Host, &c.RemoteAddr, &c.ServerAddr, &c.XRealIP, &c.XForwardedFor,
		&c.XForwardedProto, &c.Method, &c.RequestURI, &c.Args, &c.Protocol, &c.URI, &c.UpstreamAddr,
		&c.UserAgent, &c.RequestID, &c.InstanceID, &c.BackendIP, &c.SandboxID} {
		*f = string(append([]byte(nil), *f...))
	}
	return &c
}

func remoteIP(ctx *fasthttp.RequestCtx) netip.Addr {
	ip, _ := netip.AddrFromSlice(ctx.RemoteIP())
	return ip.Unmap()
}

func cacheResult(r routing.CacheResult) telemetry.CacheResult {
	switch r {
	case routing.CacheHit:
		return telemetry.CacheHit
	case routing.CacheMiss:
		return telemetry.CacheMiss
	case routing.CacheNegativeHit:
		return telemetry.CacheNegativeHit
	case routing.CacheStale:
		return telemetry.CacheStale
	}
	return telemetry.CacheNone
}

// InstrumentStore wraps a route store so every lookup's latency and
// failures are recorded (not-found and invalid data are answers, not
// failures).
func InstrumentStore(s routing.Store, m *telemetry.Metrics, kind telemetry.StoreKind) routing.Store {
	if m == nil {
		return s
	}
	return &instrumentedStore{Store: s, m: m, kind: kind}
}

type instrumentedStore struct {
	routing.Store
	m    *telemetry.Metrics
	kind telemetry.StoreKind
}

func (s *instrumentedStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	start := time.Now()
	r, err := s.Store.Lookup(ctx, id)
	var fe *routing.FieldError
	failed := err != nil && !errors.Is(err, routing.ErrNotFound) && !errors.As(err, &fe)
	s.m.StoreLookup(s.kind, time.Since(start), failed)
	return r, err
}

// countEnvd counts in flight, under the platform proxy's metrics, an envd
// call (its process calls and /files) whose target, without a path route's
// prefix, is target: what finish ends. The platform's proxy tells them
// from $uri, the path alone; an absolute-form target is not looked at. An
// Expect head is only classified: admitted, it runs again as the request,
// which counts; refused, handle counts it before finish ends it.
func (p *Proxy) countEnvd(x *exchange, target, method []byte) {
	path, _, _ := bytes.Cut(target, []byte{'?'})
	if r := telemetry.ClassifyEnvd(path); r != telemetry.EnvdNone {
		x.envd, x.envdMethod = r, telemetry.EnvdMethodOf(method)
		if !x.expecting {
			p.metrics.EnvdStarted(r)
		}
	}
}
