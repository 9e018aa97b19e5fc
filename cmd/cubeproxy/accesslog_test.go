package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// cubeLines returns the x_cube_request_id (field 20 of 22) of every cube
// line in path; it fails on a line that is not 22 fields.
func cubeLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read access log: %v", err)
	}
	var ids []string
	for _, ln := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if ln == "" {
			continue
		}
		f := strings.Split(ln, "||")
		if len(f) != 22 {
			t.Fatalf("%s: line with %d fields, want 22: %q", path, len(f), ln)
		}
		if f[11] != "200" {
			t.Errorf("%s: status %q in %q", path, f[11], ln)
		}
		ids = append(ids, f[19])
	}
	return ids
}

// The access log file is reopened on SIGHUP: after logrotate's rename and
// the signal, the next request's line lands in a new file at the
// configured path and the renamed file keeps the old lines. The routes
// file is not read again (README, Routes: routes change at runtime through
// the admin API): a sandbox added to it before the signal stays unknown.
//
// SIGUSR1, nginx's "reopen the log files" and what the logrotate files of
// the nginx and OpenResty packages send, reopens it too: ignored, it left
// the proxy writing to the renamed file for good (logrotate create with
// `kill -USR1`, five rotations: all 20,000 lines in the first renamed
// file, the live one empty), which logrotate deletes `rotate` rotations
// later. It is no reload signal: unlike SIGHUP it reads no configuration
// file, so says nothing of one that changed.
func TestAccessLogReopenOnSignal(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1} {
		t.Run(name, func(t *testing.T) { testAccessLogReopenOn(t, sig) })
	}
}

// testAccessLogReopenOn rotates the access log by rename and sig.
func testAccessLogReopenOn(t *testing.T, sig syscall.Signal) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))

	dir := t.TempDir()
	routes := boxRoutes(t, dir, port)
	logPath := filepath.Join(dir, "access.log")
	rotated := logPath + ".1"
	conf := filepath.Join(dir, "cubeproxy.yaml")
	if err := os.WriteFile(conf, []byte("drain_timeout: 2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	r := runServe(t, []string{"--config", conf, "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-format", "cube", "--access-log-path", logPath}, noEnv)
	a, logs := r.a, r.logs
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(id string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		req.Header.Set("X-Cube-Request-Id", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %s: %d %q", id, resp.StatusCode, body)
		}
	}
	has := func(path, id string) bool {
		b, _ := os.ReadFile(path)
		return bytes.Contains(b, []byte("||"+id+"||"))
	}

	get("before-rotate")
	testenv.WaitFor(t, 5*time.Second, "first line in the access log", func() bool { return has(logPath, "before-rotate") })
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	added := fmt.Sprintf("routes:\n  box:\n    HostIP: \"127.0.0.1\"\n    \"%[1]d\": \"%[1]d\"\n  late:\n    HostIP: \"127.0.0.1\"\n    \"%[1]d\": \"%[1]d\"\n", port)
	if err := os.WriteFile(routes, []byte(added), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("drain_timeout: 3s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, `"access log reopened" in the logs`, func() bool {
		return strings.Contains(logs.String(), `"msg":"access log reopened"`)
	})
	get("after-rotate")
	testenv.WaitFor(t, 5*time.Second, "second line in the new access log", func() bool { return has(logPath, "after-rotate") })

	if ids := cubeLines(t, rotated); len(ids) != 1 || ids[0] != "before-rotate" {
		t.Errorf("rotated file holds %q, want only before-rotate", ids)
	}
	if ids := cubeLines(t, logPath); len(ids) != 1 || ids[0] != "after-rotate" {
		t.Errorf("new file holds %q, want only after-rotate", ids)
	}

	req, _ := http.NewRequest("GET", "http://"+a.httpLn.Addr().String()+"/", nil)
	req.Host = fmt.Sprintf("%d-late.cube.test", port)
	req.Header.Set("X-Cube-Request-Id", "late")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"sandbox_not_found"`) {
		t.Fatalf("sandbox added to the routes file before SIGHUP: %d %q, want 404 sandbox_not_found (%v must not reload routes)", resp.StatusCode, body, sig)
	}

	r.stop()
	said := strings.Contains(logs.String(), `"msg":"SIGHUP: the configuration file changed since start`)
	if want := sig == syscall.SIGHUP; said != want {
		t.Errorf("%v: the configuration file's change said %v, want %v:\n%s", sig, said, want, logs)
	}
}

// logrotate does not wait for a drain: a SIGHUP or SIGUSR1 during one
// reopens the access log as at any other time, so the line of a response
// the drain still serves lands in the new file. Unheard (as it once
// was), the signal left every line of the drain in the
// renamed file, which a logrotate compress without delaycompress deletes,
// and no file at the configured path.
func TestAccessLogReopenDuringDrain(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1} {
		t.Run(name, func(t *testing.T) { testAccessLogReopenDuringDrain(t, sig) })
	}
}

