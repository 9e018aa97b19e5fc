package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// stdoutFIFO is a binary's stdout and stderr: a FIFO the test reads when
// it chooses, and fills (through an open of its own, non-blocking) to
// stall the binary's next write, as a log driver that stopped reading.
type stdoutFIFO struct {
	path  string
	r     *bufio.Reader
	rf    *os.File
	mu    sync.Mutex
	lines []string // read so far, NUL filler removed
}

// startWithFIFO starts bin with its stdout and stderr on a new FIFO.
func startWithFIFO(t *testing.T, bin string, args ...string) (*exec.Cmd, *stdoutFIFO, <-chan error) {
	t.Helper()
	f := &stdoutFIFO{path: testenv.Mkfifo(t, t.TempDir(), "stdout")}
	rf, err := os.OpenFile(f.path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rf.Close() })
	f.rf, f.r = rf, bufio.NewReaderSize(rf, 1<<20)
	wf, err := os.OpenFile(f.path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = wf, wf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	wf.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, f, exited
}

// readUntil reads lines until one satisfies match (true) or the output
// ends or stalls for d (false).
func (f *stdoutFIFO) readUntil(d time.Duration, match func(line string) bool) bool {
	f.rf.SetReadDeadline(time.Now().Add(d))
	for {
		b, err := f.r.ReadBytes('\n')
		if len(b) > 0 {
			line := strings.TrimRight(string(bytes.TrimLeft(b, "\x00")), "\n")
			f.mu.Lock()
			f.lines = append(f.lines, line)
			f.mu.Unlock()
			if match(line) {
				return true
			}
		}
		if err != nil {
			return false
		}
	}
}

func (f *stdoutFIFO) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.lines, "\n")
}

// msgOf returns a JSON log line's msg ("" for another line).
func msgOf(line string) string {
	var l struct {
		Msg string `json:"msg"`
	}
	_ = json.Unmarshal([]byte(line), &l)
	return l.Msg
}

