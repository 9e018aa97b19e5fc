package telemetry

import (
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TracesOff names the variable that turns traces off, as New reads them,
// and nothing when they are on (or refused): cubeproxy check writes it
// beside a sample ratio that then applies to nothing.
func TestTracesOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		env  map[string]string
		want string
	}{
		{"no exporter", Config{}, nil, "OTEL_TRACES_EXPORTER unset"},
		{"exporter none", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "None"}, "OTEL_TRACES_EXPORTER=None"},
		{"SDK disabled", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": " TRUE"}, "OTEL_SDK_DISABLED=TRUE"},
		{"always_off", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_off"}, "OTEL_TRACES_SAMPLER=always_off"},
		{"parentbased_always_off", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "OTEL_TRACES_SAMPLER=parentbased_always_off"},
		{"on", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, ""},
		{"on, ratio sampler", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio"}, ""},
		{"refused exporter", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, ""},
		{"injected exporter", Config{SpanExporter: tracetest.NewInMemoryExporter()}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Env = envMap(tc.env)
			if got := c.TracesOff(); got != tc.want {
				t.Errorf("TracesOff() = %q, want %q", got, tc.want)
			}
			// As New reads them: off exactly where TracesOff names why.
			if on, _, _, _, err := c.tracing(); err == nil && on == (tc.want != "") {
				t.Errorf("tracing on %v, TracesOff %q", on, tc.want)
			}
		})
	}
}
