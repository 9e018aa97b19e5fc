//go:build unix

package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A SIGTERM or SIGINT (ctx's end) while serve or demo still waits for its
// configuration from a pipe (--config /dev/stdin, a named FIFO whose writer
// has not written or closed it) stops the start, as one during the rest of
// the start does: exit 0, said on stderr. The read took no notice of the
// signal, and main's signal handling had already taken the signal's
// default action away: the process stayed, deaf to SIGTERM and SIGINT
// alike (measured on the built binary: still running after two SIGTERMs),
// until the SIGKILL at the end of the orchestrator's grace period.
func TestSignalWhileReadingConfigPipeStopsTheStart(t *testing.T) {
	t.Parallel()
	cmds := []struct {
		name string
		run  func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr *syncBuffer) error
	}{
		{"serve", func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr *syncBuffer) error {
			return serve(ctx, args, getenv, stdout, stderr, nil)
		}},
		{"demo", func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr *syncBuffer) error {
			return demo(ctx, args, getenv, stdout, stderr)
		}},
	}
	for _, c := range cmds {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fifo := testenv.Mkfifo(t, t.TempDir(), "cubeproxy.yaml")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stdout, stderr syncBuffer
			done := make(chan error, 1)
			go func() { done <- c.run(ctx, []string{"--config", fifo}, noEnv, &stdout, &stderr) }()

			// A writer that connects and then says nothing, as a
			// template renderer still running: its open succeeds only
			// once the command has the pipe open for reading.
			var w *os.File
			testenv.WaitFor(t, 10*time.Second, "the command to open the config pipe", func() bool {
				f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
				if err != nil {
					return false
				}
				w = f
				return true
			})
			// Closing it ends a read still waiting, so that no goroutine
			// outlives the test.
			defer w.Close()

			cancel()
			if err := testenv.Recv(t, done, 5*time.Second, c.name+" to return after the signal"); err != nil {
				t.Errorf("%s after a signal while reading the config pipe: %v, want nil (exit 0)", c.name, err)
			}
			if !strings.Contains(stderr.String(), "signal during startup") {
				t.Errorf("stderr does not say the signal stopped the start:\n%s", stderr.String())
			}
		})
	}
}
