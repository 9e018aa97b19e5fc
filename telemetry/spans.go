package telemetry

import (
	"bytes"
	"context"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Span attribute keys beyond the semantic conventions.
const (
	AttrSandboxID   = attribute.Key("cube.sandbox.id")
	AttrSandboxPort = attribute.Key("cube.sandbox.port")
	AttrRouteKind   = attribute.Key("cube.route.kind")
	AttrUpstream    = attribute.Key("cube.upstream.address")
	AttrRetries     = attribute.Key("cube.upstream.retries")
	AttrCacheResult = attribute.Key("cube.cache.result")
	AttrErrorCode   = attribute.Key("cube.error.code")
	// AttrRequestID is the request's X-Cube-Request-Id (the client's, or
	// the one the proxy generated), as its answer and access log line carry it.
	AttrRequestID = attribute.Key("cube.request.id")
)

// MaxHeaderAttr is the most of a request header's value a span records
// (user_agent.original, server.address, http.request.method_original), in bytes, cut on a
// character boundary. A User-Agent can be as large as
// client.max_header_size: one client sending a 32 KiB one on every request
// made each span that much larger, and a batch of 512 such spans (the
// batch processor's) is 16 MiB, over the 4 MiB a collector's gRPC receiver
// takes by default, so the batch was refused with every other request's
// spans in it. Real user agents are a few hundred bytes; a Host longer
// than a DNS name (253) is refused (400) anyway.
const MaxHeaderAttr = 1024

// MaxPathAttr is the most of a request's path a span records (url.path),
// in bytes, cut on a character boundary, for MaxHeaderAttr's reason: a
// path may be as long as client.max_header_size. Paths past 2 KiB are
// rare (the access log keeps them whole); with the header attributes, a
// full batch of 512 spans stays near 2 MiB.
const MaxPathAttr = 2048

// MaxTraceState is the longest tracestate, in characters, a span takes
// from the client (and so injects to the sandbox): the 512 W3C Trace
// Context (3.3.1.5) asks vendors to propagate at least. A longer one is cut
// as it says: entries over 128 characters go first, then entries from the
// end. Whole, a valid tracestate of 32 entries is some 16 KiB, which went
// into both spans of the request, for MaxHeaderAttr's reason.
const MaxTraceState = 512

var (
	serverStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	clientStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	// noopSpan is what the helpers return when tracing is off: the span
	// stored in an empty context, so no allocation happens.
	noopSpan = trace.SpanFromContext(context.Background())
)

// spanMethods bounds span names: unknown methods become "OTHER" (span
// names must have low cardinality). Names are precomputed so starting a span
// does not build strings.
var spanMethods = [...]methodNames{
	{"GET", "proxy GET", "upstream GET"},
	{"POST", "proxy POST", "upstream POST"},
	{"PUT", "proxy PUT", "upstream PUT"},
	{"DELETE", "proxy DELETE", "upstream DELETE"},
	{"PATCH", "proxy PATCH", "upstream PATCH"},
	{"HEAD", "proxy HEAD", "upstream HEAD"},
	{"OPTIONS", "proxy OPTIONS", "upstream OPTIONS"},
	{"CONNECT", "proxy CONNECT", "upstream CONNECT"},
	{"TRACE", "proxy TRACE", "upstream TRACE"},
	{"_OTHER", "proxy OTHER", "upstream OTHER"}, // semconv value for unknown methods
}

// methodNames is a method and the names of its spans.
type methodNames struct{ method, server, client string }

// otherMethod is the entry of spanMethods for a method outside the known set.
var otherMethod = &spanMethods[len(spanMethods)-1]

// methodOriginal is http.request.method_original: the method as sent, which
// the semantic conventions require beside an http.request.method of
// "_OTHER" (a WebDAV PROPFIND, a lower-case "get"), its first
// MaxHeaderAttr bytes: fasthttp takes a method as long as
// client.max_header_size allows, and it goes into both spans of the
// request, for MaxHeaderAttr's reason.
func methodOriginal(h *fasthttp.RequestHeader) attribute.KeyValue {
	m := h.Method()
	var b strings.Builder
	b.Grow(min(len(m), MaxHeaderAttr))
	attrText{b: &b}.add(m, MaxHeaderAttr)
	return semconv.HTTPRequestMethodOriginalKey.String(b.String())
}

func spanMethod(m []byte) int {
	for i := range len(spanMethods) - 1 {
		if string(m) == spanMethods[i].method {
			return i
		}
	}
	return len(spanMethods) - 1
}

// StartServerSpan extracts the client's trace context from h and starts the
// per-request server span "proxy <method>", with the request's url.path,
// url.scheme (https when tls), server.address and server.port (the host
// and port the client addressed: see requestAuthority),
// user_agent.original (at most MaxHeaderAttr bytes of it) and
// client.address (the connection's peer: the proxy is the edge, so no
// forwarding header is taken for it, as the access log's remote_addr does
// not; nor for server.address, X-Forwarded-Host being the client's to
// write), and, for a method outside the known set ("proxy OTHER"),
// http.request.method_original. The returned context carries the span and
// does not derive from the fasthttp RequestCtx (which is recycled). With
// tracing off it returns context.Background() and a no-op span without
// allocating.
func (t *Telemetry) StartServerSpan(h *fasthttp.RequestHeader, tls bool, client netip.Addr) (context.Context, trace.Span) {
	if t.tp == nil {
		return context.Background(), noopSpan
	}
	return t.startServerSpan(h, tls, client, serverStart)
}

// StartServerSpanAt is StartServerSpan for a span opened only once the
// request's outcome is known (the proxy refused an "Expect: 100-continue"
// head, which, admitted, would have run again as the request with its own
// span): the span begins at start, when the proxy began to judge it, so
// that it covers the route lookup that decided it.
func (t *Telemetry) StartServerSpanAt(h *fasthttp.RequestHeader, tls bool, client netip.Addr, start time.Time) (context.Context, trace.Span) {
	if t.tp == nil {
		return context.Background(), noopSpan
	}
	return t.startServerSpan(h, tls, client, []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start)})
}