// testAccessLogReopenDuringDrain rotates the access log by rename and sig
// while the drain waits for a response still being sent.
func testAccessLogReopenDuringDrain(t *testing.T, sig syscall.Signal) {
	release := make(chan struct{})
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/held" {
			io.WriteString(w, "ok")
			return
		}
		io.WriteString(w, "part;")
		w.(http.Flusher).Flush()
		select {
		case <-release:
			io.WriteString(w, "rest")
		case <-r.Context().Done():
		}
	}))
	dir := t.TempDir()
	logPath := filepath.Join(dir, "access.log")
	rotated := logPath + ".1"
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", boxRoutes(t, dir, port),
		"--access-log-format", "cube", "--access-log-path", logPath, "--drain-timeout", "20s"}, noEnv)
	get := func(path, id string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+path, nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		req.Header.Set("X-Cube-Request-Id", id)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/", "before-drain")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	held := get("/held", "in-drain")
	defer held.Body.Close()
	part := make([]byte, len("part;"))
	if _, err := io.ReadFull(held.Body, part); err != nil {
		t.Fatalf("the held response's first part: %v", err)
	}
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	testenv.WaitFor(t, 10*time.Second, "the drain", func() bool { return strings.Contains(r.logs.String(), `"msg":"shutting down: draining"`) })
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, `"access log reopened" during the drain`, func() bool {
		return strings.Contains(r.logs.String(), `"msg":"access log reopened"`)
	})
	close(release)
	if rest, err := io.ReadAll(held.Body); err != nil || string(rest) != "rest" {
		t.Fatalf("the held response's rest: %q %v", rest, err)
	}
	<-stopped

	if ids := cubeLines(t, rotated); len(ids) != 1 || ids[0] != "before-drain" {
		t.Errorf("rotated file holds %q, want only before-drain", ids)
	}
	if ids := cubeLines(t, logPath); len(ids) != 1 || ids[0] != "in-drain" {
		t.Errorf("new file holds %q, want only in-drain", ids)
	}
}

