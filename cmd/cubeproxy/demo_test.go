package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Settings the demo cannot run with are refused with a message, not a
// panic, and leave no listener behind.
func TestDemoRefusesUnusableSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// Its curl commands need the plain HTTP listener.
		{"no http listener", []string{"--http-addr=", "--https-addr=127.0.0.1:0"}, "demo needs http_addr"},
		// Its route goes into the memory store.
		{"redis store", []string{"--store=redis", "--redis-addr=127.0.0.1:1"}, "demo needs store: memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := freeAddr(t)
			args := append([]string{"demo", "--http-addr", "127.0.0.1:0", "--admin-addr", admin, "--routes="}, tc.args...)
			var out, errb bytes.Buffer
			// Bounded: a demo that wrongly starts runs until cancelled.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if code := run(ctx, args, noEnv, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errb.String(), tc.want)
			}
			ln, err := net.Listen("tcp", admin)
			if err != nil {
				t.Fatalf("admin listener left open: %v", err)
			}
			ln.Close()
		})
	}
}

// The printed commands reach the listeners on the addresses they were
// given, not only when those are on 127.0.0.1 or every interface.
func TestDemoPrintsListenerAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, httpAddr, want string
	}{
		{"every interface", ":0", "http://127.0.0.1:"},
		{"one loopback address", "127.0.0.2:0", "http://127.0.0.2:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &syncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"demo", "--http-addr", tc.httpAddr, "--admin-addr", "127.0.0.1:0", "--routes="}, noEnv, out, io.Discard)
			}()
			testenv.WaitFor(t, 10*time.Second, "the demo's instructions", func() bool { return strings.Contains(out.String(), "curl -s http") })
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("demo exit %d", code)
			}
			var curl string
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(line, "curl -N http") {
					curl = line
					break
				}
			}
			if !strings.Contains(curl, tc.want) {
				t.Fatalf("SSE command %q, want it to name %s...", curl, tc.want)
			}
		})
	}
}
