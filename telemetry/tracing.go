package telemetry

import (
	"context"
	"fmt"

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
	if _, _, _, err := c.tracing(); err != nil {
		return err
	}
	_, err := newResource(context.Background(), &c)
	return err
}

// tracing reads the tracing settings as New applies them: on is false when
// tracing is off (no injected exporter and none asked for), and then kind
// and ratio are not looked at.
func (c *Config) tracing() (on bool, kind exporterKind, ratio float64, err error) {
	env := c.env()
	if c.SpanExporter == nil {
		if kind, err = traceExporterKind(env); err != nil || kind == exporterNone {
			return false, kind, 0, err
		}
	}
	if ratio, err = c.sampleRatio(env); err != nil {
		return false, kind, 0, err
	}
	return true, kind, ratio, nil
}

// newTracerProvider builds the SDK provider, or returns nil when tracing is off.
func newTracerProvider(ctx context.Context, cfg *Config, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	on, kind, ratio, err := cfg.tracing()
	if err != nil || !on {
		return nil, err
	}
	var proc sdktrace.SpanProcessor
	switch kind {
	case exporterNone: // injected exporter
		proc = sdktrace.NewSimpleSpanProcessor(cfg.SpanExporter)
	case exporterOTLPHTTP, exporterOTLPGRPC:
		var exp sdktrace.SpanExporter
		if kind == exporterOTLPGRPC {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("create OTLP trace exporter: %w", err)
		}
		// The batch processor drops spans when its queue is full instead of
		// blocking the request path.
		proc = sdktrace.NewBatchSpanProcessor(exp)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithSampler(EdgeSampler(ratio)),
		sdktrace.WithSpanProcessor(proc),
		sdktrace.WithResource(res),
	), nil
}