// StartHeadlessServerSpan is StartServerSpan for a request whose head the
// proxy never saw: fasthttp refused it (400, 431) or gave up waiting for
// it (408) and dropped what it had read, so its header holds fasthttp's
// defaults ("GET", "/"), not the client's request. The span claims no
// method (semconv "_OTHER", named "proxy OTHER"), no url.path and no
// parent; the access log shows these requests without method and target
// too.
func (t *Telemetry) StartHeadlessServerSpan(tls bool, client netip.Addr) (context.Context, trace.Span) {
	if t.tp == nil {
		return context.Background(), noopSpan
	}
	return t.startServerSpan(nil, tls, client, serverStart)
}

// startServerSpan starts a server span; h nil means a head the proxy
// never saw (StartHeadlessServerSpan).
func (t *Telemetry) startServerSpan(h *fasthttp.RequestHeader, tls bool, client netip.Addr, opts []trace.SpanStartOption) (context.Context, trace.Span) {
	ctx := context.Background()
	m := otherMethod
	if h != nil {
		ctx = boundTraceState(t.propagator.Extract(ctx, HeaderCarrier{H: h}))
		m = &spanMethods[spanMethod(h.Method())]
	}
	ctx, span := t.Tracer.Start(ctx, m.server, opts...)
	if span.IsRecording() {
		span.SetAttributes(serverAttrs(h, m, tls, client)...)
	}
	return ctx, span
}

