package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrumentationName names CubeProxy's tracer and meter.
const instrumentationName = "github.com/cube-sandbox/cubeproxy"

// Telemetry holds the process's tracer, metrics and their providers. It sets
// no OpenTelemetry globals.
type Telemetry struct {
	// Tracer starts spans; a no-op tracer when tracing is off. Prefer the
	// StartServerSpan/StartClientSpan helpers, which skip even the no-op
	// tracer's context allocation when tracing is off.
	Tracer trace.Tracer
	// Metrics records CubeProxy's metrics; never nil.
	Metrics *Metrics

	tp         *sdktrace.TracerProvider // nil when tracing is off
	proc       sdktrace.SpanProcessor   // tp's one processor
	cutExports context.CancelFunc       // gives the OTLP exports up; nil with an injected exporter
	mp         *sdkmetric.MeterProvider
	handler    http.Handler
	propagator propagation.TextMapPropagator
}

// New builds tracing (off unless configured, see Config) and metrics with a
// Prometheus exporter on its own registry. Call Shutdown to flush spans.
func New(ctx context.Context, cfg Config) (*Telemetry, error) {
	res, err := newResource(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	// W3C trace context only. Baggage is the client's: the proxy adds none,
	// so it passes as sent like any end-to-end header. Re-injected through
	// OpenTelemetry, it reached the sandbox with members reordered, repeated
	// keys collapsed, values re-encoded, lines merged and the members it
	// refused dropped, only while tracing was on.
	t := &Telemetry{propagator: propagation.TraceContext{}}

	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process collector: %w", err)
	}
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// Explicit, so names never depend on Prometheus' global validation scheme.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("create prometheus exporter: %w", err)
	}
	t.mp = sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exp),
		sdkmetric.WithResource(res),
		// Measurements carry no trace context; skip the exemplar machinery.
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter),
	)
	if t.Metrics, err = newMetrics(t.mp.Meter(instrumentationName), reg); err != nil {
		return nil, errors.Join(err, t.mp.Shutdown(ctx))
	}
	t.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})

	if t.tp, t.proc, t.cutExports, err = newTracerProvider(ctx, &cfg, res, t.Metrics); err != nil {
		return nil, errors.Join(err, t.mp.Shutdown(ctx))
	}
	if t.tp != nil {
		t.Tracer = t.tp.Tracer(instrumentationName)
	} else {
		t.Tracer = noop.NewTracerProvider().Tracer(instrumentationName)
	}
	return t, nil
}

func newResource(ctx context.Context, cfg *Config) (*resource.Resource, error) {
	name := cfg.ServiceName
	if name == "" {
		name = "cubeproxy"
	}
	attrs := []resource.Option{
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(name)),
		resource.WithTelemetrySDK(),
	}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(cfg.ServiceVersion)))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(cfg.InstanceID)))
	}
	// Last, so OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES override the config.
	attrs = append(attrs, resource.WithFromEnv())
	res, err := resource.New(ctx, attrs...)
	if err != nil {
		// Only the environment's attributes can fail to parse: name the
		// variable, which the SDK's "missing value: [team]" does not.
		return nil, fmt.Errorf("build telemetry resource: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return res, nil
}

// TracingEnabled reports whether spans are recorded and exported.
func (t *Telemetry) TracingEnabled() bool { return t.tp != nil }

// MetricsHandler serves the Prometheus text exposition of CubeProxy's
// metrics plus the Go runtime and process collectors.
func (t *Telemetry) MetricsHandler() http.Handler { return t.handler }

// Propagator returns the W3C trace context propagator used by the span
// helpers (traceparent and tracestate; baggage is left to pass as sent).
func (t *Telemetry) Propagator() propagation.TextMapPropagator { return t.propagator }

// Shutdown flushes pending spans and stops the providers; its error says
// when spans could not be exported. Its deadline holds for the exports
// too: when ctx is done, the OTLP export in flight is cancelled and the
// spans still queued are dropped, so the exporter closes its connections
// then. Metrics recorded afterwards are ignored.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.tp != nil {
		// Flushed first: the provider's Shutdown exports what is queued
		// too, but hands a failed export to OpenTelemetry's global error
		// handler alone and returns nil, so lost spans went unsaid.
		if err := t.tp.ForceFlush(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flush spans: %w", err))
		}
		if err := t.tp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown tracer provider: %w", err))
		}
		// Both return when ctx is done, leaving the batch processor
		// exporting on its own goroutine, and the provider does not even
		// stop its processor once ctx is done: it would export what is
		// queued, then idle, for good, with the exporter never shut down.
		// Cut, the exports end at once; stopped (its second Shutdown does
		// nothing), the processor drains into the cut exporter and shuts
		// it down in the background.
		if ctx.Err() != nil {
			if t.cutExports != nil {
				t.cutExports()
			}
			_ = t.proc.Shutdown(ctx) // ctx.Err(), said above
		}
	}
	if err := t.mp.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("shutdown meter provider: %w", err))
	}
	return errors.Join(errs...)
}
