package telemetry

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Histogram bucket boundaries, in seconds.
var (
	// requestBuckets cover time to response headers and whole short
	// responses, up to past the default upstream.response_header_timeout
	// (120 s, its 504 a little later) and a five-minute tool call:
	// histogram_quantile reports a quantile in +Inf as the last finite
	// bound, so with 60 s last every header timeout read as 60 s.
	requestBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 150, 300}
	// streamBuckets cover SSE/chunked/WebSocket lifetimes. The low end is
	// an MCP tool call answered as a short SSE stream, whose latency only
	// this histogram records; the high end is past the default 7206 s
	// upstream.idle_timeout (an idle stream's end) up to a day, since a
	// busy stream has no limit at all.
	streamBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400}
	// storeBuckets cover a memory lookup (µs) up to a slow Redis (s).
	storeBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 3}
)

// Metrics records CubeProxy's metrics. Every method is safe for concurrent
// use, allocation-free, and a no-op on a nil *Metrics.
//
// Counters and gauges are plain atomics, read by one OTel callback at
// scrape time: a synchronous OTel counter costs ~180 ns per Add (attribute
// normalisation), an atomic a few ns. Histograms are Prometheus histograms,
// one per label combination (histograms), for the same reason.
type Metrics struct {
	requests      [numStatusClasses][numRouteKinds]atomic.Int64
	bytesIn       [numRouteKinds]atomic.Int64
	bytesOut      [numRouteKinds]atomic.Int64
	conns         atomic.Int64
	streams       [numRouteKinds]atomic.Int64 // RouteHTTP (chunked) and RouteSSE
	websockets    atomic.Int64
	streamEnds    [numRouteKinds][numStreamEnds]atomic.Int64 // RouteHTTP, RouteSSE, RouteWebSocket
	cache         [numCacheResults]atomic.Int64
	storeErrors   [numStoreKinds]atomic.Int64
	connectErrors atomic.Int64
	resourceErrs  atomic.Int64
	retries       atomic.Int64
	acceptErrors  atomic.Int64
	connsRefused  atomic.Int64
	reclaimed     atomic.Int64 // client connections closed at client.max_conns for new ones
	auth          [len(authReasons)]atomic.Int64
	logDrops      atomic.Int64
	logReopenErrs atomic.Int64
	logCloseErrs  atomic.Int64
	logTruncs     atomic.Int64
	procLogDrops  atomic.Pointer[func() uint64]
	spanDrops     atomic.Int64
	poolStats     atomic.Pointer[func() (pools, idle int64)]
	heldBodies    atomic.Pointer[func() int64]
	invalidation  atomic.Pointer[func() InvalidationStats]
	certExpiry    atomic.Pointer[func() time.Time]
	// limitWaits counts the waits for a slot at max_streams_per_sandbox,
	// by outcome (WaitOutcome).
	limitWaits [numWaitOutcomes]atomic.Int64
	// resumes counts the calls to the lifecycle manager's resume, by
	// outcome (ResumeOutcome).
	resumes [numResumeOutcomes]atomic.Int64

	reqDuration    [numStatusClasses][numRouteKinds]prometheus.Histogram
	respDuration   [numStatusClasses][numRouteKinds]prometheus.Histogram
	streamDuration [numRouteKinds]prometheus.Histogram // streamKinds only
	storeDuration  [numStoreKinds]prometheus.Histogram

	envd envdMetrics // the platform proxy's own families (envd.go)

	obs observed
}

