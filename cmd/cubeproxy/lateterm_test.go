package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A SIGTERM that arrives while the start is still loading (a routes file
// of 200k routes parses for seconds) stops the start before any listener
// opens. Earlier builds opened the listeners afterwards and logged
// "cubeproxy listening" and "cubeproxy ready" before draining: a
// reuse_port takeover script waiting for the ready line took the stopped
// process for the new one and stopped the old. The signal is modelled as
// a context ended before serve runs, as signal.NotifyContext ends it.
func TestSignalDuringLoadStopsBeforeListening(t *testing.T) {
	for _, cmd := range []string{"serve", "demo"} {
		t.Run(cmd, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var out, errOut bytes.Buffer
			args := []string{"--config=", "--routes=", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}
			called := false
			var err error
			if cmd == "serve" {
				err = serve(ctx, args, func(string) string { return "" }, &out, &errOut, func(*app) { called = true })
			} else {
				err = demo(ctx, args, func(string) string { return "" }, &out, &errOut)
			}
			if err != nil {
				t.Fatalf("%s: %v, want nil (a stop asked for)", cmd, err)
			}
			logs := out.String() + errOut.String()
			if called || strings.Contains(logs, "cubeproxy listening") || strings.Contains(logs, "cubeproxy ready") {
				t.Errorf("%s opened its listeners after the signal:\n%s", cmd, logs)
			}
			if !strings.Contains(logs, "signal during startup: stopped before serving") {
				t.Errorf("%s did not say the start was stopped:\n%s", cmd, logs)
			}
		})
	}
}
