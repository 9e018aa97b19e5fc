package telemetry

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestREADMETracesNamesWhatIsAccepted: each trace variable whose value can
// refuse the start has its accepted values named in the README's Traces
// paragraph, so an operator carrying OTEL_* settings over from another
// service learns there, not from a failed rollout, that a Zipkin exporter
// or the http/json protocol is refused. Each value is first checked to be
// what New accepts, and a value outside them to be refused.
func TestREADMETracesNamesWhatIsAccepted(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, para, ok := strings.Cut(string(raw), "- **Traces**")
	if !ok {
		t.Fatal("README has no **Traces** paragraph")
	}
	para, _, _ = strings.Cut(para, "\n- **")
	on := func(kv ...string) map[string]string {
		env := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
		for i := 0; i+1 < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	for _, v := range []struct {
		name     string
		accepted []string
		refused  string
		env      func(value string) map[string]string
	}{
		{"OTEL_TRACES_EXPORTER", []string{"otlp", "none"}, "zipkin",
			func(x string) map[string]string { return map[string]string{"OTEL_TRACES_EXPORTER": x} }},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", []string{"http/protobuf", "grpc"}, "http/json",
			func(x string) map[string]string { return on("OTEL_EXPORTER_OTLP_PROTOCOL", x) }},
		{"OTEL_TRACES_SAMPLER", []string{"always_on", "always_off", "traceidratio", "parentbased_always_off"}, "jaeger_remote",
			func(x string) map[string]string { return on("OTEL_TRACES_SAMPLER", x) }},
		// A number from 0 to 1: no word to name, only the variable.
		{"OTEL_TRACES_SAMPLER_ARG", nil, "lots",
			func(x string) map[string]string { return on("OTEL_TRACES_SAMPLER_ARG", x) }},
	} {
		for _, a := range v.accepted {
			tel, err := New(context.Background(), Config{Env: envMap(v.env(a))})
			if err != nil {
				t.Errorf("%s=%s: %v, want it accepted", v.name, a, err)
				continue
			}
			tel.Shutdown(context.Background())
			if !strings.Contains(para, "`"+a+"`") && !strings.Contains(para, "="+a+"`") {
				t.Errorf("README's Traces paragraph does not name `%s`, which %s accepts", a, v.name)
			}
		}
		if _, err := New(context.Background(), Config{Env: envMap(v.env(v.refused))}); err == nil {
			t.Errorf("%s=%s: accepted, want it refused", v.name, v.refused)
		}
		if !strings.Contains(para, "`"+v.name) && !strings.Contains(para, "`OTEL_EXPORTER_OTLP_*`") {
			t.Errorf("README's Traces paragraph does not name %s", v.name)
		}
	}
	// Read from the process environment (TestBatchSettingsFromProcessEnv).
	for _, name := range []string{"OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT"} {
		if !strings.Contains(para, "`"+name+"`") {
			t.Errorf("README's Traces paragraph does not name %s, whose bad values refuse the start", name)
		}
	}
	if !strings.Contains(para, "refuses to start") {
		t.Error("README's Traces paragraph does not say which values refuse to start")
	}
}
