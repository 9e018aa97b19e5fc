package proxy

import (
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At the descriptor limit Linux's accept4 fails with EMFILE when no client
// waits too (it takes the descriptor first). A traffic listener counted
// and logged that as a failed accept, one a second with nobody there, and
// grew its backoff on it, so the first client after a quiet spell waited
// up to a second more. It now waits for a client and counts, logs and
// backs off only for one that cannot be accepted. So does the HTTPS
// listener, whose socket is under the TLS listener's (ServeTLS): the
// first build that waited found no socket there and counted as before.
func TestTrafficAcceptAtLimitCountsOnlyAWaitingClient(t *testing.T) {
	if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
		t.Parallel() // the parent only waits for its child processes
	}
	for _, tc := range []struct {
		name string
		wrap func(net.Listener) net.Listener
	}{
		{"plain", func(ln net.Listener) net.Listener { return ln }},
		{"TLS", func(ln net.Listener) net.Listener { return &tlsListener{Listener: ln, cfg: &tls.Config{}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Getenv("CUBE_TEST_FD_CHILD") != "1" {
				t.Parallel() // the parent only waits for its child process
				runFDChild(t)
				return
			}
			acceptAtLimitCountsOnlyAWaitingClient(t, tc.wrap(listen(t, "127.0.0.1:0")))
		})
	}
}

func acceptAtLimitCountsOnlyAWaitingClient(t *testing.T, ln net.Listener) {
	var logs testenv.LogBuffer
	rl := newRetryListener(ln, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	t.Cleanup(func() { rl.Close() })
	port := rl.Addr().(*net.TCPAddr).Port
	client := clientSocket(t)
	var done <-chan accepted
	atFDLimit(t, func() {
		done = acceptInBackground(rl)
		// Parked somewhere in Accept: in the poller or waitConn (waiting
		// for a client), or in its backoff (having counted a failure).
		testenv.WaitFor(t, 10*time.Second, "Accept to wait", func() bool {
			for _, g := range testenv.Stacks() {
				if strings.Contains(g, "(*retryListener).Accept") &&
					(strings.Contains(g, "[IO wait") || strings.Contains(g, "proxy.waitConn") || strings.Contains(g, "[select")) {
					return true
				}
			}
			return false
		})
		if strings.Contains(logs.String(), "cannot accept connections") {
			t.Errorf("a failed accept logged with no client connecting:\n%s", logs.String())
		}
		if err := syscall.Connect(client, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		// A client waits and cannot be accepted: that is a failure.
		testenv.WaitFor(t, 10*time.Second, "the failed accept of a waiting client to be logged", func() bool {
			return strings.Contains(logs.String(), "cannot accept connections")
		})
	})
	// Descriptors free: the client is accepted at the next retry.
	got := testenv.Recv(t, done, 10*time.Second, "the waiting client accepted once descriptors freed up")
	if got.err != nil {
		t.Fatalf("accept once descriptors freed up: %v", got.err)
	}
	got.c.Close()
	if !strings.Contains(logs.String(), "accepting connections again") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}
