package main

import (
	"context"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestInteropLab runs bench/interop/run.sh: curl, Node's fetch, the npm
// eventsource and ws packages and Python's http.client against one node
// sandbox, directly and through CubeProxy, over HTTP and TLS. It runs under
// make test because a lab run by hand goes stale unseen: a node update
// changed one scenario's direct answer, and the lab stayed red until someone
// ran it. A missing tool fails the test (make test installs node, npm,
// python3, curl and openssl when missing).
func TestInteropLab(t *testing.T) {
	for _, tool := range []string{"bash", "flock", "node", "npm", "python3", "curl", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the interop lab needs %s: %v", tool, err)
		}
	}
	// The lab must be ended by this test, not by the test binary's -timeout:
	// that panic exits without cancelling anything, and the lab's sandbox
	// and proxy would keep its fixed ports, so every later run on the
	// machine would fail. So the lab's own deadline comes first.
	deadline := time.Now().Add(5 * time.Minute)
	if d, ok := t.Deadline(); ok {
		margin := min(30*time.Second, time.Until(d)/2)
		if d := d.Add(-margin); d.Before(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "interop/run.sh")
	// Its own process group, ended whole: a timeout that killed bash alone
	// left the node sandbox and the proxy running. SIGTERM first, so that
	// run.sh's exit trap removes its work dir; SIGKILL for what is left.
	// Pdeathsig covers a test binary that dies anyway (a panic elsewhere in
	// the package, a kill); it is sent when the thread that started bash
	// exits, so that thread stays locked to this goroutine until the end.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = groupAttr()
	cmd.Cancel = func() error {
		pgid := cmd.Process.Pid
		err := syscall.Kill(-pgid, syscall.SIGTERM)
		time.AfterFunc(5*time.Second, func() { syscall.Kill(-pgid, syscall.SIGKILL) })
		return err
	}
	// The pipes stay open while any child holds them; WaitDelay bounds the
	// wait for them.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("interop/run.sh did not finish by %s (ended: %v)\n%s", deadline.Format(time.TimeOnly), err, out)
	}
	if err != nil {
		t.Fatalf("interop/run.sh: %v (a DIFFERS line names the scenario; bench/README.md, Other clients)\n%s", err, out)
	}
}
