package telemetry

import (
	"context"
	"testing"
)

// envMap returns a Config.Env reading only m, so tests never see the
// process environment.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// newTestTelemetry builds a Telemetry and shuts it down with the test.
func newTestTelemetry(tb testing.TB, cfg Config) *Telemetry {
	tb.Helper()
	if cfg.Env == nil {
		cfg.Env = envMap(nil)
	}
	tel, err := New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			tb.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}