// observed holds the asynchronous instruments and the attribute options the
// scrape callback reports them with.
type observed struct {
	requests, bytesIn, bytesOut, cache, storeErrors  metric.Int64ObservableCounter
	connectErrors, resourceErrs, retries, auth       metric.Int64ObservableCounter
	logDrops, logReopenErrs, procLogDrops, spanDrops metric.Int64ObservableCounter
	acceptErrors, connsRefused, streamEnds, reclaims metric.Int64ObservableCounter
	limitWaits, invSubscriptions, invMessages        metric.Int64ObservableCounter
	logCloseErrs, logTruncs, resumes                 metric.Int64ObservableCounter
	invSubscribed                                    metric.Int64ObservableUpDownCounter
	conns, streams, websockets, pools, idle          metric.Int64ObservableUpDownCounter
	heldBodies, certExpiry                           metric.Int64ObservableUpDownCounter
	classKind                                        [numStatusClasses][numRouteKinds]metric.ObserveOption
	kind                                             [numRouteKinds]metric.ObserveOption
	result                                           [numCacheResults]metric.ObserveOption
	store                                            [numStoreKinds]metric.ObserveOption
	reason                                           [len(authReasons)]metric.ObserveOption
	kindEnd                                          [numRouteKinds][numStreamEnds]metric.ObserveOption
	waitOutcome                                      [numWaitOutcomes]metric.ObserveOption
	resumeOutcome                                    [numResumeOutcomes]metric.ObserveOption
}

