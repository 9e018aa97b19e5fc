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

// newTracerProvider builds the SDK provider, or returns nil when tracing is off.
func newTracerProvider(ctx context.Context, cfg *Config, res *resource.Resource) (*sdktrace.TracerProvider, error) {
	env := cfg.env()
	kind := exporterNone
	if cfg.SpanExporter == nil {
		var err error
		if kind, err = traceExporterKind(env); err != nil {
			return nil, err
		}
		if kind == exporterNone {
			return nil, nil
		}
	}
	ratio, err := cfg.sampleRatio(env)
	if err != nil {
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
