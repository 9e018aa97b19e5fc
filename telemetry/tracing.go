package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// EdgeSampler is the sampler CubeProxy uses: a span whose parent is local
// follows the parent, and every other span, including one whose parent came
// from the client, is sampled by trace id at ratio. A client therefore cannot
// force sampling with a "-01" traceparent (nor suppress it with "-00"), and
// all hops that sample by ratio agree on the same traces. The price of that
// agreement: a client that picks its trace ids can pick sampled ones, raising
// the span volume of its own requests (never blocking them: the batch
// processor drops spans when its queue is full).
func EdgeSampler(ratio float64) sdktrace.Sampler {
	byID := sdktrace.TraceIDRatioBased(ratio)
	return sdktrace.ParentBased(byID,
		sdktrace.WithRemoteParentSampled(byID),
		sdktrace.WithRemoteParentNotSampled(byID))
}

// Check reports what New would refuse in c's tracing settings and the
// OTEL_* variables they read (an exporter, protocol or sampler it does not
// support, a sample ratio out of range), without building an exporter or
// reaching a collector: cubeproxy check refuses what serve would. The
// sample ratio is looked at only when tracing is on, as New does. The
// resource is built as New builds it, since New refuses a malformed
// OTEL_RESOURCE_ATTRIBUTES (read from the process environment, not Env)
// whether tracing is on or not: its attributes label the metrics too.
func (c Config) Check() error {
	if _, _, _, _, err := c.tracing(); err != nil {
		return err
	}
	_, err := newResource(context.Background(), &c)
	return err
}

// tracing reads the tracing settings as New applies them: on is false when
// tracing is off (no injected exporter and none asked for), and then kind,
// ratio and the batch settings (OTLP export only) are not looked at.
func (c *Config) tracing() (on bool, kind exporterKind, ratio float64, batch batchSettings, err error) {
	env := c.env()
	if c.SpanExporter == nil {
		if kind, err = traceExporterKind(env); err != nil || kind == exporterNone {
			return false, kind, 0, batch, err
		}
		// From the process environment, as the exporters read theirs:
		// the SDK did, and embedders (tests) set them there.
		if batch, err = readBatchSettings(os.Getenv); err != nil {
			return false, kind, 0, batch, err
		}
	}
	if ratio, err = c.sampleRatio(env); err != nil {
		return false, kind, 0, batch, err
	}
	return true, kind, ratio, batch, nil
}

// newTracerProvider builds the SDK provider and its one span processor, or
// returns nils when tracing is off. cut, nil with an injected exporter,
// gives the OTLP exporter up (see cutExporter). Spans the export queue has
// no room for count in m (queueGate).
func newTracerProvider(ctx context.Context, cfg *Config, res *resource.Resource, m *Metrics) (tp *sdktrace.TracerProvider, proc sdktrace.SpanProcessor, cut context.CancelFunc, err error) {
	on, kind, ratio, batch, err := cfg.tracing()
	if err != nil || !on {
		return nil, nil, nil, err
	}
	switch kind {
	case exporterNone: // injected exporter
		proc = sdktrace.NewSimpleSpanProcessor(cfg.SpanExporter)
	case exporterOTLPHTTP, exporterOTLPGRPC:
		var exp sdktrace.SpanExporter
		if kind == exporterOTLPGRPC {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			// The proxy variables read now, from the process environment,
			// as the exporter reads its own: the same proxy exportVia names.
			exp, err = otlptracehttp.New(ctx, otlptracehttp.WithProxy(collectorProxy(proxyEnv(os.Getenv).ProxyFunc())))
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("create OTLP trace exporter: %w", err)
		}
		ce := newCutExporter(exp, m)
		// From the process environment, which the exporters read them from.
		ce.secrets = headerSecrets(os.Getenv)
		ce.via = exportVia(os.Getenv, kind == exporterOTLPGRPC)
		cut = ce.cancel
		// The batch processor drops spans when its queue is full instead of
		// blocking the request path; the gate in front of it does that
		// dropping so that it is counted and said.
		proc = &queueGate{
			SpanProcessor: sdktrace.NewBatchSpanProcessor(ce, batch.options()...),
			held:          &ce.held,
			// One place is left for the marker ForceFlush queues.
			limit:   int64(max(batch.queue-1, 1)),
			metrics: m,
		}
	}
	tp = sdktrace.NewTracerProvider(
		sdktrace.WithSampler(EdgeSampler(ratio)),
		sdktrace.WithSpanProcessor(proc),
		sdktrace.WithResource(res),
	)
	return tp, proc, cut, nil
}

// cutExporter is the OTLP exporter as the batch processor sees it, so that
// Telemetry.Shutdown's deadline holds for the exports too. Once cancel is
// called (the deadline passed), the export in flight is cancelled and every
// later one drops its spans at once: the processor then drains its queue
// in microseconds and shuts the exporter down, which closes its
// connections. Without it the processor would go on exporting every
// queued batch, one after the other, each for the exporter's timeout
// (10 s, plus retries), to a collector that does not answer: goroutines
// and sockets outliving Shutdown for minutes, which a process that exits
// does not mind but an in-process serve (tests, embedders) does.
type cutExporter struct {
	sdktrace.SpanExporter
	cut    context.Context // done once the exports are given up
	cancel context.CancelFunc
	// held counts the spans queueGate handed to the batch processor that
	// have not reached ExportSpans yet: the processor's queue and batch.
	held    atomic.Int64
	metrics *Metrics // counts the spans of a failed export
	// secrets are the OTLP header values, hidden in a failed export's
	// error (exportError).
	secrets []string
	// via names the proxy the exports go through in a failed export's
	// error, "" when they go direct (exportVia).
	via string
}