// newMetrics makes the counters and gauges on meter and registers the
// histograms with reg.
func newMetrics(meter metric.Meter, reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{}
	b := builder{meter: meter}
	if err := reg.Register(m.histograms()); err != nil {
		return nil, fmt.Errorf("register histograms: %w", err)
	}

	o := &m.obs
	o.requests = b.counter("cubeproxy.requests", "{request}", "Requests answered, by status class and route kind.")
	o.bytesIn = b.counter("cubeproxy.received", "By", "Bytes received from clients (request bodies and WebSocket frames).")
	o.bytesOut = b.counter("cubeproxy.sent", "By", "Bytes sent to clients (response bodies and WebSocket frames).")
	o.cache = b.counter("cubeproxy.route_cache.lookups", "{lookup}", "Route cache lookups by result.")
	o.storeErrors = b.counter("cubeproxy.store.errors", "{error}", "Failed route store lookups.")
	o.connectErrors = b.counter("cubeproxy.upstream.connect_errors", "{error}", "Sandbox connects that failed on their one retry too: one per request answered upstream_connect_failed or upstream_connect_timeout. A connect that succeeded on its retry counts in retries only.")
	o.resourceErrs = b.counter("cubeproxy.upstream.resource_errors", "{error}", "Sandbox connections the proxy could not open for want of its own descriptors or local ports (503 proxy_out_of_resources); not in connect_errors.")
	o.retries = b.counter("cubeproxy.upstream.retries", "{retry}", "Upstream retries: a connect retried after it failed, or an idempotent request re-sent after its keep-alive connection turned out closed.")
	o.acceptErrors = b.counter("cubeproxy.accept.errors", "{error}", "Failed accepts of client connections (out of descriptors or memory); the listener retries.")
	o.connsRefused = b.counter("cubeproxy.connections.refused", "{connection}", "Client connections refused with 503 proxy_overloaded because client.max_conns were open.")
	o.reclaims = b.counter("cubeproxy.connections.reclaimed", "{connection}", "Client connections waiting for a request (idle keep-alive, or no request yet) closed to admit new ones at client.max_conns.")
	o.auth = b.counter("cubeproxy.auth.rejections", "{request}", "Requests refused by auth, by reason.")
	o.logDrops = b.counter("cubeproxy.accesslog.dropped", "{line}", "Access log lines dropped because the sink stalled or failed.")
	o.logReopenErrs = b.counter("cubeproxy.accesslog.reopen_errors", "{error}", "Access log reopens (SIGHUP) that failed: the lines still go to the file open before.")
	o.logCloseErrs = b.counter("cubeproxy.accesslog.close_errors", "{error}", "Access log file closes that failed, of the file a reopen replaced or at exit: the file system (NFS, CIFS, FUSE) reported a failed write-back, so lines written to that file may be lost.")
	o.logTruncs = b.counter("cubeproxy.accesslog.truncations", "{truncation}", "Truncations of the access log file under the proxy (logrotate's copytruncate), each of which may have lost the lines written between the copy and the truncate: their number cannot be known. Rotate with create and a postrotate SIGHUP or SIGUSR1 instead.")
	o.procLogDrops = b.counter("cubeproxy.process_log.dropped", "{line}", "Process log lines dropped because its output (stdout) stalled or failed.")
	o.spanDrops = b.counter("cubeproxy.spans.dropped", "{span}", "Sampled spans dropped unexported: the export queue (OTEL_BSP_MAX_QUEUE_SIZE) was full, the trace collector taking them slower than they came, or their export failed.")
	o.streamEnds = b.counter("cubeproxy.streams.ended", "{stream}", "Streamed responses and WebSocket tunnels ended, by route kind and reason (complete, client, sandbox, timeout, drain, killed, error, route_changed).")
	o.limitWaits = b.counter("cubeproxy.stream_limit.waits", "{wait}", "Requests over max_streams_per_sandbox that waited up to stream_limit_wait for a slot to free, by outcome: slot (one came free and the request was judged again; one that then lost it to another waits on and counts again), refused (none did, or the drain began: the 429; or the client closed its connection: the 499) or state (the sandbox was paused, killed or forgotten meanwhile).")
	o.resumes = b.counter("cubeproxy.sandbox.resumes", "{call}", "Calls to the lifecycle manager to resume a paused sandbox (lifecycle.sidecar_addr), by outcome: resumed (it answered 200; the requests waiting are served) or failed (another status, no answer in time, or no connection: they get 503 resume_failed). Requests that arrive during a call wait for it and make none.")
	o.invSubscribed = b.gauge("cubeproxy.route_invalidation.subscribed", "{subscription}", "1 while the Redis invalidation subscription stands, 0 while it is down or refused: invalidations published by other instances are then not applied here, and changed routes are served from the cache for up to their TTL.")
	o.invSubscriptions = b.counter("cubeproxy.route_invalidation.subscriptions", "{subscription}", "Redis invalidation subscriptions confirmed: 1 at start, one more per resubscription, each of which expires every cached route (messages published meanwhile were lost).")
	o.invMessages = b.counter("cubeproxy.route_invalidation.messages", "{message}", "Sandbox ids received on the Redis invalidation channel and dropped from the cache.")
	o.conns = b.gauge("cubeproxy.connections.open", "{connection}", "Open client connections.")
	o.streams = b.gauge("cubeproxy.streams.open", "{stream}", "Open streamed responses (SSE, chunked, and downloads relayed as they come), by route kind.")
	o.websockets = b.gauge("cubeproxy.websockets.open", "{websocket}", "Open WebSocket tunnels.")
	o.pools = b.gauge("cubeproxy.upstream.pools", "{pool}", "Upstream connection pools (one per sandbox incarnation and port).")
	o.idle = b.gauge("cubeproxy.upstream.idle_connections", "{connection}", "Idle upstream connections across all pools.")
	m.envd.instruments(&b, func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(kvs...))
	})
	o.heldBodies = b.gauge("cubeproxy.held_body", "By", "Bytes taken of the held-body budget (held_body_budget): request bodies over 8 KiB read whole into memory at max_streams_per_sandbox to be judged, counted at their declared size from before their read until they are sent or refused.")
	o.certExpiry = b.gauge("cubeproxy.tls.certificate.expiry_timestamp", "s", "When the certificate that expires first among those the configuration names (tls.source files: every pair as served now; acme: the managed wildcard and apex, once obtained; not on-demand ones) expires, in seconds since the epoch. Alert when it comes within two weeks: a renewal stopped working.")
	if b.err != nil {
		return nil, b.err
	}
	m.prebuild()
	_, err := meter.RegisterCallback(m.observe,
		o.requests, o.bytesIn, o.bytesOut, o.cache, o.storeErrors, o.connectErrors, o.resourceErrs, o.retries, o.auth,
		o.acceptErrors, o.connsRefused, o.reclaims, o.logDrops, o.logReopenErrs, o.logCloseErrs, o.logTruncs, o.procLogDrops, o.spanDrops, o.streamEnds, o.limitWaits, o.resumes, o.conns, o.streams, o.websockets, o.pools, o.idle, o.heldBodies,
		o.invSubscribed, o.invSubscriptions, o.invMessages, o.certExpiry, m.envd.requestsObs, m.envd.inflightObs)
	if err != nil {
		return nil, fmt.Errorf("register metrics callback: %w", err)
	}
	return m, nil
}

