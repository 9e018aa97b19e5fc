package proxy

import (
	"net"
	"sync"
	"time"
)

// heldConns are the client connections that neither fasthttp's shutdown
// nor the registry ends: those of the admin and redirect servers (fasthttp
// closes a connection at shutdown only once it has been idle 5 s, so a
// client connected and silent, or one still sending a head, was served on
// until its read timeout, 30 s) and those the proxy still reads from after
// its answer, a lingering close (up to lingerTime). Server.Shutdown closes
// them at its end and waits for their owners to let go, so that nothing
// serving a client outlives it: before, their goroutines went on reading,
// answering and logging for up to 30 s after the proxy had stopped, which
// a process embedding it (or a test) saw as leaked goroutines and sockets.
// A connection may be held twice at once (an admin connection whose
// refused request lingers), hence the count.
type heldConns struct {
	mu     sync.Mutex
	m      map[net.Conn]int
	closed bool
	empty  chan struct{} // closed once closed and m is empty; nil until closeAll waits
}

// add holds c, unless closeAll has run: then it closes c and returns
// false, and the caller must not wait on it.
func (h *heldConns) add(c net.Conn) bool {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = c.Close()
		return false
	}
	if h.m == nil {
		h.m = make(map[net.Conn]int)
	}
	h.m[c]++
	h.mu.Unlock()
	return true
}

// remove lets go of c, held by add.
func (h *heldConns) remove(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.m[c]
	if !ok {
		return
	}
	if n > 1 {
		h.m[c] = n - 1
		return
	}
	delete(h.m, c)
	if h.closed && len(h.m) == 0 && h.empty != nil {
		close(h.empty)
		h.empty = nil
	}
}

// closeAll closes every held connection (under TLS, its socket), makes
// add refuse new ones, and waits up to wait for their owners to let go of
// them; it reports whether they did. The closes are outside the lock: they are I/O.
func (h *heldConns) closeAll(wait time.Duration) bool {
	h.mu.Lock()
	h.closed = true
	if len(h.m) == 0 {
		h.mu.Unlock()
		return true
	}
	conns := make([]net.Conn, 0, len(h.m))
	for c := range h.m {
		conns = append(conns, c)
	}
	if h.empty == nil {
		h.empty = make(chan struct{})
	}
	empty := h.empty
	h.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
			// The socket under TLS: crypto/tls's Close sends a
			// close_notify, after one a lingering close may be waiting
			// to send (up to 5 s for a client slow to read), which held
			// Shutdown that long past the drain deadline
			// (TestShutdownCutsATLSLingerAtOnce). Its owner closes the
			// tls.Conn as usual.
			c = tc.NetConn()
		}
		_ = c.Close()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-empty:
		return true
	case <-t.C:
		return false
	}
}

// len reports how many connections are held.
func (h *heldConns) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}