func newCutExporter(exp sdktrace.SpanExporter, m *Metrics) *cutExporter {
	cut, cancel := context.WithCancel(context.Background())
	return &cutExporter{SpanExporter: exp, cut: cut, cancel: cancel, metrics: m}
}

// errExportsCut is the cause an export in flight is cancelled with.
var errExportsCut = errors.New("span export given up: telemetry shutdown deadline passed")

// ExportSpans exports spans unless the exports were cut, cancelling the
// export when they are cut while it runs. Once cut, the spans are dropped
// without an error, the export the cut cancelled too: Telemetry.Shutdown
// has already said spans were lost, and an error per batch would only
// repeat that in the log, once per queued batch, and after Shutdown has
// returned (serve's last line).
func (e *cutExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.held.Add(-int64(len(spans))) // out of the processor's queue and batch
	if e.cut.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Registered with the cut context (a context.WithCancel one), so no
	// goroutine waits for the cut per export.
	stop := context.AfterFunc(e.cut, func() { cancel(errExportsCut) })
	defer stop()
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil && context.Cause(ctx) == errExportsCut {
		return nil
	}
	if err != nil && !isPartialSuccess(err) {
		// The processor does not try them again: counted, as the queue's
		// drops are, since a collector that rejects every export (a 400, a
		// 401 for a wrong header) or is unavailable past the timeout loses
		// every span with the queue never full.
		e.metrics.spansDropped(len(spans))
	}
	if err != nil {
		xe := newExportError(err, e.secrets)
		if e.via != "" {
			xe.msg += " (" + e.via + ")"
		}
		return xe
	}
	return nil
}

// maxExportErrorLen bounds a failed export's error text, which serve logs.
const maxExportErrorLen = 512

// minSecretLen is the shortest header value hidden in an export's error:
// a shorter one (a tenant id "1") is no credential, and hiding it would
// mangle the message.
const minSecretLen = 6

// exportError is a failed export's error as the process log gets it:
// the OTLP header values (the collector's API key) hidden and the text
// cut at maxExportErrorLen. The exporters put the collector's whole answer
// in the error, up to 4 MiB of body (OTLP/HTTP) or a gRPC status message,
// and one that echoes the request's headers (many a gateway's 400 or 429
// does) put OTEL_EXPORTER_OTLP_HEADERS' key in the log; a 3 MiB error
// page made a 3 MiB log line. Unwrap gives the exporter's error for
// errors.Is, not for logging.
type exportError struct {
	msg string
	err error
}

func (e *exportError) Error() string { return e.msg }
func (e *exportError) Unwrap() error { return e.err }

// newExportError returns err with every secret replaced by "[redacted]"
// and its text cut to maxExportErrorLen.
func newExportError(err error, secrets []string) *exportError {
	msg := err.Error()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "[redacted]")
	}
	if len(msg) > maxExportErrorLen {
		cut := strings.ToValidUTF8(msg[:maxExportErrorLen], "")
		msg = fmt.Sprintf("%s... (%d bytes more)", cut, len(msg)-len(cut))
	}
	return &exportError{msg: msg, err: err}
}