// The real binary whose stdout (the process log's and the access log's)
// is a pipe nobody reads, as behind a stalled Docker log driver or
// journald: a request whose handling logs a warning is still answered at
// once, the accept loop still accepts while it logs, and once the pipe is
// read again the lost lines are reported and counted. The process log
// wrote synchronously: the 508 below waited for the reader (more than 3 s
// in the review's run), and a refusal over client.max_conns stopped the
// listener accepting.
func TestBinaryProcessLogNeverBlocks(t *testing.T) {
	bin := buildBinary(t)
	// "/hold" is answered once the test releases it: a connection
	// busy with it is one the proxy never closes to make room.
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	})
	routes := boxRoutes(t, t.TempDir(), port)
	cmd, out, exited := startWithFIFO(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", routes, "--client-max-conns", "2", "--drain-timeout", "1s")
	var proxyAddr, adminAddr string
	if !out.readUntil(30*time.Second, func(line string) bool {
		var ok bool
		proxyAddr, adminAddr, ok = listeningAddrs(line)
		return ok
	}) {
		t.Fatalf("no listening line\n%s", out)
	}
	_, proxyPort, _ := net.SplitHostPort(proxyAddr)
	admin := &http.Client{Timeout: 5 * time.Second}
	adminDo := func(method, path, body string) error {
		req, _ := http.NewRequest(method, "http://"+adminAddr+path, strings.NewReader(body))
		resp, err := admin.Do(req)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s %s: %d", method, path, resp.StatusCode)
		}
		return nil
	}
	// A route pointing at the proxy's own listener: answered 508, with a warning.
	if err := adminDo("PUT", "/admin/routes/loop", fmt.Sprintf(`{"HostIP":"127.0.0.1","%[1]s":"%[1]s"}`, proxyPort)); err != nil {
		t.Fatal(err)
	}
	if !out.readUntil(5*time.Second, func(line string) bool { return msgOf(line) == "admin: route stored" }) {
		t.Fatalf("no audit line for the route\n%s", out)
	}

	// From here on nobody reads, and the pipe is full.
	testenv.FillFIFO(t, out.path)

	// do sends one request on a new connection and returns its status
	// (0: no answer within 2 s).
	do := func(host string) (int, time.Duration) {
		t.Helper()
		start := time.Now()
		c, err := net.DialTimeout("tcp", proxyAddr, 2*time.Second)
		if err != nil {
			return 0, time.Since(start)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, time.Since(start)
		}
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	box := fmt.Sprintf("%d-box.cube.test", port)
	if code, took := do(proxyPort + "-loop.cube.test"); code != 508 {
		t.Errorf("request logging a warning with stdout stalled: status %d after %v, want 508 at once", code, took.Round(time.Millisecond))
	}

	// The accept loop logs when it refuses a connection over
	// client.max_conns (2: the 508 above took two, the client's and the
	// proxy's own dial). Two connections are admitted first, each busy
	// with a request the sandbox holds (the close of those before may not
	// be counted yet).
	var held []net.Conn
	for range 2 {
		testenv.WaitFor(t, 5*time.Second, "a connection admitted under client.max_conns", func() bool {
			c, err := net.Dial("tcp", proxyAddr)
			if err != nil {
				return false
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /hold HTTP/1.1\r\nHost: %s\r\n\r\n", box)
			refused := make(chan struct{})
			go func() {
				// Before the release, only a refusal ends this read.
				_, _ = http.ReadResponse(bufio.NewReader(c), nil)
				close(refused)
			}()
			select {
			case <-arrived:
				held = append(held, c)
				return true
			case <-refused:
				c.Close()
				return false
			}
		})
	}
	if code, took := do(box); code != 503 {
		t.Errorf("connection over client.max_conns with stdout stalled: status %d after %v, want 503 at once", code, took.Round(time.Millisecond))
	}
	// Released, the held connections wait for their next request: a new
	// client takes the place of one, and the accept loop logs that too.
	releaseAll()
	testenv.WaitFor(t, 5*time.Second, "a new connection served after the refusal", func() bool {
		code, _ := do(box)
		return code == 200
	})
	for _, c := range held {
		c.Close()
	}

	// Lines beyond the queue's budget are lost: audit lines of the admin
	// API, a few hundred bytes each, until far more than it holds.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1500 {
				if err := adminDo("POST", "/admin/backend_cache/delete", fmt.Sprintf(`{"sandbox_id":"flood-%d-%d"}`, w, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("admin request with stdout stalled: %v", err)
	}
	if n := scrapeMetric(adminAddr, "cubeproxy_process_log_dropped_total"); n < 1 {
		t.Errorf("cubeproxy_process_log_dropped_total = %v with stdout stalled, want > 0", n)
	}

	// Read again: the backlog comes out, then the report of the loss.
	if !out.readUntil(10*time.Second, func(line string) bool {
		return msgOf(line) == "process log lines were lost: its output did not take them in time or failed"
	}) {
		t.Fatalf("no report of the lost lines 10 s after the pipe was read again\n%s", out)
	}
	sigtermAndWait(t, cmd, exited, out)
	out.readUntil(5*time.Second, func(string) bool { return false })
	lines := strings.Split(out.String(), "\n")
	if last := msgOf(lines[len(lines)-1]); last != "stopped" {
		t.Errorf("last line %q, want the stopped line\n%s", lines[len(lines)-1], out)
	}
}

// With stdout read as usual, every line of the process log arrives, in
// order, and so do the last ones before the process exits: the lines
// queued when serve returns (the final "stopped", a startup warning before
// the error that ends the start) are written before it exits.
func TestBinaryProcessLogKeepsEveryLine(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// 500 unknown CUBEPROXY_ variables: one warning each at startup,
	// sorted by name.
	var env []string
	for i := range 500 {
		env = append(env, fmt.Sprintf("CUBEPROXY_ZZ_%04d=1", i))
	}
	missing := t.TempDir() + "/missing.yaml"
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		stop     bool   // SIGTERM once listening
		wantExit int    // exit status
		wantLast string // the last process log line's msg
	}{
		{"serve and stop", []string{"--routes", missing, "--http-addr", "127.0.0.1:0"}, env, true, 0, "stopped"},
		{"startup error", []string{"--routes", missing, "--http-addr", busy.Addr().String()}, nil, false, 1, "routes file not found; starting with an empty routing table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--admin-addr", "127.0.0.1:0", "--drain-timeout", "1s"}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			logs := new(syncBuffer)
			cmd.Stdout, cmd.Stderr = logs, logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			if tc.stop {
				waitListening(t, logs, exited)
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				t.Fatalf("still running after 10 s\n%s", logs)
			}
			if got := cmd.ProcessState.ExitCode(); got != tc.wantExit {
				t.Fatalf("exit status %d, want %d\n%s", got, tc.wantExit, logs)
			}
			var msgs []string
			next := 0 // the next unknown variable's warning expected
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var l struct{ Msg, Name string }
				if json.Unmarshal([]byte(line), &l) != nil {
					continue // the error on stderr
				}
				msgs = append(msgs, l.Msg)
				if l.Msg == "unknown CUBEPROXY_ variable ignored" {
					if want := fmt.Sprintf("CUBEPROXY_ZZ_%04d", next); l.Name != want {
						t.Fatalf("warning %d names %s, want %s", next, l.Name, want)
					}
					next++
				}
			}
			if next != len(tc.env) {
				t.Errorf("%d warnings of unknown variables, want %d\n%s", next, len(tc.env), logs)
			}
			if len(msgs) == 0 || msgs[len(msgs)-1] != tc.wantLast {
				t.Errorf("process log messages end with %q, want %q\n%s", msgs[max(0, len(msgs)-3):], tc.wantLast, logs)
			}
			if tc.wantExit != 0 && !strings.Contains(logs.String(), `cubeproxy: http_addr "`) {
				t.Errorf("no startup error on stderr\n%s", logs)
			}
		})
	}
}