// The histograms' names and help texts.
const (
	requestDurationMetric     = "cubeproxy_request_duration_seconds"
	requestDurationMetricHelp = "Time from request start to response headers."
	responseDurationMetric    = "cubeproxy_response_duration_seconds"
	// responseDurationMetricHelp names streamDurationMetric.
	responseDurationMetricHelp = "Time from request start to the last byte of a response of known length, read whole or (a download over 64 KiB) relayed as it came; chunked and SSE streams and WebSockets are in cubeproxy_stream_duration_seconds."
	streamDurationMetric       = "cubeproxy_stream_duration_seconds"
	streamDurationMetricHelp   = "Lifetime of SSE/chunked streams and WebSockets."
	storeDurationMetric        = "cubeproxy_store_duration_seconds"
	storeDurationMetricHelp    = "Latency of route store lookups (cache misses)."
)

// histograms makes one histogram per label combination.
func (m *Metrics) histograms() *histograms {
	h := &histograms{}
	for c := range numStatusClasses {
		for k := range int(numRouteKinds) {
			l := prometheus.Labels{"status_class": statusClassNames[c], "route_kind": routeKindNames[k]}
			m.reqDuration[c][k] = h.add(requestDurationMetric, requestDurationMetricHelp, requestBuckets, l)
			m.respDuration[c][k] = h.add(responseDurationMetric, responseDurationMetricHelp, requestBuckets, l)
		}
	}
	for _, k := range streamKinds {
		m.streamDuration[k] = h.add(streamDurationMetric, streamDurationMetricHelp, streamBuckets, prometheus.Labels{"route_kind": routeKindNames[k]})
	}
	for s := range int(numStoreKinds) {
		m.storeDuration[s] = h.add(storeDurationMetric, storeDurationMetricHelp, storeBuckets, prometheus.Labels{"store": storeKindNames[s]})
	}
	m.envd.histograms(h)
	return h
}

// prebuild makes one attribute set per label combination.
func (m *Metrics) prebuild() {
	set := func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(kvs...))
	}
	for c := range numStatusClasses {
		for k := range int(numRouteKinds) {
			m.obs.classKind[c][k] = set(attribute.String("status_class", statusClassNames[c]), attribute.String("route_kind", routeKindNames[k]))
		}
	}
	for k := range int(numRouteKinds) {
		m.obs.kind[k] = set(attribute.String("route_kind", routeKindNames[k]))
	}
	for _, k := range streamKinds {
		for e := range int(numStreamEnds) {
			m.obs.kindEnd[k][e] = set(attribute.String("route_kind", routeKindNames[k]), attribute.String("reason", streamEndNames[e]))
		}
	}
	for r := 1; r < int(numCacheResults); r++ {
		m.obs.result[r] = set(attribute.String("result", cacheResultNames[r]))
	}
	for s := range int(numStoreKinds) {
		m.obs.store[s] = set(attribute.String("store", storeKindNames[s]))
	}
	for i, reason := range authReasons {
		m.obs.reason[i] = set(attribute.String("reason", reason))
	}
	for i, outcome := range waitOutcomes {
		m.obs.waitOutcome[i] = set(attribute.String("outcome", outcome))
	}
	for i, outcome := range resumeOutcomes {
		m.obs.resumeOutcome[i] = set(attribute.String("outcome", outcome))
	}
}

// waitOutcomes are the outcome label values of
// cubeproxy_stream_limit_waits_total, indexed by WaitOutcome.
var waitOutcomes = [numWaitOutcomes]string{"slot", "refused", "state"}

// resumeOutcomes are the outcome label values of
// cubeproxy_sandbox_resumes_total, indexed by ResumeOutcome.
var resumeOutcomes = [numResumeOutcomes]string{"resumed", "failed"}

