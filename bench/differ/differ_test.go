package main

import (
	"net"
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

// A port taken between freePort's close and nginx's bind (by a client
// connection of another test, say) made nginx exit with "Address already
// in use" and failed the lab; startNginx now tries another port.
func TestNginxStartsOnAnotherPortWhenItsOwnIsTaken(t *testing.T) {
	if _, err := exec.LookPath(nginxPath()); err != nil {
		t.Fatalf("nginx is not installed (make test installs it): %v", err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pick := func() (int, error) {
		picks++
		if picks == 1 {
			return takenPort, nil
		}
		return freePort()
	}
	work := t.TempDir()
	t.Chdir("../..")
	addr, stop, err := startNginx(work, 1, pick)
	if err != nil {
		t.Fatalf("startNginx with its first port taken: %v", err)
	}
	defer stop()
	if picks != 2 {
		t.Errorf("ports picked: %d, want 2", picks)
	}
	if _, port, _ := net.SplitHostPort(addr); port == "" || addr == taken.Addr().String() {
		t.Errorf("nginx at %s, the taken port's address", addr)
	}
}