// boundTraceState returns ctx with the tracestate of its remote span
// context cut to MaxTraceState characters as W3C Trace Context says
// (entries over 128 characters first, then entries from the end), or ctx
// itself when it is within that.
func boundTraceState(ctx context.Context) context.Context {
	sc := trace.SpanContextFromContext(ctx)
	ts := sc.TraceState()
	n := -1 // the commas between entries
	ts.Walk(func(k, v string) bool {
		n += len(k) + len("=") + len(v) + len(",")
		return true
	})
	if n <= MaxTraceState {
		return ctx
	}
	type entry struct{ k, v string }
	entries := make([]entry, 0, ts.Len())
	ts.Walk(func(k, v string) bool {
		if e := (entry{k, v}); len(k)+len("=")+len(v) <= 128 {
			entries = append(entries, e)
		} else {
			n -= len(k) + len("=") + len(v) + len(",")
		}
		return true
	})
	for n > MaxTraceState {
		last := entries[len(entries)-1]
		n -= len(last.k) + len("=") + len(last.v) + len(",")
		entries = entries[:len(entries)-1]
	}
	var cut trace.TraceState
	for _, e := range slices.Backward(entries) {
		// Insert puts an entry first; taken from the end, they keep their
		// order. Entries of a parsed tracestate insert without error.
		cut, _ = cut.Insert(e.k, e.v)
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(cut))
}

// serverAttrs returns the attributes a server span starts with. Their
// strings share one allocation (attrText): each string(b) was one.
func serverAttrs(h *fasthttp.RequestHeader, m *methodNames, tls bool, client netip.Addr) []attribute.KeyValue {
	scheme, defaultPort := "http", 80
	if tls {
		scheme, defaultPort = "https", 443
	}
	var path, host, ua []byte
	port := 0
	if h != nil {
		path = targetPath(h.RequestURI())
		if authority := requestAuthority(h); len(authority) > 0 {
			host, port = splitAuthority(authority)
			if port == 0 {
				port = defaultPort // RFC 9110 4.2: none, or empty, is the scheme's
			}
		}
		ua = h.UserAgent()
	}
	var addr [len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255")]byte
	var clientAddr []byte
	if client.IsValid() {
		clientAddr = client.AppendTo(addr[:0])
	}
	at := userinfoEnd(path)
	grow := min(len(path), MaxPathAttr) + min(len(host), MaxHeaderAttr) + min(len(ua), MaxHeaderAttr) + len(clientAddr)
	if at > 0 {
		grow += len(redactedUserinfo)
	}
	var b strings.Builder
	b.Grow(grow)
	text := attrText{b: &b}
	var pathEnd int
	if at > 0 {
		b.WriteString(redactedUserinfo)
		pathEnd = text.add(path[at:], MaxPathAttr-len(redactedUserinfo))
	} else {
		pathEnd = text.add(path, MaxPathAttr)
	}
	hostEnd := text.add(host, MaxHeaderAttr)
	uaEnd := text.add(ua, MaxHeaderAttr)
	clientEnd := text.add(clientAddr, math.MaxInt)
	all := b.String()

	// One SetAttributes call: each costs an allocation.
	attrs := make([]attribute.KeyValue, 2, 9)
	attrs[0], attrs[1] = semconv.HTTPRequestMethodKey.String(m.method), semconv.URLSchemeKey.String(scheme)
	if h != nil {
		attrs = append(attrs, semconv.URLPathKey.String(all[:pathEnd]))
		if m == otherMethod {
			attrs = append(attrs, methodOriginal(h))
		}
		if hostEnd > pathEnd {
			attrs = append(attrs, semconv.ServerAddressKey.String(all[pathEnd:hostEnd]))
			if port > 0 {
				attrs = append(attrs, semconv.ServerPortKey.Int(port))
			}
		}
		if uaEnd > hostEnd {
			attrs = append(attrs, semconv.UserAgentOriginalKey.String(all[hostEnd:uaEnd]))
		}
	}
	if clientEnd > uaEnd {
		attrs = append(attrs, semconv.ClientAddressKey.String(all[uaEnd:clientEnd]))
	}
	return attrs
}

// attrText builds the text of a span's attributes in one string.
type attrText struct {
	b *strings.Builder
}

// add appends p, each run of bytes that is not UTF-8 replaced by one
// U+FFFD, and cut at the last character that keeps it within limit bytes;
// it returns the end of the text so far. The text is the client's bytes
// (fasthttp takes any byte above 0x7F in a target or a method), and OTLP
// carries attributes as protobuf strings, which must be UTF-8: one span
// that was not made the exporter refuse its whole batch, every other
// request's spans in it lost too.
func (t attrText) add(p []byte, limit int) int {
	if len(p) <= limit && utf8.Valid(p) {
		t.b.Write(p)
		return t.b.Len()
	}
	n := 0
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		bad := r == utf8.RuneError && size == 1
		add := size
		if bad {
			// A run of invalid bytes is one U+FFFD, as strings.ToValidUTF8
			// makes it.
			for size < len(p) {
				if r, s := utf8.DecodeRune(p[size:]); r != utf8.RuneError || s != 1 {
					break
				}
				size++
			}
			add = len(string(utf8.RuneError))
		}
		if n+add > limit {
			break
		}
		if bad {
			t.b.WriteRune(utf8.RuneError)
		} else {
			t.b.Write(p[:size])
		}
		n += add
		p = p[size:]
	}
	return t.b.Len()
}

