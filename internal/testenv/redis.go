// Package testenv starts real external components (redis-server, ...) for tests.
package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisTests bounds the tests of a test binary that run at once under
// ParallelRedis.
var redisTests = make(chan struct{}, 4)

// ParallelRedis marks t to run in parallel with the package's other
// parallel tests (t.Parallel), at most four of them at once in the test
// binary, whatever go test's -parallel: each starts its own redis-servers
// (six for a cluster) and mostly waits on them, but sixteen starting
// together under -race stalled lookups and TLS handshakes past their
// deadlines. The slot is given back once t and its cleanups are done.
func ParallelRedis(t *testing.T) {
	t.Parallel()
	redisTests <- struct{}{}
	t.Cleanup(func() { <-redisTests })
}

// installRedisOnce makes a test binary try apt at most once: many tests
// start redis-server, and a failed install must not be retried by each.
var installRedisOnce sync.Once

// redisServerPath returns the redis-server binary, installing it with apt
// when it is missing. A test that needs Redis fails (never skips) without it.
func redisServerPath(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	var out []byte
	var err error
	installRedisOnce.Do(func() {
		// Another test binary may hold the dpkg lock; wait for it instead of failing.
		lock := "-o=DPkg::Lock::Timeout=300"
		if out, err = exec.Command("apt-get", lock, "update").CombinedOutput(); err != nil {
			return
		}
		cmd := exec.Command("apt-get", lock, "install", "-y", "--no-install-recommends", "redis-server")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err = cmd.CombinedOutput()
	})
	p, lerr := exec.LookPath("redis-server")
	if lerr != nil {
		t.Fatalf("redis-server is not installed and apt-get install redis-server failed (%v): %s", err, redisLogTail(out, 2000))
	}
	return p
}

// Redis is one redis-server (or sentinel) process owned by a test.
type Redis struct {
	t        testing.TB
	bin      string
	port     int
	dir      string
	args     []string
	sentinel bool
	password string // from --requirepass, used by Client
	other    int    // the port that stood for AnotherPort, if any

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	client *redis.Client
}

// AnotherPort stands, in the extra args of StartRedis and StartSentinel,
// for a second port (e.g. "--tls-port", testenv.AnotherPort): it is picked
// afresh at each start attempt with the main one, as a port picked by the
// test could be taken before the server binds it; OtherAddr gives it.
const AnotherPort = "{another-port}"

// withOtherPort returns args with AnotherPort replaced by a free port.
func withOtherPort(t testing.TB, args []string) (resolved []string, other int) {
	resolved = slices.Clone(args)
	for i, a := range resolved {
		if a == AnotherPort {
			if other == 0 {
				other = FreePort(t)
			}
			resolved[i] = strconv.Itoa(other)
		}
	}
	return resolved, other
}

// StartRedis starts redis-server on a free loopback port with its own
// temporary directory and no persistence; extra args are appended
// (e.g. "--replicaof", "127.0.0.1", "6380"). Cleanup kills it.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin := redisServerPath(t)
	dir := t.TempDir()
	var lastErr error
	// A free port can be taken by another process between probe and bind
	// (start then fails: its readiness check wants its own child): retry.
	for range 3 {
		port := FreePort(t)
		args, other := withOtherPort(t, args)
		r := &Redis{t: t, bin: bin, port: port, dir: dir, other: other}
		for i, a := range args {
			if a == "--requirepass" && i+1 < len(args) {
				r.password = args[i+1]
			}
		}
		r.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
			"--save", "", "--appendonly", "no", "--daemonize", "no",
		}, args...)
		if lastErr = r.start(); lastErr == nil {
			t.Cleanup(r.cleanup)
			return r
		}
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

// StartReplica starts a redis-server replicating master and waits until the
// replication link is up.
func StartReplica(t testing.TB, master *Redis) *Redis {
	t.Helper()
	// The default 5 s diskless-sync delay would dominate test time.
	if err := master.Client().ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("config set repl-diskless-sync-delay on %s: %v", master.Addr(), err)
	}
	r := StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := r.Client().Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s: link to master %s not up: %v %s", r.Addr(), master.Addr(), err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitReplicated waits until a replica has acknowledged every write made
// to master so far (WAIT 1), for up to 15 s. One WAIT with a short timeout
// is not enough: on a loaded machine the replica may not run in time to
// answer the master's GETACK, although its link is up.
func WaitReplicated(t testing.TB, master *Redis) {
	t.Helper()
	WaitFor(t, 15*time.Second, "a replica to acknowledge the writes (WAIT 1)", func() bool {
		n, err := master.Client().Wait(context.Background(), 1, time.Second).Result()
		return err == nil && n >= 1
	})
}

// StartSentinel starts redis-server --sentinel monitoring masterAddr as
// masterName with quorum 1, a 1 s down-after and a 5 s failover timeout;
// extra args are appended (e.g. "--tls-port", "26380", ...).
func StartSentinel(t testing.TB, masterName, masterAddr string, args ...string) *Redis {
	t.Helper()
	bin := redisServerPath(t)
	host, mport, err := net.SplitHostPort(masterAddr)
	if err != nil {
		t.Fatalf("sentinel master addr %q: %v", masterAddr, err)
	}
	dir := t.TempDir()
	var lastErr error
	for range 3 {
		port := FreePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		// Sentinel rewrites its config file, so it lives in the temp dir.
		if err := os.WriteFile(conf, []byte(sentinelConf(port, dir, masterName, host, mport)), 0o600); err != nil {
			t.Fatalf("write sentinel.conf: %v", err)
		}
		args, other := withOtherPort(t, args)
		r := &Redis{t: t, bin: bin, port: port, dir: dir, other: other, sentinel: true, args: append([]string{conf, "--sentinel"}, args...)}
		if lastErr = r.start(); lastErr == nil {
			t.Cleanup(r.cleanup)
			return r
		}
	}
	t.Fatalf("start redis sentinel: %v", lastErr)
	return nil
}