// observe reports every counter and gauge at scrape time. All label
// combinations are reported, zeros included, so rate() works from the first
// scrape and a series never appears out of nowhere.
func (m *Metrics) observe(_ context.Context, ob metric.Observer) error {
	m.envd.observe(ob)
	o := &m.obs
	for c := range numStatusClasses {
		for k := range int(numRouteKinds) {
			ob.ObserveInt64(o.requests, m.requests[c][k].Load(), o.classKind[c][k])
		}
	}
	for k := range int(numRouteKinds) {
		ob.ObserveInt64(o.bytesIn, m.bytesIn[k].Load(), o.kind[k])
		ob.ObserveInt64(o.bytesOut, m.bytesOut[k].Load(), o.kind[k])
	}
	ob.ObserveInt64(o.streams, m.streams[RouteHTTP].Load(), o.kind[RouteHTTP])
	ob.ObserveInt64(o.streams, m.streams[RouteSSE].Load(), o.kind[RouteSSE])
	for _, k := range streamKinds {
		for e := range int(numStreamEnds) {
			ob.ObserveInt64(o.streamEnds, m.streamEnds[k][e].Load(), o.kindEnd[k][e])
		}
	}
	for r := 1; r < int(numCacheResults); r++ {
		ob.ObserveInt64(o.cache, m.cache[r].Load(), o.result[r])
	}
	for s := range int(numStoreKinds) {
		ob.ObserveInt64(o.storeErrors, m.storeErrors[s].Load(), o.store[s])
	}
	for i := range authReasons {
		ob.ObserveInt64(o.auth, m.auth[i].Load(), o.reason[i])
	}
	for i := range waitOutcomes {
		ob.ObserveInt64(o.limitWaits, m.limitWaits[i].Load(), o.waitOutcome[i])
	}
	for i := range resumeOutcomes {
		ob.ObserveInt64(o.resumes, m.resumes[i].Load(), o.resumeOutcome[i])
	}
	ob.ObserveInt64(o.connectErrors, m.connectErrors.Load())
	ob.ObserveInt64(o.resourceErrs, m.resourceErrs.Load())
	ob.ObserveInt64(o.retries, m.retries.Load())
	ob.ObserveInt64(o.acceptErrors, m.acceptErrors.Load())
	ob.ObserveInt64(o.connsRefused, m.connsRefused.Load())
	ob.ObserveInt64(o.reclaims, m.reclaimed.Load())
	ob.ObserveInt64(o.logDrops, m.logDrops.Load())
	ob.ObserveInt64(o.logReopenErrs, m.logReopenErrs.Load())
	ob.ObserveInt64(o.logCloseErrs, m.logCloseErrs.Load())
	ob.ObserveInt64(o.logTruncs, m.logTruncs.Load())
	var procLogDrops uint64
	if fn := m.procLogDrops.Load(); fn != nil {
		procLogDrops = (*fn)()
	}
	ob.ObserveInt64(o.procLogDrops, int64(procLogDrops))
	ob.ObserveInt64(o.spanDrops, m.spanDrops.Load())
	ob.ObserveInt64(o.conns, m.conns.Load())
	ob.ObserveInt64(o.websockets, m.websockets.Load())
	var held int64
	if fn := m.heldBodies.Load(); fn != nil {
		held = (*fn)()
	}
	ob.ObserveInt64(o.heldBodies, held)
	if fn := m.poolStats.Load(); fn != nil {
		pools, idle := (*fn)()
		ob.ObserveInt64(o.pools, pools)
		ob.ObserveInt64(o.idle, idle)
	}
	if fn := m.invalidation.Load(); fn != nil {
		st := (*fn)()
		up := int64(0)
		if st.Subscribed {
			up = 1
		}
		ob.ObserveInt64(o.invSubscribed, up)
		ob.ObserveInt64(o.invSubscriptions, st.Subscriptions)
		ob.ObserveInt64(o.invMessages, st.Messages)
	}
	if fn := m.certExpiry.Load(); fn != nil {
		if at := (*fn)(); !at.IsZero() {
			ob.ObserveInt64(o.certExpiry, at.Unix())
		}
	}
	return nil
}

// RequestDone counts a request once its response headers are sent and
// records ttfb (request start to headers). Call it for every request,
// streamed or not, including ones the proxy answered itself.
func (m *Metrics) RequestDone(status int, kind RouteKind, ttfb time.Duration) {
	if m == nil {
		return
	}
	c, k := statusClassIndex(status), kind.index()
	m.requests[c][k].Add(1)
	m.reqDuration[c][k].Observe(ttfb.Seconds())
}

