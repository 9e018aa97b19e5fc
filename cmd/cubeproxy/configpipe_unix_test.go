//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
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
			// template renderer still running.
			w := openPipeWriter(t, fifo, 10*time.Second)
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

// TestBinarySurvivesSIGHUPDuringStart: logrotate's SIGHUP may come while
// the binary still starts (here: waiting for its configuration from a
// named pipe, as a template renderer feeds it), before serve watches
// SIGHUP to reopen the access log. Go's default for a SIGHUP nobody
// watches is to exit, which would leave the node without its proxy after
// a log rotation; main ignores it until serve watches it, and the start
// goes on.
func TestBinarySurvivesSIGHUPDuringStart(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	fifo := testenv.Mkfifo(t, dir, "cubeproxy.yaml")
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, logs, exited := startBinary(t, bin, "serve", "--config", fifo, "--routes", routes,
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--drain-timeout", "1s")

	// Once open, the binary is past main's start, before serve's.
	w := openPipeWriter(t, fifo, 30*time.Second)
	defer w.Close()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// Killed by the signal, the binary is gone before it reads: the write
	// fails (EPIPE) or the wait below sees the exit.
	if _, err := w.WriteString("log_level: info\n"); err != nil {
		t.Fatalf("writing the configuration after SIGHUP: %v (the binary died of it?)\n%s", err, logs)
	}
	w.Close()
	waitListening(t, logs, exited)
	sigtermAndWait(t, cmd, exited, logs)
}

// openPipeWriter opens the named pipe fifo for writing, waiting up to d
// for the command under test to open it for reading: a non-blocking open
// for writing fails until it has.
func openPipeWriter(t *testing.T, fifo string, d time.Duration) *os.File {
	t.Helper()
	var w *os.File
	testenv.WaitFor(t, d, "the command to open the config pipe", func() bool {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return false
		}
		w = f
		return true
	})
	return w
}
