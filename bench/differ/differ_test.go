package main

import (
	"os/exec"
	"testing"
)

// TestLabAgreesWithPlatformNginx runs the whole corpus, as `go run
// ./bench/differ` does, so that a change that makes CubeProxy answer
// differently from the platform's nginx where no documented reason says it
// may fails CI, not the next hand run of the lab. Every difference the
// corpus expects carries its reason; an unexpected one, or a lab that cannot
// start nginx or the proxy, fails the test (make test installs nginx).
func TestLabAgreesWithPlatformNginx(t *testing.T) {
	if _, err := exec.LookPath(nginxPath()); err != nil {
		t.Fatalf("the lab compares with nginx, which is not installed (make test installs it; apt-get install -y nginx): %v", err)
	}
	// The lab reads configs/bench and builds ./cmd/cubeproxy from the
	// repository root.
	t.Chdir("../..")
	if code := lab("", "", false, false); code != 0 {
		t.Fatalf("differ exited %d: the output above names each case that differs from nginx", code)
	}
}
