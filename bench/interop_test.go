package main

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestInteropLab runs bench/interop/run.sh: curl, Node's fetch, the npm
// eventsource and ws packages and Python's http.client against one node
// sandbox, directly and through CubeProxy, over HTTP and TLS. It runs under
// make test because a lab run by hand goes stale unseen: a node update
// changed one scenario's direct answer, and the lab stayed red until someone
// ran it. A missing tool fails the test (make test installs node and npm;
// python3, curl and openssl come with the machine).
func TestInteropLab(t *testing.T) {
	for _, tool := range []string{"bash", "flock", "node", "npm", "python3", "curl", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the interop lab needs %s: %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "interop/run.sh")
	// run.sh kills what it started on its way out; a timeout kills bash
	// only, so WaitDelay bounds the wait for the pipes its children hold.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("interop/run.sh: %v (a DIFFERS line names the scenario; bench/README.md, Other clients)\n%s", err, out)
	}
}
