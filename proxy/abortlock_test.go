package proxy

import (
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// At the drain deadline abortAll closes every stream's client socket,
// and a close of a socket with unsent data is the kernel's work (the
// teardown dominates a deadline with thousands of streams): it must not
// run under the registry lock, which every stream takes to end and every
// new one to start. A reference held on the client's socket makes its
// close wait; the lock must be free meanwhile, the registry marked
// aborted. Earlier builds closed under the lock: it stayed taken until the
// socket was let go. abortAll itself may return meanwhile: the sandbox
// socket's shut wakes the stream, whose own close of the client can come
// first and wait for the reference, and abortAll's then finds the socket
// closing and returns (3 runs in 40 under -race).
func TestAbortClosesStreamsAfterTheRegistryLock(t *testing.T) {
	h := newHarness(t)
	heldStreams(t, h, "abortlock", 1)
	r := &h.proxy.streams
	r.mu.Lock()
	client := r.head.client
	r.mu.Unlock()
	letGo := holdSocket(t, client)
	aborted := make(chan struct{})
	go func() { r.abortAll(); close(aborted) }()
	testenv.WaitFor(t, 5*time.Second, "the registry lock free, with abortAll begun, while a stream's socket closes", func() bool {
		if !r.mu.TryLock() {
			return false
		}
		defer r.mu.Unlock()
		return r.aborted
	})
	letGo()
	testenv.Recv(t, aborted, 10*time.Second, "abortAll's return once the socket was let go")
	testenv.WaitFor(t, 5*time.Second, "the cut stream to end", func() bool { s, _ := r.open(); return s == 0 })
}