// requestAuthority returns the host (and port) the client addressed, as
// the HTTP semantic conventions take it for server.address and
// server.port: an absolute-form target's ("GET http://host:port/p", which
// RFC 9112 3.2.2 puts before Host; routing refuses one that names another
// sandbox than Host), read as routing reads it, else the Host header's.
// Empty when neither names one.
func requestAuthority(h *fasthttp.RequestHeader) []byte {
	if authority, _ := routing.TargetAuthority(h.RequestURI()); len(authority) > 0 {
		return authority
	}
	return h.Host()
}

// splitAuthority splits an authority ("host", "host:port", "[v6]:port", an
// IPv6 address without brackets) into host and port: 0 for none or an
// empty one, -1 for one that is not a port number (no server.port then).
func splitAuthority(a []byte) (host []byte, port int) {
	if a[0] == '[' {
		end := bytes.IndexByte(a, ']')
		if end < 0 {
			return a, 0
		}
		host, rest := a[1:end], a[end+1:]
		if len(rest) > 0 && rest[0] == ':' {
			return host, parsePort(rest[1:])
		}
		return host, 0
	}
	i := bytes.IndexByte(a, ':')
	if i < 0 || bytes.IndexByte(a[i+1:], ':') >= 0 {
		return a, 0 // no port, or an IPv6 address
	}
	return a[:i], parsePort(a[i+1:])
}

// parsePort parses a port as an authority carries it: 0 when empty, -1
// when not a number from 1 to 65535.
func parsePort(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	if len(b) > 5 {
		return -1
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return -1
	}
	return n
}

// targetPath returns the path of a request target as the client sent it:
// without the query (which may carry a signed token), and without the
// scheme and authority of an absolute-form target.
func targetPath(uri []byte) []byte {
	if i := bytes.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if len(uri) == 0 || uri[0] == '/' {
		return uri
	}
	i := bytes.Index(uri, []byte("://"))
	if i < 0 {
		return uri // "*" (OPTIONS) or something no route accepts
	}
	rest := uri[i+3:]
	if j := bytes.IndexByte(rest, '/'); j >= 0 {
		return rest[j:]
	}
	return []byte("/")
}

// redactedUserinfo stands for the userinfo of a path's authority in
// url.path, as the access log writes it.
const redactedUserinfo = "//REDACTED"

// userinfoEnd returns the index of the '@' that ends the userinfo of path,
// a target's path, when it begins with an authority that has one
// ("//user:pw@host/p", up to the authority's last '@'), else 0. Such an
// origin-form target goes to the sandbox as sent, but fasthttp reads it as
// a network-path reference whose userinfo is a password, and the access
// log redacts it: so does url.path.
func userinfoEnd(path []byte) int {
	if len(path) < 2 || path[0] != '/' || path[1] != '/' {
		return 0
	}
	auth := path[2:]
	if i := bytes.IndexByte(auth, '/'); i >= 0 {
		auth = auth[:i]
	}
	if at := bytes.LastIndexByte(auth, '@'); at > 0 {
		return 2 + at
	}
	return 0
}

// StartClientSpan starts the span for the upstream exchange with addr as a
// child of ctx's span and injects its traceparent/tracestate into
// upstream, replacing what the client sent; the client's baggage passes
// as sent. With
// tracing off it returns a no-op span, leaves upstream untouched (the
// client's headers pass through as any end-to-end header) and does not
// allocate.
func (t *Telemetry) StartClientSpan(ctx context.Context, upstream *fasthttp.RequestHeader, addr netip.AddrPort) trace.Span {
	if t.tp == nil {
		return noopSpan
	}
	return t.startClientSpan(ctx, upstream, addr, 0, clientStart)
}

