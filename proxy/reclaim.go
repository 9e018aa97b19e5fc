package proxy

import (
	"net"
	"sync"
	"time"
)

// waitNode is a client connection's place in a waitList, embedded in the
// connection the proxy makes for it at accept (clientConn, tlsConn), so
// that tracking it allocates nothing.
type waitNode struct {
	prev, next *waitNode
	conn       net.Conn // the connection, set when first listed
	listed     bool
	// reclaimed: the listener took this connection's place under
	// client.max_conns for a new one (waitList.take); its close must not
	// give the place back a second time.
	reclaimed bool
}

// waitList holds the client connections that wait for a request (fasthttp's
// StateNew and StateIdle: accepted and not yet sent a byte, or idle between
// keep-alive requests), most recent first, as nginx's reusable connections
// queue: at client.max_conns the listener closes the longest-waiting ones
// to admit a new client rather than refuse it. Only kept when
// client.max_conns is set; every operation is O(1) but take.
type waitList struct {
	mu   sync.Mutex
	root waitNode // root.next is the newest, root.prev the oldest
	n    int
}

// waitNodeOf returns the node of a traffic connection (nil for one the
// proxy did not wrap, which is never reclaimed).
func waitNodeOf(c net.Conn) *waitNode {
	switch c := c.(type) {
	case *clientConn:
		return &c.wait
	case *tlsConn:
		return &c.wait
	}
	return nil
}

// push lists c as waiting from now (its newest end).
func (w *waitList) push(c net.Conn) {
	e := waitNodeOf(c)
	if e == nil {
		return
	}
	w.mu.Lock()
	if !e.listed && !e.reclaimed {
		if w.root.next == nil {
			w.root.next, w.root.prev = &w.root, &w.root
		}
		e.conn = c
		e.prev, e.next = &w.root, w.root.next
		w.root.next.prev = e
		w.root.next = e
		e.listed = true
		w.n++
	}
	w.mu.Unlock()
}

// unlink takes e off the list; w.mu is held.
func (w *waitList) unlink(e *waitNode) {
	if !e.listed {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	e.listed = false
	w.n--
}

// remove takes c off the list (its request began, or it is gone), and
// reports whether the listener reclaimed it.
func (w *waitList) remove(c net.Conn) (reclaimed bool) {
	e := waitNodeOf(c)
	if e == nil {
		return false
	}
	w.mu.Lock()
	w.unlink(e)
	reclaimed = e.reclaimed
	w.mu.Unlock()
	return reclaimed
}

// maxReclaim is how many waiting connections one accept closes at most:
// nginx's ngx_drain_connections closes an eighth of its reusable ones, at
// least one and at most 32, so that a flood of new clients does not close
// them one accept at a time.
const maxReclaim = 32

// take unlinks the longest-waiting connections, an eighth of them (at
// least one, at most maxReclaim), marks them reclaimed and appends them to
// dst. The caller closes them, outside the lock.
func (w *waitList) take(dst []net.Conn) []net.Conn {
	w.mu.Lock()
	k := min(max(w.n/8, 1), maxReclaim, w.n)
	for range k {
		e := w.root.prev
		w.unlink(e)
		e.reclaimed = true
		dst = append(dst, e.conn)
	}
	w.mu.Unlock()
	return dst
}

// reclaim makes room for a new client at client.max_conns by closing the
// connections that wait longest for a request (waitList.take), as nginx
// does at worker_connections ("worker_connections are not enough, reusing
// connections"): the places they held count as free at once, before
// fasthttp reports the closes. False when none waits: every connection
// is busy, and the new one is refused. Runs on the accept goroutine; no
// lock is held while it closes.
func (l *retryListener) reclaim() bool {
	if l.waiting == nil {
		return false
	}
	l.victims = l.waiting.take(l.victims[:0])
	n := len(l.victims)
	if n == 0 {
		return false
	}
	l.open.Add(-int64(n))
	for i, c := range l.victims {
		closeReclaimed(c)
		l.victims[i] = nil
	}
	l.metrics.ConnsReclaimed(n)
	l.reclaimed += n
	now := time.Now()
	if now.Sub(l.reclaimedLogged) >= 10*time.Second {
		l.log.Warn("client.max_conns are not enough: closing connections that wait for a request to admit new ones; raise it if memory allows",
			"addr", l.Addr().String(), "max_conns", l.max, "reclaimed", l.reclaimed)
		l.reclaimedLogged, l.reclaimed = now, 0
	}
	return true
}

// closeReclaimed closes a reclaimed connection's socket at once: no TLS
// close_notify, whose write (under crypto/tls's own 5 s deadline) a client
// that stopped reading would hold up the accept loop with, and no
// lingering. fasthttp's read fails and it reports the close.
func closeReclaimed(c net.Conn) {
	switch c := c.(type) {
	case *clientConn:
		_ = c.TCPConn.Close()
	case *tlsConn:
		_ = c.NetConn().Close()
	default:
		_ = c.Close()
	}
}