// fdFlags returns the flags of pid's descriptor fd, from /proc.
func fdFlags(t *testing.T, pid, fd int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no flags in fdinfo %d of %d:\n%s", fd, pid, b)
	return 0
}

// A stdout that is stderr's pipe too (2>&1, systemd's StandardError=
// inherit) stays blocking: the Go runtime writes a crash's report to
// stderr, and in non-blocking mode a report that found the pipe full was
// lost (a goroutine dump sent into a stalled pipe: 0.5 of 27 KB arrived
// once it was read again). With stderr apart, stdout is made non-blocking
// (proclog.Pollable) and the dump waits for the reader as before.
func TestBinaryCrashReportWaitsForAStdoutSharedWithStderr(t *testing.T) {
	// Parallel: it waits on a child process of its own (signals go to the
	// child), on ports picked by the kernel.
	t.Parallel()
	bin := buildBinary(t)
	routes := boxRoutes(t, t.TempDir(), 1)
	cmd, out, exited := startWithFIFO(t, bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", routes, "--drain-timeout", "1s")
	if !out.readUntil(30*time.Second, func(line string) bool { _, _, ok := listeningAddrs(line); return ok }) {
		t.Fatalf("no listening line\n%s", out)
	}
	if f := fdFlags(t, cmd.Process.Pid, 1); f&syscall.O_NONBLOCK != 0 {
		t.Errorf("stdout shared with stderr has flags %#o: non-blocking, where the runtime writes its crash reports", f)
	}
	testenv.FillFIFO(t, out.path)
	// SIGQUIT: the runtime's dump of every goroutine, to stderr, then exit.
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	// Nobody reads until the dump waits in write(2) for the reader, or the
	// process is gone (a dump that met EAGAIN is lost, and it exits).
	gone := false
	testenv.WaitFor(t, 20*time.Second, "the dump waiting for the reader, or the exit", func() bool {
		select {
		case <-exited:
			gone = true
			return true
		default:
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", cmd.Process.Pid))
		for _, task := range tasks {
			if b, _ := os.ReadFile(task); strings.Contains(string(b), "pipe_write") {
				return true
			}
		}
		return false
	})
	// Read to the end (the exit closes the pipe): the dump starts with the
	// signal's name and ends with the registers, gs on amd64, fault on arm64.
	out.readUntil(20*time.Second, func(string) bool { return false })
	if !gone {
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			t.Fatal("no exit after the SIGQUIT dump")
		}
	}
	all := strings.TrimSpace(out.String())
	lines := strings.Split(all, "\n")
	if last := lines[len(lines)-1]; !strings.Contains(all, "SIGQUIT: quit") || !strings.HasPrefix(last, "gs ") && !strings.HasPrefix(last, "fault ") {
		t.Errorf("the goroutine dump sent into the full pipe did not arrive whole once read (exited before the read: %v)\n%s", gone, out)
	}

	// stderr apart: stdout is the poller's.
	other, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	apart := exec.Command(bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes)
	apart.Stdout, apart.Stderr = w, other
	if err := apart.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer apart.Process.Kill()
	sc := bufio.NewScanner(r)
	for ok := false; !ok && sc.Scan(); {
		_, _, ok = listeningAddrs(sc.Text())
	}
	go io.Copy(io.Discard, r)
	if f := fdFlags(t, apart.Process.Pid, 1); f&syscall.O_NONBLOCK == 0 {
		t.Errorf("stdout apart from stderr has flags %#o, want non-blocking (served by the poller)", f)
	}
	apart.Process.Signal(syscall.SIGTERM)
	apart.Wait()
}