// ResendClientSpan ends prev, the client span of an upstream attempt that
// failed at `at` with err (errType its error.type, as EndClientSpan takes
// it) before any answer, and starts, from at, the span of the attempt
// that makes the exchange again, a child of ctx's span as prev was: the
// HTTP semantic conventions give each attempt its own span, the ones
// after the first numbered by http.request.resend_count (resend, from 1).
// The new span's traceparent replaces prev's in upstream, so that the
// sandbox's spans are children of the attempt that reached it. With
// tracing off it does nothing and returns a no-op span.
func (t *Telemetry) ResendClientSpan(ctx context.Context, prev trace.Span, upstream *fasthttp.RequestHeader, addr netip.AddrPort,
	resend int, at time.Time, errType string, err error) trace.Span {
	if t.tp == nil {
		return noopSpan
	}
	endClientSpan(prev, 0, errType, err, at)
	return t.startClientSpan(ctx, upstream, addr, resend,
		[]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(at)})
}

// startClientSpan starts a client span; resend is its
// http.request.resend_count, 0 (none) for the first attempt.
func (t *Telemetry) startClientSpan(ctx context.Context, upstream *fasthttp.RequestHeader, addr netip.AddrPort, resend int, opts []trace.SpanStartOption) trace.Span {
	m := &spanMethods[spanMethod(upstream.Method())]
	ctx, span := t.Tracer.Start(ctx, m.client, opts...)
	if span.IsRecording() {
		// The semantic conventions' server.address is the host alone.
		attrs := [5]attribute.KeyValue{semconv.HTTPRequestMethodKey.String(m.method),
			semconv.ServerAddressKey.String(addr.Addr().String()), semconv.ServerPortKey.Int(int(addr.Port()))}
		n := 3
		if m == otherMethod {
			attrs[n] = methodOriginal(upstream)
			n++
		}
		if resend > 0 {
			attrs[n] = semconv.HTTPRequestResendCountKey.Int(resend)
			n++
		}
		span.SetAttributes(attrs[:n]...)
	}
	// Every copy goes: a second traceparent from the client would reach
	// the sandbox next to the proxy's, and a tracestate the span did not
	// inherit (its traceparent was invalid) would describe another trace.
	// Baggage is not touched (see New). Inject's Set replaces the first
	// line and drops the others where they are; only a field it leaves
	// unset is deleted, which moves the head's last line into its place
	// (fasthttp's delete): deleting both first reordered a field sent on
	// several lines (Accept) whenever a client sent a traceparent.
	t.propagator.Inject(ctx, HeaderCarrier{H: upstream})
	sc := span.SpanContext()
	if !sc.IsValid() {
		upstream.Del("traceparent")
	}
	if sc.TraceState().Len() == 0 {
		upstream.Del("tracestate")
	}
	return span
}

// SpanResult is what the proxy knows about a request when its server span
// ends (for streams: when the stream ends).
type SpanResult struct {
	SandboxID string      // "" when no route was parsed
	Port      int         // container port
	Kind      RouteKind   // how the route was reached
	Status    int         // status sent to the client
	Upstream  string      // "ip:port" dialed, "" when none
	BytesIn   int64       // request body bytes received
	BytesOut  int64       // response body bytes sent
	Retries   int         // upstream attempts made again
	Cache     CacheResult // route cache hit, miss or stale
	ErrorCode string      // proxy error code ("sandbox_not_found", ...), "" on success
	RequestID string      // X-Cube-Request-Id of the answer, "" when none went out
}

// ErrorCodeClientClosed is the proxy's error code for an exchange its
// client ended (nginx's 499): before the answer's head, or while its body
// streamed. It is the client's choice, not a failure of the proxy or the
// sandbox, so it marks no span as an error.
const ErrorCodeClientClosed = "client_closed_request"

