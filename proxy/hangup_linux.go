package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// hangups ends an SSE stream, or a request whose answer is slow to come,
// as soon as its client closes the connection, as nginx ends a proxied
// request on EPOLLRDHUP. Without it a silent stream's departed client is
// found only when the next heartbeat is due (30 s by default): until then
// the sandbox keeps a handler and a connection for nobody, and an MCP
// gateway refuses the client's resumption of its standalone stream (409)
// while it thinks the old one open. One epoll set and one goroutine serve
// every watch; a goroutine per stream would cost the idle-stream memory
// that detaching saves. The same set tells a request that is still sending
// its body that the sandbox has answered (watchReadable).
type hangups struct {
	// f is the epoll set, registered in Go's poller like any socket, so
	// the goroutine waiting on it parks without holding a thread. epfd is
	// its descriptor (f.Fd would take f out of the poller).
	f    *os.File
	epfd int

	mu      sync.Mutex
	watched map[uint64]hangUpper
	seq     uint64
	closed  bool // epfd may name another file now

	// inSet has a bit for each descriptor that add put in the set. A
	// one-shot event disarms a descriptor without taking it out, so a
	// keep-alive connection that carried an earlier watch (every MCP call
	// after a session's first) needs EPOLL_CTL_MOD; trying ADD first cost
	// an EEXIST syscall per stream. A bit can outlive its descriptor (a
	// closed descriptor leaves the set by itself), so a MOD that finds
	// nothing falls back on ADD.
	inSet []uint64
	ctls  int // epoll_ctl calls made, for the tests

	// ev and cerr are ctlFn's argument and result (under mu), and ctlFn
	// is h.ctl made once: a closure per add cost three allocations (it,
	// and the event and error it shares) on every watch.
	ev    syscall.EpollEvent
	cerr  error
	ctlFn func(fd uintptr)
}

func newHangups() (*hangups, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	h := &hangups{f: os.NewFile(uintptr(fd), "hangups"), epfd: fd, watched: make(map[uint64]hangUpper)}
	h.ctlFn = h.ctl
	return h, nil
}

// watch registers client, whose hang-up is told to t, and returns the key
// to unwatch it with; 0 when it cannot be watched (a connection without a
// descriptor), and the caller falls back on looking at the socket.
func (h *hangups) watch(client net.Conn, t hangUpper) uint64 {
	if h == nil || client == nil {
		return 0
	}
	return h.add(rawConn(client), t, syscall.EPOLLRDHUP)
}

// watchReadable registers the socket raw, whose first bytes (or close, or
// reset) are told to t: a sandbox that answers while its request body is
// still being sent. 0 when it cannot be watched. The caller's RawConn, kept
// with its connection: a SyscallConn per call is an allocation per request.
func (h *hangups) watchReadable(raw syscall.RawConn, t hangUpper) uint64 {
	return h.add(raw, t, syscall.EPOLLIN|syscall.EPOLLRDHUP)
}

func (h *hangups) add(raw syscall.RawConn, t hangUpper, events uint32) uint64 {
	if h == nil || raw == nil {
		return 0
	}
	// One-shot: the first event is all a watch needs to hear.
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0
	}
	key := h.seq + 1
	h.ev = syscall.EpollEvent{Events: events | syscall.EPOLLONESHOT, Fd: int32(key), Pad: int32(key >> 32)}
	h.cerr = nil
	if err := raw.Control(h.ctlFn); err != nil || h.cerr != nil {
		return 0
	}
	h.seq = key
	h.watched[key] = t
	return key
}

// ctl puts fd in the set with the event h.ev, and leaves the error in
// h.cerr (under mu; add's raw.Control runs it).
func (h *hangups) ctl(fd uintptr) {
	op := syscall.EPOLL_CTL_ADD
	if h.added(fd) {
		op = syscall.EPOLL_CTL_MOD
	}
	h.ctls++
	h.cerr = syscall.EpollCtl(h.epfd, op, int(fd), &h.ev)
	switch {
	case op == syscall.EPOLL_CTL_MOD && errors.Is(h.cerr, syscall.ENOENT):
		op = syscall.EPOLL_CTL_ADD // the descriptor was closed and reused
	case op == syscall.EPOLL_CTL_ADD && errors.Is(h.cerr, syscall.EEXIST):
		op = syscall.EPOLL_CTL_MOD
	default:
		op = -1
	}
	if op >= 0 {
		h.ctls++
		h.cerr = syscall.EpollCtl(h.epfd, op, int(fd), &h.ev)
	}
	if h.cerr == nil {
		h.markAdded(fd)
	}
}