// logrotate's create mode, with the SIGHUP of its postrotate, loses no
// line while requests keep coming: the lines queued before the reopen go
// to the renamed file, every later one to the new file (what the README
// tells operators to use rather than copytruncate, which loses the lines
// written between its copy and its truncate).
func TestAccessLogRotationUnderLoadLosesNoLine(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	dir := t.TempDir()
	routes := boxRoutes(t, dir, port)
	logPath := filepath.Join(dir, "access.log")
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-format", "cube", "--access-log-path", logPath, "--drain-timeout", "2s"}, noEnv)

	const clients = 2
	sent := make(chan []string, clients)
	stop := make(chan struct{})
	for c := range clients {
		go func() {
			var ids []string
			client := &http.Client{Timeout: 5 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					sent <- ids
					return
				default:
				}
				id := fmt.Sprintf("c%d-%d", c, i)
				req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
				req.Host = fmt.Sprintf("%d-box.cube.test", port)
				req.Header.Set("X-Cube-Request-Id", id)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request %s: %v", id, err)
					sent <- ids
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ids = append(ids, id)
			}
		}()
	}
	const rotations = 3
	for i := 1; i <= rotations; i++ {
		// Lines in the file before each rotation: the rotation happens
		// under load, not between two quiet moments.
		testenv.WaitFor(t, 5*time.Second, "lines in the access log", func() bool {
			st, err := os.Stat(logPath)
			return err == nil && st.Size() > 0
		})
		if err := os.Rename(logPath, fmt.Sprintf("%s.%d", logPath, i)); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "the reopen", func() bool {
			return strings.Count(r.logs.String(), `"msg":"access log reopened"`) == i
		})
	}
	close(stop)
	want := map[string]bool{}
	for range clients {
		for _, id := range <-sent {
			want[id] = true
		}
	}
	r.stop() // the access log is flushed and closed

	got := map[string]int{}
	for _, path := range []string{logPath, logPath + ".1", logPath + ".2", logPath + ".3"} {
		for _, id := range cubeLines(t, path) {
			got[id]++
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("request %s has %d lines across the rotated files, want 1", id, got[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d requests logged, %d sent", len(got), len(want))
	}
}

// A SIGHUP while the access log's sink is stalled (a pipe nobody reads, a
// hung network file system) must not stop the proxy from draining on
// SIGTERM: the reopen waits for the stalled writer, the shutdown must not.
func TestSIGHUPWithStalledAccessLogStillStops(t *testing.T) {
	// The reader is closed after the directory is removed (cleanups run
	// last first). It used to matter: the shutdown left the stalled writer
	// behind, closing the reader unblocked it, and its pending reopen
	// created the log file (O_CREATE) in the directory RemoveAll was
	// emptying. The shutdown now closes the file under the stalled write,
	// and a reopen waiting at Close is refused.
	// A reader that never reads, and a pipe already full: the access log's
	// first write blocks.
	fifo, _ := testenv.StalledFIFO(t, t.TempDir(), "access.fifo")

	r := runServeWith(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
		"--access-log-path", fifo, "--drain-timeout", "1s"}, noEnv, nil, shortFlush)
	// Two requests: the second is answered only after the first's handler
	// returned, so the first line is queued and the writer is stuck on it.
	client := &http.Client{Timeout: 5 * time.Second}
	for range 2 {
		req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
		req.Host = "50005-nosuch.cube.test"
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// An earlier test's stalled writer may still hold a reopen of its own.
	before := goroutinesIn("accesslog.(*Logger).Reopen")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The signal is asynchronous: wait until the reopen it asked for is
	// stuck behind the stalled writer, then do what SIGTERM does. stop
	// fails the test if serve does not return.
	testenv.WaitFor(t, 5*time.Second, "a reopen blocked on the stalled sink", func() bool {
		return r.a.reopening.Load()
	})
	// Later SIGHUPs join the waiting reopen: each used to leave one more
	// goroutine behind the stalled writer.
	for i := range 3 {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "the SIGHUP joining the waiting reopen", func() bool {
			return strings.Count(r.logs.String(), "last reopen is still waiting") > i
		})
	}
	if n := goroutinesIn("accesslog.(*Logger).Reopen") - before; n > 1 {
		t.Errorf("%d more goroutines wait in Reopen after four SIGHUPs, want 1", n)
	}
	r.stop()
}

// goroutinesIn counts the goroutines whose stacks have fn in them.
func goroutinesIn(fn string) int {
	n := 0
	for _, g := range testenv.Stacks() {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// The access log's default sink, stdout, is the stdout serve was given, as
// its process log is: an embedder (and these tests) capture both, and
// nothing writes to the process's os.Stdout behind its back.
func TestAccessLogGoesToServesStdout(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer backend.Close()
	port := backend.Listener.Addr().(*net.TCPAddr).Port
	routes := boxRoutes(t, t.TempDir(), port)
	for _, path := range []string{"", "-"} {
		r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
			"--access-log-path=" + path, "--drain-timeout", "1s"}, noEnv)
		req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/stdout-probe", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		r.stop() // flushes the access log
		if !strings.Contains(r.logs.String(), `"uri":"/stdout-probe"`) {
			t.Errorf("access_log.path %q: the request's line is not on serve's stdout:\n%s", path, r.logs)
		}
	}
}

// An access log that cannot be written (a full disk: /dev/full fails every
// write with ENOSPC) is said in the process log, once, besides the counter,
// and so is its end: here the path, a link to /dev/full, is replaced by a
// file and SIGHUP reopens it (a full disk's space freed, or a log deleted
// and reopened, end the same way).
func TestAccessLogLossIsLogged(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer backend.Close()
	port := backend.Listener.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	routes := boxRoutes(t, dir, port)
	logPath := filepath.Join(dir, "access.log")
	if err := os.Symlink("/dev/full", logPath); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-path", logPath, "--drain-timeout", "1s"}, noEnv)
	client := &http.Client{Timeout: 5 * time.Second}
	get := func() {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d with the access log failing", resp.StatusCode)
		}
	}
	for range 3 {
		get()
	}
	testenv.WaitFor(t, 5*time.Second, "the failing access log in the process log", func() bool {
		return strings.Contains(r.logs.String(), `"msg":"access log cannot be written; dropping lines"`)
	})
	if !strings.Contains(r.logs.String(), "no space left on device") {
		t.Errorf("the loss line does not name the error\n%s", r.logs)
	}
	if n := accessLogDropped(r.a.adminLn.Addr().String()); n < 1 {
		t.Errorf("cubeproxy_accesslog_dropped_total = %v, want > 0", n)
	}

	if err := os.Remove(logPath); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, `"access log reopened" in the logs`, func() bool {
		return strings.Contains(r.logs.String(), `"msg":"access log reopened"`)
	})
	get()
	testenv.WaitFor(t, 5*time.Second, "the access log's recovery in the process log", func() bool {
		return strings.Contains(r.logs.String(), `"msg":"access log written again"`)
	})
	if n := strings.Count(r.logs.String(), "access log cannot be written"); n != 1 {
		t.Errorf("the failing access log logged %d times, want once\n%s", n, r.logs)
	}
}

