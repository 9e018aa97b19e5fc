package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A privileged port the user may not bind (a non-root proxy given
// http_addr :80) is refused by check as serve refuses it, with serve's
// message and what the port needs: check passed it, and the restart
// failed. The real binary runs as nobody (as the test's own user when
// that is not root already).
func TestCheckRefusesPrivilegedPortAsServe(t *testing.T) {
	// Parallel: its children bind nothing (the bind is refused), and it
	// waits on them.
	t.Parallel()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		t.Fatal(err)
	}
	start, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if start < 2 {
		t.Skipf("net.ipv4.ip_unprivileged_port_start is %d: every port can be bound by anyone here", start)
	}
	port := strconv.Itoa(min(start, 1024) - 1)
	bin := binaryForNobody(t)
	runAs := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		return runBounded(t, cmd, strings.Join(args, " "))
	}
	for _, tc := range []struct{ key, flag, addr, other string }{
		{"http_addr", "--http-addr", ":" + port, "--admin-addr=127.0.0.1:0"},
		{"admin_addr", "--admin-addr", "127.0.0.1:" + port, "--http-addr=127.0.0.1:0"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			args := []string{"--routes=", "--access-log-format=off", tc.other, tc.flag, tc.addr}
			want := "cubeproxy: " + tc.key + ` "` + tc.addr + `": listen tcp ` + tc.addr + ": bind: permission denied" +
				" (a port below 1024 needs root or the CAP_NET_BIND_SERVICE capability; or choose a port from 1024 up)" +
				" (" + tc.key + " is set by " + tc.flag + ")\n"
			code, stderr := runAs(append([]string{"serve"}, args...)...)
			if code != 1 || !strings.Contains(stderr, want) {
				t.Fatalf("serve: exit %d, stderr:\n%s\nwant 1 and %q", code, stderr, want)
			}
			code, stderr = runAs(append([]string{"check"}, args...)...)
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("check: exit %d, stderr:\n%s\nwant 1 and serve's %q", code, stderr, want)
			}
		})
	}
}

// The privileged ports end where net.ipv4.ip_unprivileged_port_start
// says, not at 1024: with it raised to 2000, check passed http_addr :1500
// for a non-root user (it probed only ports below 1024), and serve then
// failed on it without saying what the port needs. Run in a network
// namespace of its own (the sysctl is per namespace), as root.
func TestCheckRefusesPortBelowRaisedUnprivilegedStart(t *testing.T) {
	// Parallel: its children bind nothing (the bind is refused, in a
	// network namespace of their own), and it waits on them.
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace with its own net.ipv4.ip_unprivileged_port_start")
	}
	// util-linux, essential on Debian: missing is a failure, not a skip.
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal(err)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatal(err)
	}
	bin := binaryForNobody(t)
	run := func(sub string) (int, string) {
		script := `echo 2000 > /proc/sys/net/ipv4/ip_unprivileged_port_start && exec "$@"`
		cmd := exec.Command(unshare, "-n", "sh", "-c", script, "sh",
			setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
			bin, sub, "--config=", "--routes=", "--access-log-format=off", "--admin-addr=127.0.0.1:0", "--http-addr", ":1500")
		code, stderr := runBounded(t, cmd, sub)
		if strings.Contains(stderr, "ip_unprivileged_port_start: Read-only") {
			t.Skipf("cannot set the sysctl in a new network namespace here:\n%s", stderr)
		}
		return code, stderr
	}
	want := `cubeproxy: http_addr ":1500": listen tcp :1500: bind: permission denied` +
		" (a port below 2000 needs root or the CAP_NET_BIND_SERVICE capability; or choose a port from 2000 up)" +
		" (http_addr is set by --http-addr)\n"
	for _, sub := range []string{"serve", "check"} {
		if code, stderr := run(sub); code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant 1 and %q", sub, code, stderr, want)
		}
	}
}

// runBounded runs cmd (what names it) and returns its exit code and
// stderr; one that has not exited within 30 s fails the test: a start
// that wrongly succeeded runs on.
func runBounded(t *testing.T, cmd *exec.Cmd, what string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("%s did not exit in 30s (a start that wrongly succeeded runs on)\n%s", what, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// binaryForNobody returns the shared test binary, linked into a directory
// nobody (uid 65534) can reach: the shared one's directory is the owner's
// alone, and a build of its own was another link of the whole program, up
// to a minute of the package's share of go test's timeout on a loaded
// 2-core machine.
func binaryForNobody(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "cubeproxy")
	// A hard link, not a copy: a copy this process writes can be inherited,
	// still open for writing, by a child another parallel test forks at
	// that moment, and its exec then fails with ETXTBSY. Both are under
	// os.TempDir, on one file system.
	if err := os.Link(buildBinary(t), bin); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755); err != nil { // whatever the build's umask
		t.Fatal(err)
	}
	return bin
}