// added reports whether fd's bit is set in inSet (under mu).
func (h *hangups) added(fd uintptr) bool {
	i := fd / 64
	return i < uintptr(len(h.inSet)) && h.inSet[i]&(1<<(fd%64)) != 0
}

// markAdded sets fd's bit in inSet (under mu), growing it to the highest
// descriptor seen: 128 KiB at a million descriptors.
func (h *hangups) markAdded(fd uintptr) {
	i := int(fd / 64)
	if i >= len(h.inSet) {
		h.inSet = append(h.inSet, make([]uint64, i+1-len(h.inSet))...)
	}
	h.inSet[i] |= 1 << (fd % 64)
}

// unwatch forgets the watch key (0: none); once it returns, run will not
// tell its hang-up.
func (h *hangups) unwatch(key uint64) {
	if h == nil || key == 0 {
		return
	}
	h.mu.Lock()
	delete(h.watched, key)
	h.mu.Unlock()
}

// run tells the hang-ups of watched clients, until close.
func (h *hangups) run() {
	raw, err := h.f.SyscallConn()
	if err != nil {
		return
	}
	var evs [64]syscall.EpollEvent
	var conns [len(evs)]net.Conn
	_ = raw.Read(func(epfd uintptr) bool {
		for {
			n, err := syscall.EpollWait(int(epfd), evs[:], 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return true
			}
			if n == 0 {
				return false // park until the set is readable again
			}
			m := 0
			h.mu.Lock()
			for _, ev := range evs[:n] {
				key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
				if t := h.watched[key]; t != nil {
					delete(h.watched, key)
					if c := t.hangUp(); c != nil {
						conns[m] = c
						m++
					}
				}
			}
			h.mu.Unlock()
			// Outside the lock, which every new watch takes: shutting
			// a socket is a system call that readies the goroutine
			// waiting on it, and a mass hang-up did 64 of them at a
			// time under it.
			for i, c := range conns[:m] {
				shut(c)
				conns[i] = nil
			}
		}
	})
}

// close stops run.
func (h *hangups) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	_ = h.f.Close()
}

// Poll events (the same on every Linux port Go supports).
const (
	pollERR   = 0x8
	pollHUP   = 0x10
	pollRDHUP = 0x2000
)

// clientHungUp reports whether the client closed (or half-closed) c, or
// reset it: one poll that does not wait. POLLRDHUP sees the client's FIN
// even behind bytes not read yet, as the epoll set does: a TLS client
// sends close_notify before its FIN, which clientClosed's peek takes for
// data. Bytes alone (a pipelined request) are not a hang-up.
func clientHungUp(c net.Conn) bool {
	return pollNow(c, pollRDHUP, pollRDHUP|pollHUP|pollERR)
}

// clientReset reports whether the peer reset c (or c is closed): one poll
// that does not wait. Unlike clientHungUp a FIN is no reset: a half-closed
// tunnel's bytes still go on.
func clientReset(c net.Conn) bool { return pollNow(c, 0, pollHUP|pollERR) }

// pollNow polls c for events without waiting and reports whether any of
// want came (POLLHUP and POLLERR always may), or c cannot be polled any
// more; false for a connection without a descriptor.
func pollNow(c net.Conn, events, want int16) bool {
	raw := rawConn(c)
	if raw == nil {
		return false
	}
	got := false
	err := raw.Control(func(fd uintptr) {
		pfd := struct {
			fd              int32
			events, revents int16
		}{fd: int32(fd), events: events}
		var ts syscall.Timespec // zero: do not wait
		for {
			n, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
			if e != syscall.EINTR {
				got = e == 0 && n == 1 && pfd.revents&want != 0
				return
			}
		}
	})
	return got || err != nil
}
