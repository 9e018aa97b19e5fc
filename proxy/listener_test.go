package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// errListener fails its accepts with errs, one each, then accepts from ln.
type errListener struct {
	net.Listener
	errs []error
}

func (l *errListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", err)}
	}
	return l.Listener.Accept()
}

// Running out of descriptors is waited out; any other error ends Accept,
// and so does Close during a wait between retries.
func TestRetryListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	rl := newRetryListener(&errListener{Listener: ln, errs: []error{syscall.EMFILE, syscall.ENFILE, syscall.EMFILE}}, log, nil)
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := rl.Accept()
	if err != nil {
		t.Fatalf("accept after EMFILE: %v", err)
	}
	c.Close()
	if rl.failed != 0 {
		t.Errorf("episode not ended: %d failures remembered", rl.failed)
	}

	rl = newRetryListener(&errListener{Listener: ln, errs: []error{syscall.EINVAL}}, log, nil)
	if _, err := rl.Accept(); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("EINVAL: got %v, want it returned", err)
	}

	many := make([]error, 100)
	for i := range many {
		many[i] = syscall.EMFILE
	}
	rl = newRetryListener(&errListener{Listener: ln, errs: many}, log, nil)
	done := make(chan error, 1)
	go func() { _, err := rl.Accept(); done <- err }()
	time.Sleep(50 * time.Millisecond)
	rl.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waiting after Close")
	}
}

// A client that reset before it was accepted is passed over: no wait, and
// no "out of resources" line sending the operator to the descriptor limit.
func TestRetryListenerConnAborted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var logs bytes.Buffer
	rl := newRetryListener(&errListener{Listener: ln, errs: []error{syscall.ECONNABORTED}},
		slog.New(slog.NewTextHandler(&logs, nil)), nil)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := rl.Accept()
	if err != nil {
		t.Fatalf("accept after ECONNABORTED: %v", err)
	}
	a.Close()
	if logs.Len() > 0 {
		t.Errorf("an aborted connection was logged: %s", logs.String())
	}
}
