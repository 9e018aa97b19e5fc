package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// syncBuffer collects a process log written from many goroutines.
type syncBuffer = testenv.LogBuffer

// running is the whole program, started in-process by runServe.
type running struct {
	a    *app
	logs *syncBuffer // its process log (stdout and stderr)
	stop func()      // cancel serve and wait for it; idempotent, also run at cleanup
}

// runServe starts serve(args) and waits until its listeners are open. The
// test fails if serve errors, is not ready in time, or does not return
// cleanly when stopped; the log is printed when the test failed.
func runServe(t *testing.T, args []string, getenv func(string) string) *running {
	t.Helper()
	return runServeTo(t, args, getenv, nil)
}

// runServeTo is runServe with stdout given (nil: the log buffer, as
// runServe); stderr still goes to the log buffer.
func runServeTo(t *testing.T, args []string, getenv func(string) string, stdout io.Writer) *running {
	t.Helper()
	return runServeWith(t, args, getenv, stdout, nil)
}

// runServeWith is runServeTo with tune, when not nil, run on the app in
// serve's own listening callback: before serving, without a race.
func runServeWith(t *testing.T, args []string, getenv func(string) string, stdout io.Writer, tune func(*app)) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{logs: &syncBuffer{}}
	if stdout == nil {
		stdout = r.logs
	}
	ready := make(chan *app, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, args, getenv, stdout, r.logs, func(a *app) {
			if tune != nil {
				tune(a)
			}
			ready <- a
		})
	}()
	select {
	case r.a = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve %v: %v\n%s", args, err, r.logs)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("serve not ready after 60s\n%s", r.logs)
	}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("serve did not return 10s after cancel")
			}
		})
	}
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("proxy log:\n%s", r.logs)
		}
	})
	return r
}

// shortFlush gives close a 500 ms budget for the access log and
// telemetry instead of 5 s (runServeWith): a test of a sink that stays
// stalled waits out the whole budget, which is not what it checks.
func shortFlush(a *app) { a.flushBudget = 500 * time.Millisecond }

// listeningAddrs parses the "cubeproxy listening" line of a process log
// (JSON) and returns the traffic and admin addresses it names; ok is false
// until the line is there. A binary started on 127.0.0.1:0 tells its
// ports this way: a port picked by the test, closed, and handed to the
// binary could be taken by another socket of the machine meanwhile.
func listeningAddrs(log string) (http, admin string, ok bool) {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Msg   string `json:"msg"`
			HTTP  string `json:"http"`
			Admin string `json:"admin"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "cubeproxy listening" {
			return l.HTTP, l.Admin, true
		}
	}
	return "", "", false
}

// waitListening waits until a started binary logged its listeners, and
// returns their addresses.
func waitListening(t *testing.T, logs fmt.Stringer, exited <-chan error) (http, admin string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if h, a, ok := listeningAddrs(logs.String()); ok {
			return h, a
		}
		select {
		case err := <-exited:
			t.Fatalf("exited before listening: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listening after 30s\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freeAddr is a loopback address nothing listens on, for a moment only:
// any socket of the machine may bind it next. Use it only where a test
// must name a port before the proxy binds it, and say there how a clash
// is handled; elsewhere listen on 127.0.0.1:0 (or testenv.RefusingAddr
// for an address that must refuse).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// built is the cubeproxy binary the process tests share: built once per
// test binary, in a directory TestMain removes. Each test used to build its
// own: eight links of the whole program, 15-40 s each on a loaded 2-core
// machine, were a large part of this package's share of go test's timeout.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
}

func TestMain(m *testing.M) {
	flag.Parse()
	// A run of the whole package (no -run, no -list) starts the build at
	// once, beside the serial tests: the first test to need the binary
	// waited for all of it (5-15 s of a link), and did so in the serial
	// phase, as one of the serial tests needs it. A run of a few tests
	// builds only if one of them asks.
	prebuilt := make(chan struct{})
	if flag.Lookup("test.run").Value.String() == "" && flag.Lookup("test.list").Value.String() == "" {
		go func() {
			defer close(prebuilt)
			built.once.Do(buildShared)
		}()
	} else {
		close(prebuilt)
	}
	code := m.Run()
	<-prebuilt // the build may still write into built.dir
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildShared builds cubeproxy into a new directory (built), once per test binary.
func buildShared() {
	if built.dir, built.err = os.MkdirTemp("", "cubeproxy-test-bin-"); built.err != nil {
		return
	}
	built.bin = filepath.Join(built.dir, "cubeproxy")
	built.out, built.err = exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput()
}

// buildBinary returns cubeproxy built for a test that runs it as a process.
func buildBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(buildShared)
	if built.err != nil {
		t.Fatalf("build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// startBinary starts bin with args, its output in logs; exited gets
// cmd.Wait's result. The process is killed when the test ends.
func startBinary(t *testing.T, bin string, args ...string) (cmd *exec.Cmd, logs *syncBuffer, exited <-chan error) {
	t.Helper()
	return startBinaryEnv(t, bin, nil, args...)
}

// startBinaryEnv is startBinary with env (KEY=value) added to the test's
// environment, for a variable the test process itself must not see:
// net/http reads the proxy variables once per process, for good.
func startBinaryEnv(t *testing.T, bin string, env []string, args ...string) (cmd *exec.Cmd, logs *syncBuffer, exited <-chan error) {
	t.Helper()
	cmd = exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...) // the last of a name wins
	}
	logs = new(syncBuffer)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, logs, done
}

// sigtermAndWait stops a started binary with SIGTERM and wants a clean exit
// (exited gets cmd.Wait's result) within 10 s.
func sigtermAndWait(t *testing.T, cmd *exec.Cmd, exited <-chan error, logs fmt.Stringer) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("process still running 10s after SIGTERM")
	}
}

// sandboxServer serves h on a loopback port, as a sandbox's server, until
// the test ends (after the proxies it started stop), and returns the port.
func sandboxServer(t *testing.T, h http.HandlerFunc) int {
	t.Helper()
	srv := &http.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// boxRoutes writes a routes file in dir with one sandbox, "box", whose
// port is served on 127.0.0.1:port, and returns its path.
func boxRoutes(t *testing.T, dir string, port int) string {
	t.Helper()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, fmt.Appendf(nil, "routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"%[1]d\": \"%[1]d\"\n", port), 0o600); err != nil {
		t.Fatal(err)
	}
	return routes
}