// A SIGHUP whose reopen fails (the log's directory renamed or removed by a
// rotation gone wrong, a full or read-only filesystem) is counted, besides
// the process log's error: an operator alerting on metrics learns that
// the access log still goes to the old file, or to none, and a later
// SIGHUP that succeeds does not count.
func TestAccessLogReopenFailureIsCounted(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	base := t.TempDir()
	routes := boxRoutes(t, base, port)
	dir := filepath.Join(base, "logs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-path", filepath.Join(dir, "access.log"), "--drain-timeout", "1s"}, noEnv)
	admin := r.a.adminLn.Addr().String()
	const failures = "cubeproxy_accesslog_reopen_errors_total"
	if n := scrapeMetric(admin, failures); n != 0 {
		t.Fatalf("%s = %v before any SIGHUP, want 0", failures, n)
	}
	hup := func(want string) {
		t.Helper()
		before := strings.Count(r.logs.String(), want)
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, want+" in the logs", func() bool {
			return strings.Count(r.logs.String(), want) > before
		})
	}
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	hup(`"msg":"reopen access log"`)
	if n := scrapeMetric(admin, failures); n != 1 {
		t.Errorf("%s = %v after a failed reopen, want 1", failures, n)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hup(`"msg":"access log reopened"`)
	if n := scrapeMetric(admin, failures); n != 1 {
		t.Errorf("%s = %v after a reopen that succeeded, want still 1", failures, n)
	}
	r.stop()
}

// logrotate's copytruncate under serve: the truncation is told in the
// process log, with what to rotate with instead, and counted in
// cubeproxy_accesslog_truncations_total, where before both were silent
// and the lines it lost unsaid.
func TestAccessLogTruncationIsSaidAndCounted(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	dir := t.TempDir()
	logPath := filepath.Join(dir, "access.log")
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", boxRoutes(t, dir, port),
		"--access-log-format", "cube", "--access-log-path", logPath, "--drain-timeout", "1s"}, noEnv)
	admin := r.a.adminLn.Addr().String()
	const truncations = "cubeproxy_accesslog_truncations_total"
	if n := scrapeMetric(admin, truncations); n != 0 {
		t.Fatalf("%s = %v before any truncation, want 0", truncations, n)
	}
	req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
	req.Host = fmt.Sprintf("%d-box.cube.test", port)
	req.Header.Set("X-Cube-Request-Id", "before")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	testenv.WaitFor(t, 5*time.Second, "the line written", func() bool {
		b, _ := os.ReadFile(logPath)
		return bytes.Contains(b, []byte("before"))
	})
	if err := os.Truncate(logPath, 0); err != nil { // copytruncate, after its copy
		t.Fatal(err)
	}
	const said = `"msg":"access log file was truncated`
	testenv.WaitFor(t, 5*time.Second, "the truncation told and counted", func() bool {
		return strings.Contains(r.logs.String(), said) && scrapeMetric(admin, truncations) == 1
	})
	r.stop()
	if n := strings.Count(r.logs.String(), said); n != 1 {
		t.Errorf("truncation told %d times, want once", n)
	}
}

// SIGHUP with the access log on stdout reopens nothing, and says so:
// "access log reopened" was logged there too, for a rotation that could
// not have taken effect.
func TestSIGHUPWithStdoutAccessLog(t *testing.T) {
	r := runServe(t, []string{"--config=", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", "",
		"--access-log-path", "-", "--drain-timeout", "1s"}, noEnv)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "SIGHUP answered", func() bool {
		return strings.Contains(r.logs.String(), `"msg":"SIGHUP: the access log writes to stdout: nothing to reopen"`)
	})
	r.stop()
	if strings.Contains(r.logs.String(), `"msg":"access log reopened"`) {
		t.Errorf("logs say the stdout access log was reopened:\n%s", r.logs)
	}
}