// ResponseDone records the total duration of a non-streamed response (to its
// last byte). Streams record StreamClosed instead.
func (m *Metrics) ResponseDone(status int, kind RouteKind, total time.Duration) {
	if m == nil {
		return
	}
	m.respDuration[statusClassIndex(status)][kind.index()].Observe(total.Seconds())
}

// Bytes adds body (or WebSocket) bytes received from and sent to the client.
func (m *Metrics) Bytes(kind RouteKind, in, out int64) {
	if m == nil {
		return
	}
	k := kind.index()
	if in > 0 {
		m.bytesIn[k].Add(in)
	}
	if out > 0 {
		m.bytesOut[k].Add(out)
	}
}

// ConnOpened counts a new client connection (fasthttp ConnState StateNew).
func (m *Metrics) ConnOpened() {
	if m == nil {
		return
	}
	m.conns.Add(1)
}

// ConnClosed counts a closed or hijacked client connection.
func (m *Metrics) ConnClosed() {
	if m == nil {
		return
	}
	m.conns.Add(-1)
}

// StreamOpened counts an open stream: RouteWebSocket goes to the WebSocket
// gauge, RouteSSE to the SSE streams, any other kind to the chunked (http)
// streams.
func (m *Metrics) StreamOpened(kind RouteKind) {
	if m == nil {
		return
	}
	m.openGauge(kind).Add(1)
}

// openGauge is the gauge that counts an open stream of kind: WebSockets
// have their own; every other kind but SSE counts as http.
func (m *Metrics) openGauge(kind RouteKind) *atomic.Int64 {
	switch kind {
	case RouteWebSocket:
		return &m.websockets
	case RouteSSE:
		return &m.streams[RouteSSE]
	}
	return &m.streams[RouteHTTP]
}

// StreamClosed undoes StreamOpened(kind) and records the stream's lifetime.
func (m *Metrics) StreamClosed(kind RouteKind, life time.Duration) {
	if m == nil {
		return
	}
	m.openGauge(kind).Add(-1)
	if kind != RouteWebSocket && kind != RouteSSE {
		kind = RouteHTTP
	}
	m.streamDuration[kind].Observe(life.Seconds())
}

// DownloadDone undoes StreamOpened(kind) for a fixed-length body relayed as
// it came (too large to read whole), and records its time to the last byte
// as ResponseDone does: an open stream while it lasts, it is a response of
// known size, timed in the response buckets rather than as a stream's
// lifetime.
func (m *Metrics) DownloadDone(status int, kind RouteKind, total time.Duration) {
	if m == nil {
		return
	}
	m.openGauge(kind).Add(-1)
	m.ResponseDone(status, kind, total)
}

// streamKinds are the route kinds a stream can have: the label values of
// cubeproxy_streams_ended_total.
var streamKinds = [...]RouteKind{RouteHTTP, RouteSSE, RouteWebSocket}

// StreamEnded counts a streamed response (a body the proxy relayed as it
// came, not one read whole) or a WebSocket tunnel that ended, and why.
// RouteWebSocket and RouteSSE count as themselves, any other kind as
// RouteHTTP.
func (m *Metrics) StreamEnded(kind RouteKind, why StreamEnd) {
	if m == nil {
		return
	}
	if kind != RouteWebSocket && kind != RouteSSE {
		kind = RouteHTTP
	}
	m.streamEnds[kind][why.index()].Add(1)
}

// CacheLookup counts one route-cache lookup; CacheNone is ignored.
func (m *Metrics) CacheLookup(r CacheResult) {
	if m == nil || r == CacheNone {
		return
	}
	m.cache[r.index()].Add(1)
}

// StoreLookup records the latency of one store call and counts it as an
// error when failed (an unknown sandbox is not a failure).
func (m *Metrics) StoreLookup(store StoreKind, d time.Duration, failed bool) {
	if m == nil {
		return
	}
	s := store.index()
	m.storeDuration[s].Observe(d.Seconds())
	if failed {
		m.storeErrors[s].Add(1)
	}
}

// UpstreamConnectError counts a dial to a sandbox that failed, its retry
// included (a first attempt that failed is counted by UpstreamRetry).
func (m *Metrics) UpstreamConnectError() {
	if m == nil {
		return
	}
	m.connectErrors.Add(1)
}

