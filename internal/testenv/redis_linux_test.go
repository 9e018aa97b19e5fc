package testenv

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The redis-servers of a test binary that ends without running its
// tests' cleanups end with it: a test binary past its -timeout, or one
// where another test panicked, exits so. The child process starts one,
// says its address and exits.
func TestRedisEndsWithItsTestBinary(t *testing.T) {
	if os.Getenv("CUBE_TEST_REDIS_EXIT") == "1" {
		r := StartRedis(t)
		os.Stdout.WriteString("redis " + r.Addr() + "\n")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRedisEndsWithItsTestBinary$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CUBE_TEST_REDIS_EXIT=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var addr string
	for sc := bufio.NewScanner(out); sc.Scan(); {
		if a, ok := strings.CutPrefix(sc.Text(), "redis "); ok {
			addr = a
		}
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child test did not exit with an error")
	}
	if addr == "" {
		t.Fatal("the child test started no redis-server")
	}
	WaitFor(t, 5*time.Second, "the exited test binary's redis-server to end", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}