// headerSecrets returns the values of OTEL_EXPORTER_OTLP_HEADERS and
// OTEL_EXPORTER_OTLP_TRACES_HEADERS as sent (percent-decoded, trimmed)
// and as written, and each of their words ("Bearer TOKEN"'s token: a
// collector may echo only that), those of at least minSecretLen bytes.
// Longest first, so that a value is hidden before a word inside it.
func headerSecrets(getenv func(string) string) []string {
	var out []string
	add := func(v string) {
		if len(v) >= minSecretLen && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	for _, n := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		for entry := range strings.SplitSeq(getenv(n), ",") {
			_, raw, ok := strings.Cut(entry, "=")
			if !ok {
				continue
			}
			add(strings.TrimSpace(raw))
			dec, err := url.PathUnescape(raw)
			if err != nil {
				continue
			}
			add(strings.TrimSpace(dec))
			for _, w := range strings.Fields(dec) {
				add(w)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// isPartialSuccess reports whether err is only the collector's partial
// success answer: it took the export and says itself what it did not keep.
// The exporters' error type for it is internal to them, so it is known by
// its text, under otlptrace's "traces export: ".
func isPartialSuccess(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if strings.HasPrefix(err.Error(), "OTLP partial success") {
			return true
		}
	}
	return false
}

// collectorProxy returns the OTLP/HTTP exporter's proxy function: proxy,
// the environment's (HTTP_PROXY and the like, as the exporter's default
// http.ProxyFromEnvironment reads them), but it refuses a redirect the
// exporter's HTTP client would follow unsaid. Followed, a 307 or 308 to another host sent it the export with the
// OTEL_EXPORTER_OTLP_HEADERS credential (the client drops only
// Authorization and Cookie there), and a 301, 302 or 303 turned the export
// into a GET without its spans, which a 200 answered: every span lost, no
// line in the log and none counted. Called for each request the client
// sends, a redirected one carries the answer that caused it (Response),
// so the redirect is refused before it is sent, and the export fails:
// logged and its spans counted. One that keeps the POST (307, 308) to the
// same host name, without going from https to http, is followed, as before.
func collectorProxy(proxy func(*url.URL) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	return func(r *http.Request) (*url.URL, error) {
		if prev := r.Response; prev != nil && prev.Request != nil {
			if err := checkCollectorRedirect(prev.StatusCode, prev.Request.URL, r); err != nil {
				return nil, err
			}
		}
		return proxy(r.URL)
	}
}

// exportVia says which proxy the trace exports go through, for a failed
// export's error ("" when they go direct): "through the proxy
// squid:3128 of HTTPS_PROXY", its host alone, never its credentials. A
// proxy that refuses the CONNECT (its 403 or 407) failed the export with
// Go's bare reason phrase after the collector's URL, `Post
// "https://collector/v1/traces": Forbidden`, which read as the collector's
// own refusal; nothing in the log said a proxy was on the way. gRPC reads
// the same variable (HTTPS_PROXY) through net/http.
func exportVia(getenv func(string) string, grpc bool) string {
	_, v := traceEndpoint(getenv)
	endpoint, err := url.Parse(v)
	if v == "" || err != nil {
		return ""
	}
	name, _, proxy, used := traceProxy(getenv, endpoint, grpc)
	if !used || proxy == nil {
		return ""
	}
	return fmt.Sprintf("through the proxy %s of %s", proxy.Host, name)
}

// checkCollectorRedirect says why the export to from, answered code, is
// not to be sent again as r, or nil.
func checkCollectorRedirect(code int, from *url.URL, r *http.Request) error {
	why := ""
	switch {
	case r.Method != http.MethodPost:
		why = "the exporter would send it again as a " + r.Method + " without its spans"
	case !strings.EqualFold(r.URL.Hostname(), from.Hostname()):
		why = "another host, which the exporter would send the OTLP headers' credential"
	case from.Scheme == "https" && r.URL.Scheme != "https":
		why = "plain HTTP, where the exporter would send the OTLP headers in clear"
	default:
		return nil
	}
	return fmt.Errorf("%w: %d to %s://%s%s: %s; set the OTLP endpoint to where the collector takes exports",
		errCollectorRedirect, code, r.URL.Scheme, r.URL.Host, r.URL.Path, why)
}

// errCollectorRedirect is the error of an export the collector redirected.
var errCollectorRedirect = errors.New("collector redirect not followed")

// queueGate is the span processor in front of the batch processor: it hands
// a sampled span on only while the processor's queue has room for it, and
// counts the others (cubeproxy_spans_dropped_total) and says so in the
// process log, at most once per dropWarnEvery. The batch processor drops a
// span whose queue is full without a trace (the SDK counts it only in its
// experimental self-metrics, on the global meter provider the proxy does
// not set): a collector that took spans slower than they came (one taking
// 1 s per export, at ~7,000 requests a second) had 97 % of them dropped, no
// line in the log and nothing in the scrape to tell missing traces from
// requests never made.
type queueGate struct {
	sdktrace.SpanProcessor // the batch processor
	// held is the spans handed on and not yet exported (cutExporter's):
	// at most limit, so the processor's queue never overflows.
	held     *atomic.Int64
	limit    int64
	metrics  *Metrics
	lastWarn atomic.Int64 // unix nanoseconds of the last warning, 0 none
}

// dropWarnEvery is how often a full export queue is said in the process log.
const dropWarnEvery = 10 * time.Second

// OnEnd hands s on to the batch processor if its queue has room, else drops
// it, counted.
func (g *queueGate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor exports only sampled spans
	}
	for {
		n := g.held.Load()
		if n >= g.limit {
			g.drop()
			return
		}
		if g.held.CompareAndSwap(n, n+1) {
			break
		}
	}
	g.SpanProcessor.OnEnd(s)
}

// drop counts a span the queue had no room for and, at most once per
// dropWarnEvery, reports it to OpenTelemetry's error handler (serve logs it
// as a warning with "component":"telemetry").
func (g *queueGate) drop() {
	total := g.metrics.spanDropped()
	now := time.Now().UnixNano()
	last := g.lastWarn.Load()
	if last != 0 && now-last < int64(dropWarnEvery) || !g.lastWarn.CompareAndSwap(last, now) {
		return
	}
	otel.Handle(fmt.Errorf("%w: %d dropped so far (cubeproxy_spans_dropped_total); the trace collector does not take them as fast as they come", errQueueFull, total))
}

// errQueueFull is what a dropped span is reported as; its text up to the
// colon is the kind serve's log throttles by.
var errQueueFull = errors.New("traces export queue full, dropping spans")