// A rotation while the start still waits (here on a paused Redis: the
// start waits one command timeout for it) renames the file the access log
// has just opened. Its signal was dropped until the proxy served, so every
// line went to the renamed file, which logrotate deletes later, until the
// next rotation. It is now queued from the access log's opening and taken
// once serving.
func TestAccessLogRotatedDuringStartIsReopened(t *testing.T) {
	redis := testenv.StartRedis(t)
	redis.Pause()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "access.log")
	rotated := make(chan error, 1)
	go func() {
		// logrotate's create and postrotate, once the access log is open.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, err := os.Stat(logPath); err == nil {
				break
			}
			if time.Now().After(deadline) {
				rotated <- fmt.Errorf("%s not created within 30 s", logPath)
				return
			}
		}
		if err := os.Rename(logPath, logPath+".1"); err != nil {
			rotated <- err
			return
		}
		rotated <- syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	}()
	r := runServe(t, []string{"--config", "", "--store", "redis", "--redis-addr", redis.Addr(), "--redis-command-timeout", "2s",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--access-log-format", "cube", "--access-log-path", logPath}, noEnv)
	select {
	case err := <-rotated:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the proxy served before the access log was rotated: the start did not wait on the paused Redis")
	}
	redis.Resume()
	testenv.WaitFor(t, 5*time.Second, `"access log reopened" in the logs`, func() bool {
		return strings.Contains(r.logs.String(), `"msg":"access log reopened"`)
	})
	req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
	req.Host = "3000-box.elsewhere.test" // refused at once, and logged
	req.Header.Set("X-Cube-Request-Id", "after-start")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.WaitFor(t, 5*time.Second, "the request in the new access log", func() bool {
		b, _ := os.ReadFile(logPath)
		return bytes.Contains(b, []byte("||after-start||"))
	})
}

// A signal that comes while a reopen is under way but has already opened
// the path (a SIGHUP storm, or a second logrotate configuration's
// postrotate just after the first's) must still reopen once more:
// logrotate renamed the file after that open, so the open file is the
// renamed one. Earlier builds joined such a signal to the reopen in
// flight ("it will reopen the file when it runs"), but that reopen had
// run, and every later line went to the renamed file, which logrotate
// deletes `rotate` rotations later. The test holds the first reopen right
// after its open (reopened), renames the file and signals then.
func TestAccessLogSignalDuringReopenReopensAgain(t *testing.T) {
	port := sandboxServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	dir := t.TempDir()
	routes := boxRoutes(t, dir, port)
	logPath := filepath.Join(dir, "access.log")
	rotated := logPath + ".1"

	inWindow := make(chan struct{})
	proceed := make(chan struct{})
	first := true
	r := runServeWith(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--access-log-format", "cube", "--access-log-path", logPath}, noEnv, nil, func(a *app) {
		a.reopened = func() {
			if !first {
				return
			}
			first = false
			inWindow <- struct{}{}
			select {
			case <-proceed:
			case <-time.After(10 * time.Second):
			}
		}
	})
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(id string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		req.Header.Set("X-Cube-Request-Id", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %s: %d", id, resp.StatusCode)
		}
	}
	has := func(path, id string) bool {
		b, _ := os.ReadFile(path)
		return bytes.Contains(b, []byte("||"+id+"||"))
	}

	get("before")
	testenv.WaitFor(t, 5*time.Second, "first line in the access log", func() bool { return has(logPath, "before") })
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	// The first reopen has opened access.log and not yet returned: now
	// logrotate renames it and signals.
	testenv.Recv(t, inWindow, 10*time.Second, "the first reopen done with its open")
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the second signal seen during the first reopen", func() bool {
		return strings.Contains(r.logs.String(), "last reopen is still waiting")
	})
	close(proceed)
	testenv.WaitFor(t, 5*time.Second, "a second reopen", func() bool {
		return strings.Count(r.logs.String(), `"msg":"access log reopened"`) == 2
	})
	get("after")
	testenv.WaitFor(t, 5*time.Second, "the line after the rotation in the new file", func() bool { return has(logPath, "after") })
	if ids := cubeLines(t, rotated); len(ids) != 1 || ids[0] != "before" {
		t.Errorf("rotated file holds %q, want only before", ids)
	}
}
