package telemetry

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/net/http/httpguts"
)

// fuzzSecret marks a credential in FuzzOTLPHeaders' input.
const fuzzSecret = "S3CRET"

// FuzzOTLPHeaders holds the check of OTEL_EXPORTER_OTLP_HEADERS to the
// exporters themselves, for both protocols: headers the check takes are
// headers the real exporter sends (net/http's and gRPC's own checks of
// every request, run against a port nothing listens on), and a refusal
// never shows a credential: S3CRET in a value, or in a name past the
// first character a header name cannot hold (Authorization:Basic S3CRET==),
// is not in the error.
func FuzzOTLPHeaders(f *testing.F) {
	f.Add("x-api-key="+fuzzSecret, false)
	f.Add("Authorization=Bearer%20"+fuzzSecret+", x-team=a=b,", true)
	f.Add("Authorization:Basic "+fuzzSecret+"==", false)
	f.Add("x-api-key:"+fuzzSecret, true)
	f.Add("k="+fuzzSecret+"%", false)
	f.Add("k="+fuzzSecret+"%0A", true)
	f.Add("x-api-key="+fuzzSecret+"-t%C3%B6ken", true)
	f.Add("x!team="+fuzzSecret, true)
	f.Add("x-tok-bin=%FF"+fuzzSecret, true)
	f.Add(" =S3CRET", false)
	f.Fuzz(func(t *testing.T, headers string, grpc bool) {
		if strings.ContainsRune(headers, 0) {
			return // no environment variable holds a NUL
		}
		env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": headers}
		if grpc {
			env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
		}
		_, err := traceExporterKind(envMap(env))
		if err != nil {
			if strings.Contains(err.Error(), fuzzSecret) && !secretInName(headers) {
				t.Fatalf("the error shows a credential: %v", err)
			}
			return
		}
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", headers)
		if msg := exportRefusal(t, grpc); msg != "" {
			t.Fatalf("check took %q, which the exporter (grpc %v) refuses: %s", headers, grpc, msg)
		}
	})
}

// secretInName reports whether fuzzSecret is in a header name of headers
// as far as the name is shown: up to its first character a name cannot
// hold.
func secretInName(headers string) bool {
	for entry := range strings.SplitSeq(headers, ",") {
		key, _, ok := strings.Cut(entry, "=")
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		if i := strings.IndexFunc(key, func(r rune) bool { return !httpguts.IsTokenRune(r) }); i >= 0 {
			key = key[:i]
		}
		if strings.Contains(key, fuzzSecret) {
			return true
		}
	}
	return false
}

// exportRefusal exports one span with the real exporter of the protocol,
// to a port nothing listens on, and returns its error if the client
// refused the request itself (a header it will not send), else "".
func exportRefusal(t *testing.T, grpc bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var exp sdktrace.SpanExporter
	var err error
	if grpc {
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint("127.0.0.1:1"), otlptracegrpc.WithInsecure(),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	} else {
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint("127.0.0.1:1"), otlptracehttp.WithInsecure(),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(context.Background())
	exportCtx := ctx
	if grpc {
		// gRPC checks the metadata before it waits for a connection.
		c, cancel := context.WithCancel(ctx)
		cancel()
		exportCtx = c
	}
	err = exp.ExportSpans(exportCtx, tracetest.SpanStubs{{Name: "s"}}.Snapshots())
	switch {
	case err == nil:
		t.Fatal("an export to a closed port succeeded")
	case grpc && strings.Contains(err.Error(), "code = Internal"),
		!grpc && strings.Contains(err.Error(), "invalid header field"):
		return err.Error()
	}
	return ""
}
