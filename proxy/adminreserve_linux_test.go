package proxy

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At the descriptor limit Linux's accept4 fails when no connection waits
// too (it takes the descriptor first), and the admin listener spent a
// reserved descriptor on that: it was then free for anything else until an
// admin connection came. A route lookup's Redis dial took it and got
// Redis's 404 instead of the 503 proxy_out_of_resources
// (TestStoreDialShortageIsTheProxys, once in a loaded run). The reserve is
// spent on a connection that waits, and only on one.
func TestAdminReserveSpentOnlyOnAConnection(t *testing.T) {
	if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
		t.Parallel() // the parent only waits for its child process
		runFDChild(t)
		return
	}
	rl := newRetryListener(listen(t, "127.0.0.1:0"), slog.New(slog.NewTextHandler(io.Discard, nil)), nil).withReserve()
	t.Cleanup(func() { rl.Close() })
	port := rl.Addr().(*net.TCPAddr).Port
	client := clientSocket(t)
	var got accepted
	atFDLimit(t, func() {
		done := acceptInBackground(rl)
		acceptWaiting(t)
		if f, err := os.Open(os.DevNull); err == nil {
			f.Close()
			t.Fatal("a descriptor came free while the admin listener waited with no connection")
		} else if !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("open at the limit: %v, want EMFILE", err)
		}
		if err := syscall.Connect(client, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		got = testenv.Recv(t, done, 10*time.Second, "the admin connection accepted on the reserve")
	})
	if got.err != nil {
		t.Fatalf("accept of a waiting connection at the limit: %v", got.err)
	}
	got.c.Close()
}

// accepted is what a retryListener's Accept returned.
type accepted struct {
	c   net.Conn
	err error
}

// acceptInBackground calls rl.Accept on a goroutine of its own.
func acceptInBackground(rl *retryListener) <-chan accepted {
	done := make(chan accepted, 1)
	go func() {
		c, err := rl.Accept()
		done <- accepted{c, err}
	}()
	return done
}

// clientSocket opens a TCP socket for a client to connect at the
// descriptor limit: opened now, while descriptors are left.
func clientSocket(t *testing.T) int {
	t.Helper()
	client, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(client) })
	return client
}

// acceptWaiting returns once a goroutine in retryListener.Accept waits for
// a connection: parked in accept (the poller) or polling in waitConn.
func acceptWaiting(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "Accept to wait for a connection", func() bool {
		for _, g := range testenv.Stacks() {
			if strings.Contains(g, "(*retryListener).Accept") && (strings.Contains(g, "[IO wait") || strings.Contains(g, "proxy.waitConn")) {
				return true
			}
		}
		return false
	})
}