// UpstreamResourceError counts a dial to a sandbox that failed for want of
// the proxy's own descriptors or local ports: no failure of the sandbox's.
func (m *Metrics) UpstreamResourceError() {
	if m == nil {
		return
	}
	m.resourceErrs.Add(1)
}

// UpstreamRetry counts a retried connect, or a request re-sent on a new
// connection after its keep-alive one turned out closed.
func (m *Metrics) UpstreamRetry() {
	if m == nil {
		return
	}
	m.retries.Add(1)
}

// WaitOutcome is how a wait for a slot at max_streams_per_sandbox ended
// (Metrics.StreamLimitWait).
type WaitOutcome uint8

// The outcomes of a wait for a slot, the outcome label of
// cubeproxy_stream_limit_waits_total.
const (
	// WaitSlot: a slot came free, and the request is judged again. It may
	// lose the slot to another, and then wait on (counted again).
	WaitSlot WaitOutcome = iota
	// WaitRefused: none did within stream_limit_wait, or the drain began
	// (the 429), or the client closed its connection (the 499).
	WaitRefused
	// WaitState: the sandbox was paused, killed or forgotten meanwhile;
	// the request is answered as a new one would be (a 503, a 410, or
	// judged again on the sandbox's new entry).
	WaitState
	numWaitOutcomes
)

// StreamLimitWait counts the end of a wait for a slot by a request over
// max_streams_per_sandbox, by how it ended.
func (m *Metrics) StreamLimitWait(o WaitOutcome) {
	if m == nil || o >= numWaitOutcomes {
		return
	}
	m.limitWaits[o].Add(1)
}

// ResumeOutcome is how a call to the lifecycle manager to resume a paused
// sandbox ended (Metrics.SandboxResume).
type ResumeOutcome uint8

// The outcomes of a resume call, the outcome label of
// cubeproxy_sandbox_resumes_total.
const (
	// ResumeResumed: the lifecycle manager answered 200; the sandbox is
	// taken as running and the requests that waited are served.
	ResumeResumed ResumeOutcome = iota
	// ResumeFailed: any other status, no answer within
	// lifecycle.resume_timeout, or no connection; the requests that
	// waited get 503 resume_failed.
	ResumeFailed
	numResumeOutcomes
)

// SandboxResume counts one call to the lifecycle manager to resume a
// paused sandbox, by how it ended; the requests that joined it are not
// counted. Out-of-range values are ignored.
func (m *Metrics) SandboxResume(o ResumeOutcome) {
	if m == nil || o >= numResumeOutcomes {
		return
	}
	m.resumes[o].Add(1)
}

// AcceptError counts a failed accept of a client connection that the
// listener retries (EMFILE and the like).
func (m *Metrics) AcceptError() {
	if m == nil {
		return
	}
	m.acceptErrors.Add(1)
}

// ConnRefused counts a client connection refused because the proxy held
// client.max_conns connections already.
func (m *Metrics) ConnRefused() {
	if m == nil {
		return
	}
	m.connsRefused.Add(1)
}

// ConnsReclaimed counts n client connections that waited for a request,
// closed to admit new ones at client.max_conns.
func (m *Metrics) ConnsReclaimed(n int) {
	if m == nil {
		return
	}
	m.reclaimed.Add(int64(n))
}

// AuthRejected counts a refused request. reason is one of the Auth*
// constants; anything else is counted as AuthOther.
func (m *Metrics) AuthRejected(reason string) {
	if m == nil {
		return
	}
	m.auth[authReasonIndex(reason)].Add(1)
}

// AccessLogDropped counts one access log line lost to a stalled or failing
// sink (a full disk, a broken pipe); it fits accesslog.New's onDrop
// parameter.
func (m *Metrics) AccessLogDropped() {
	if m == nil {
		return
	}
	m.logDrops.Add(1)
}

// spanDropped counts one span dropped at a full export queue and returns
// the count so far.
func (m *Metrics) spanDropped() int64 { return m.spansDropped(1) }