func sentinelConf(port int, dir, name, host, mport string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n", port, dir, filepath.Join(dir, "sentinel.log"))
	fmt.Fprintf(&b, "sentinel monitor %s %s %s 1\n", name, host, mport)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s 1000\n", name)
	fmt.Fprintf(&b, "sentinel failover-timeout %s 5000\n", name)
	return b.String()
}

// Addr is the server's 127.0.0.1:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port is the server's TCP port.
func (r *Redis) Port() int { return r.port }

// OtherAddr is 127.0.0.1 and the port that stood for AnotherPort in the
// start args.
func (r *Redis) OtherAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.other)) }

// Client returns a go-redis client for this server (created once, closed
// at cleanup; authenticated when started with --requirepass); it reconnects
// by itself after Restart.
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		r.client = redis.NewClient(&redis.Options{Addr: r.Addr(), Password: r.password, Protocol: 2, DisableIdentity: true})
	}
	return r.client
}

// Stop kills the server with SIGKILL (as a crash would) and waits for it to exit.
func (r *Redis) Stop() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

func (r *Redis) signal(sig syscall.Signal) {
	r.t.Helper()
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	if cmd == nil {
		r.t.Fatalf("redis on %s: signal %v: not running", r.Addr(), sig)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("redis on %s: signal %v: %v", r.Addr(), sig, err)
	}
}

// Restart stops the server and starts it again on the same port. Data is
// lost: there is no persistence.
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	var err error
	// The old listening socket is gone at once (SO_REUSEADDR); retry in case a
	// dying connection still holds the port for a moment.
	for range 20 {
		if err = r.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("restart redis on %s: %v", r.Addr(), err)
}

// ResetStats clears INFO commandstats (CONFIG RESETSTAT).
func (r *Redis) ResetStats(t testing.TB) {
	t.Helper()
	if err := r.Client().ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatalf("config resetstat: %v", err)
	}
}

// CommandCount returns how many times the server executed command (lower
// case, e.g. "hgetall") since start or the last ResetStats.
func (r *Redis) CommandCount(t testing.TB, command string) int {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("info commandstats: %v", err)
	}
	n, err := parseCommandCalls(info, command)
	if err != nil {
		t.Fatalf("info commandstats: %v", err)
	}
	return n
}

// parseCommandCalls reads calls=N from the line cmdstat_<command>:calls=N,...
func parseCommandCalls(info, command string) (int, error) {
	prefix := "cmdstat_" + strings.ToLower(command) + ":"
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				return strconv.Atoi(v)
			}
		}
		return 0, fmt.Errorf("no calls= in %q", line)
	}
	return 0, nil
}

// Log returns the server's log file (useful in failure messages).
func (r *Redis) Log() string {
	name := "redis.log"
	if r.sentinel {
		name = "sentinel.log"
	}
	b, _ := os.ReadFile(filepath.Join(r.dir, name))
	return string(b)
}

func (r *Redis) start() error {
	cmd := exec.Command(r.bin, r.args...)
	dieWithTest(cmd)
	var stderr strings.Builder
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", r.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for {
		// The port was free when picked, but another process (another
		// test's redis-server) may have bound it since: our child then
		// exits, and the other answers. Only our child's pid is ready.
		pid, err := redisPID(r.Addr(), r.password)
		if err == nil && pid == cmd.Process.Pid {
			return nil
		}
		if err == nil {
			r.Stop()
			return fmt.Errorf("%s: port %d is served by another process (pid %d, ours %d)", r.bin, r.port, pid, cmd.Process.Pid)
		}
		select {
		case <-exited:
			r.mu.Lock()
			r.cmd = nil
			r.mu.Unlock()
			return fmt.Errorf("%s exited at start: %s %s", r.bin, stderr.String(), redisLogTail([]byte(r.Log()), 2000))
		default:
		}
		if time.Now().After(deadline) {
			r.Stop()
			return fmt.Errorf("%s on %s: no PONG within 10s: %s", r.bin, r.Addr(), redisLogTail([]byte(r.Log()), 2000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *Redis) cleanup() {
	if r.t.Failed() {
		r.t.Logf("log of redis %s:\n%s", r.Addr(), redisLogTail([]byte(r.Log()), 4000))
	}
	r.mu.Lock()
	c := r.client
	r.client = nil
	r.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	r.Stop()
}

// redisPID asks the server on addr for its process_id (INFO server),
// speaking RESP directly so that readiness does not depend on client
// options; it authenticates first when password is set.
func redisPID(addr, password string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	br := bufio.NewReader(c)
	if password != "" {
		if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(password), password); err != nil {
			return 0, err
		}
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if !strings.HasPrefix(line, "+OK") {
			return 0, errors.New("AUTH: " + strings.TrimSpace(line))
		}
	}
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 {
		return 0, errors.New("INFO server: unexpected reply " + strings.TrimSpace(line))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, fmt.Errorf("INFO server: %w", err)
	}
	for l := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server: no process_id")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func redisLogTail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