// ErrorCodeClientWriteTimeout is the proxy's error code for a streamed
// answer its client stopped reading: the client's side too, no error.
const ErrorCodeClientWriteTimeout = "client_write_timeout"

// ClientEnded reports whether code says the client ended the exchange
// (hung up, or stopped reading): no failure of the proxy or the sandbox,
// so neither span is an error.
func ClientEnded(code string) bool {
	return code == ErrorCodeClientClosed || code == ErrorCodeClientWriteTimeout
}

// EndServerSpan sets r's attributes on a recording span and ends it. On a
// non-recording span it only calls End, so it allocates nothing.
func EndServerSpan(span trace.Span, r *SpanResult) {
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 12)
		attrs = append(attrs,
			AttrRouteKind.String(r.Kind.String()),
			semconv.HTTPResponseStatusCodeKey.Int(r.Status),
			semconv.HTTPRequestBodySizeKey.Int64(r.BytesIn),
			semconv.HTTPResponseBodySizeKey.Int64(r.BytesOut),
			AttrRetries.Int(r.Retries),
		)
		if r.SandboxID != "" {
			attrs = append(attrs, AttrSandboxID.String(r.SandboxID), AttrSandboxPort.Int(r.Port))
		}
		if r.Upstream != "" {
			attrs = append(attrs, AttrUpstream.String(r.Upstream))
		}
		if r.Cache != CacheNone {
			attrs = append(attrs, AttrCacheResult.String(r.Cache.String()))
		}
		if r.ErrorCode != "" {
			attrs = append(attrs, AttrErrorCode.String(r.ErrorCode))
		}
		if r.RequestID != "" {
			attrs = append(attrs, AttrRequestID.String(r.RequestID))
		}
		// Server spans mark 5xx as errors, and a response that failed after
		// its head went out (semantic conventions): the sandbox reset a
		// stream, the proxy cut it. An error code on a forwarded response
		// says that; on the proxy's own answer its status says it all. A
		// client that hung up mid-body, or stopped reading, failed nothing.
		if r.Status >= 500 || (r.ErrorCode != "" && !ClientEnded(r.ErrorCode) && r.Kind != RouteError) {
			errType := r.ErrorCode
			if errType == "" {
				errType = strconv.Itoa(r.Status) // the sandbox's own 5xx
			}
			attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
			span.SetStatus(codes.Error, r.ErrorCode)
		}
		span.SetAttributes(attrs...)
	}
	span.End()
}

// EndClientSpan records the upstream status (0 when none arrived) and err,
// then ends the span. errType names err for error.type, which the semantic
// conventions require on a failed request: the proxy's error code
// ("upstream_timeout"), as the server span's cube.error.code and the access
// log carry it ("_OTHER" when empty). A 4xx or 5xx the sandbox answered
// without err is an error typed by its status. Allocation-free on a
// non-recording span.
func EndClientSpan(span trace.Span, status int, errType string, err error) {
	endClientSpan(span, status, errType, err, time.Time{})
}

// endClientSpan is EndClientSpan ending the span, and recording err, at
// at (zero: now): a failed attempt's span ends when it failed.
func endClientSpan(span trace.Span, status int, errType string, err error, at time.Time) {
	if span.IsRecording() {
		attrs := [2]attribute.KeyValue{}
		n := 0
		if status > 0 {
			attrs[n] = semconv.HTTPResponseStatusCodeKey.Int(status)
			n++
		}
		switch {
		case err != nil:
			attrs[n] = semconv.ErrorTypeOther
			if errType != "" {
				attrs[n] = semconv.ErrorTypeKey.String(errType)
			}
			n++
			if at.IsZero() {
				span.RecordError(err)
			} else {
				span.RecordError(err, trace.WithTimestamp(at))
			}
			span.SetStatus(codes.Error, err.Error())
		case status >= 400: // client spans treat 4xx as errors too
			attrs[n] = semconv.ErrorTypeKey.String(strconv.Itoa(status))
			n++
			span.SetStatus(codes.Error, "")
		}
		span.SetAttributes(attrs[:n]...)
	}
	if at.IsZero() {
		span.End()
		return
	}
	span.End(trace.WithTimestamp(at))
}