// spansDropped counts n spans dropped unexported and returns the count so
// far.
func (m *Metrics) spansDropped(n int) int64 {
	if m == nil {
		return 0
	}
	return m.spanDrops.Add(int64(n))
}

// AccessLogReopenFailed counts one failed reopen of the access log file
// (SIGHUP): lines keep going to the file open before, which logrotate may
// have renamed or removed.
func (m *Metrics) AccessLogReopenFailed() {
	if m == nil {
		return
	}
	m.logReopenErrs.Add(1)
}

// AccessLogCloseFailed counts one failed close(2) of the access log file
// (of the file a reopen replaced, or at exit): a network or FUSE file
// system reporting there a write-back that failed. It fits
// accesslog.Config.OnCloseFailure.
func (m *Metrics) AccessLogCloseFailed() {
	if m == nil {
		return
	}
	m.logCloseErrs.Add(1)
}

// AccessLogTruncated counts one truncation of the access log file under
// the proxy (logrotate's copytruncate), which may have lost lines no one
// can count. It fits accesslog.Config.OnTruncate.
func (m *Metrics) AccessLogTruncated() {
	if m == nil {
		return
	}
	m.logTruncs.Add(1)
}

// SetProcessLogDropped installs the function read at every scrape for
// cubeproxy_process_log_dropped_total (0 until set): the process log's
// writer counts its own drops, and is made before the metrics.
// fn runs on the scrape goroutine and must not block.
func (m *Metrics) SetProcessLogDropped(fn func() uint64) {
	if m == nil || fn == nil {
		return
	}
	m.procLogDrops.Store(&fn)
}

// SetPoolStats installs the function read at every scrape for the upstream
// pool gauges (absent until set). It replaces any earlier one; nil removes it.
// fn runs on the scrape goroutine and must not block.
func (m *Metrics) SetPoolStats(fn func() (pools, idle int64)) {
	if m == nil {
		return
	}
	if fn == nil {
		m.poolStats.Store(nil)
		return
	}
	m.poolStats.Store(&fn)
}

// SetHeldBodyBytes installs the function read at every scrape for
// cubeproxy_held_body_bytes (0 until set): the proxy counts the bytes of
// the bodies it holds in its own budget, which is made after the metrics.
// fn runs on the scrape goroutine and must not block.
func (m *Metrics) SetHeldBodyBytes(fn func() int64) {
	if m == nil || fn == nil {
		return
	}
	m.heldBodies.Store(&fn)
}

// InvalidationStats is the state of the Redis invalidation subscription,
// read at every scrape (SetInvalidationStats).
type InvalidationStats struct {
	Subscribed    bool  // invalidations are being received now
	Subscriptions int64 // subscriptions confirmed, the first included
	Messages      int64 // ids received and applied to the cache
}

// SetInvalidationStats installs the function read at every scrape for the
// cubeproxy_route_invalidation_ series (absent until set: the memory store
// has no subscription). fn runs on the scrape goroutine and must not block.
func (m *Metrics) SetInvalidationStats(fn func() InvalidationStats) {
	if m == nil || fn == nil {
		return
	}
	m.invalidation.Store(&fn)
}

// SetCertExpiry installs the function read at every scrape for
// cubeproxy_tls_certificate_expiry_timestamp_seconds (absent until set,
// and while fn returns zero: no HTTPS listener, or no certificate yet).
// fn runs on the scrape goroutine and must not block.
func (m *Metrics) SetCertExpiry(fn func() time.Time) {
	if m == nil || fn == nil {
		return
	}
	m.certExpiry.Store(&fn)
}

// builder creates instruments and keeps the first error, so newMetrics
// reads as a plain list.
type builder struct {
	meter metric.Meter
	err   error
}

func (b *builder) keep(name string, err error) {
	if err != nil && b.err == nil {
		b.err = fmt.Errorf("create instrument %s: %w", name, err)
	}
}

func (b *builder) counter(name, unit, desc string) metric.Int64ObservableCounter {
	c, err := b.meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(name, err)
	return c
}

func (b *builder) gauge(name, unit, desc string) metric.Int64ObservableUpDownCounter {
	g, err := b.meter.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(name, err)
	return g
}
