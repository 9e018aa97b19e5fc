package redisstore

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Limits of one reply from Redis. A route hash is a few hundred bytes and
// a few dozen fields; the largest other reply the proxy reads is CLUSTER
// SLOTS (a few MiB for a cluster whose 16384 slots are scattered over
// many ranges). go-redis allocates what a reply's headers announce before
// it reads the data (a map of the announced size for HGETALL, a buffer of
// the announced length for a string), and a corrupted route hash with a
// million fields cost each lookup 95 MiB and 2.3 s, so it never fitted in
// the 1 s budget and was read again by every request for it.
const (
	// MaxReplyBytes bounds one reply, its headers' announced sizes included.
	MaxReplyBytes = 8 << 20
	// MaxReplyElems bounds the elements of one array in a reply (an
	// HGETALL answers two per field).
	MaxReplyElems = 1 << 16
	// maxReplyDepth bounds the nesting of arrays (CLUSTER SLOTS nests 3).
	maxReplyDepth = 16
)

// ErrReplyTooLarge is what a *ReplyTooLargeError is (errors.Is): the
// error of a command whose reply exceeds MaxReplyBytes or MaxReplyElems.
// The connection it came on is closed and the command is not retried: the
// same read would get the same reply.
var ErrReplyTooLarge = errors.New("redis reply too large")

// ReplyTooLargeError is a refused reply. go-redis gives a failed read to
// every command of a pipeline, the ones whose replies it had read before
// included; Reply tells which reply it was.
type ReplyTooLargeError struct {
	// Reply counts the replies read whole on the connection since the
	// client last wrote to it: 0 is the first command of the last batch
	// written. It holds for a batch written in one go, as a pipeline of
	// a few small commands is (go-redis buffers 32 KiB before it writes).
	Reply  int
	Reason string // what was too large, for the log
}

// Error names the reply in its batch and why it was refused.
func (e *ReplyTooLargeError) Error() string {
	return fmt.Sprintf("%v (reply %d of the batch): %s", ErrReplyTooLarge, e.Reply, e.Reason)
}

// Is makes errors.Is(err, ErrReplyTooLarge) hold.
func (e *ReplyTooLargeError) Is(target error) bool { return target == ErrReplyTooLarge }

// guardedConn is a connection to Redis that checks each reply's headers
// as they arrive, before go-redis sees them, and fails the read of one
// that announces more than the limits (ErrReplyTooLarge) instead of
// handing go-redis the header it would allocate for. The replies before
// the offending one are handed on whole, so a pipeline's earlier commands
// keep their answers. It costs no allocation per read.
type guardedConn struct {
	net.Conn
	scan respScanner
	// spoke says the server has sent a byte: its first may be a refusal
	// of the connection (refusal). Atomic, as respScanner.replies.
	spoke atomic.Bool
	// ask says whether the TLS handshake asked for a client certificate:
	// the connection's end before the server spoke is then its refusal.
	ask certAsk
	// plain says the connection is not TLS: a reset before the server
	// spoke is then most likely a TLS-only port's (plainRefused).
	plain bool
}

// guardedSysConn is a guardedConn over a connection that shows go-redis
// its socket (a TCP one, checkedTLS), for go-redis's liveness check of an
// idle pooled connection (see checkedTLS). The check reads the socket
// directly, and only on a connection with nothing pending, so it never
// bypasses the guard on a reply.
type guardedSysConn struct {
	*guardedConn
	sys syscall.Conn
}

// SyscallConn returns the socket of the guarded connection.
func (c guardedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

// guard wraps c in a guardedConn, keeping its socket visible when it
// shows one; ask is what its TLS handshake said of a client certificate,
// and plain says there was none (no TLS).
func guard(c net.Conn, ask certAsk, plain bool) net.Conn {
	g := &guardedConn{Conn: c, ask: ask, plain: plain}
	if sc, ok := c.(syscall.Conn); ok {
		return guardedSysConn{g, sc}
	}
	return g
}

// Read reads from the connection and passes on the bytes before a reply
// over the limits; the next Read returns the error.
func (c *guardedConn) Read(p []byte) (int, error) {
	if c.scan.err != nil {
		return 0, c.scan.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 && !c.spoke.Load() {
		c.spoke.Store(true)
		if r := refusal(p[:n]); r != nil {
			return 0, r
		}
		if r := notRESP(p[:n], c.RemoteAddr().String()); r != nil {
			return 0, r
		}
	}
	if n == 0 && err != nil && !c.spoke.Load() {
		if c.plain {
			return 0, plainRefused(err, c.RemoteAddr())
		}
		return 0, c.certRefused(err)
	}
	if ok := c.scan.feed(p[:n]); ok < n {
		c.scan.err.Reply = int(c.scan.replies.Load())
		if ok == 0 {
			return 0, c.scan.err
		}
		return ok, nil
	}
	return n, err
}

// Write writes p, the start of a new batch of commands (see
// ReplyTooLargeError.Reply).
func (c *guardedConn) Write(p []byte) (int, error) {
	c.scan.replies.Store(0)
	n, err := c.Conn.Write(p)
	if err != nil && !c.spoke.Load() {
		// Redis may have refused the connection and closed it before
		// the client's first command arrived: the reason is still
		// there to read.
		var buf [1024]byte
		_ = c.Conn.SetReadDeadline(time.Now().Add(refusalWait))
		k, _ := c.Conn.Read(buf[:])
		if r := refusal(buf[:k]); r != nil {
			return n, r
		}
		return n, c.certRefused(err)
	}
	return n, err
}

// certRefused returns err, the end of a connection before the server's
// first byte, or a certRefusedError when the TLS handshake asked for a
// client certificate: with TLS 1.3 the server checks the certificate
// after the client's handshake has ended, and its refusal reached the
// client as "remote error: tls: certificate required" or "... unknown
// certificate authority" on the first command, or, when the server had
// already closed, as "write: connection reset by peer" with nothing to
// say why. Which one was a race, so the log and /readyz alternated
// between them, and the reset, naming a new local port each time, was a
// new reason at every try (TestTLSClientCertificateRefusalNamed).
func (c *guardedConn) certRefused(err error) error {
	var ne net.Error
	if c.ask == certNotAsked || (errors.As(err, &ne) && ne.Timeout()) {
		return err
	}
	return &certRefusedError{addr: c.RemoteAddr().String(), sent: c.ask == certAskedSent}
}

// certRefusedError is a TLS connection Redis closed before its first
// reply after it asked for a client certificate. Like refusedConnError it
// wraps nothing, and it quotes neither the alert nor the reset, whichever
// came first, so that each refusal reads the same.
type certRefusedError struct {
	addr string
	sent bool
}

func (e *certRefusedError) Error() string {
	if e.sent {
		return "Redis at " + e.addr + " asked for a client certificate and closed the connection: it refused redis.cert_file's " +
			"(not signed by a CA of its tls-ca-cert-file, expired, or not for client authentication)"
	}
	return "Redis at " + e.addr + " asked for a client certificate and closed the connection: none is set " +
		"(redis.cert_file and key_file; or tls-auth-clients no/optional on the server)"
}

// refusalWait bounds the read of a refusal after a failed write: one
// already received is read at once.
const refusalWait = 10 * time.Millisecond

// refusedConnError is a connection Redis refused, with its reason. It
// wraps nothing: go-redis replaces an error met while connecting with
// the one it wraps, and the reason was lost again. go-redis closes the
// connection and does not retry the command: refused again at once, it
// would spend the budget on dials.
type refusedConnError struct{ reason string }

func (e *refusedConnError) Error() string { return "Redis refused the connection: " + e.reason }

// refusal returns the error of b, the first bytes a server sent, when they
// are the reply Redis sends, before it closes the connection, to a client
// it will not serve: at its maxclients, or in protected mode to a client
// from another host. It comes before any reply to the client's commands,
// and go-redis took it for the reply to its first one, HELLO, whose
// refusal it ignores (a server older than Redis 6), or met the closed
// connection first: the log and /readyz said "write: broken pipe", "EOF"
// or "connection reset by peer", not why
// (TestLookupRefusedConnectionNamesRedisReason).
func refusal(b []byte) error {
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	if !bytes.HasPrefix(line, []byte("-DENIED ")) && !bytes.HasPrefix(line, []byte("-ERR max number of clients reached")) {
		return nil
	}
	return &refusedConnError{reason: string(line[1:])}
}

// notRESP returns the error of b, the first bytes the server at addr
// sent, when they cannot begin a RESP reply: the server is something
// other than Redis (an HTTP service's "HTTP/1.1 400 Bad Request"), and
// go-redis's own error quoted the bytes without the server
// (TestLookupNamesWrongKindOfServer). Like refusedConnError it wraps
// nothing: the same dial would meet the same server.
func notRESP(b []byte, addr string) error {
	switch b[0] {
	case '+', '-', ':', '$', '*', // RESP2
		'_', ',', '#', '!', '=', '(', '%', '~', '>', '|': // RESP3
		return nil
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > 64 {
		line = line[:64]
	}
	return &notRedisError{addr: addr, first: string(line)}
}

// notRedisError is a server that answered, but not as Redis does.
type notRedisError struct{ addr, first string }

func (e *notRedisError) Error() string {
	return fmt.Sprintf("%s answered, but not as Redis does (its first line %q): is it another service's port?", e.addr, e.first)
}

// plainRefused returns err, the end of a plain-text connection before
// the server's first byte, named with the server at addr and, for a
// reset, with the likeliest cause: a TLS-only port (redis-server's
// tls-port with port 0, a managed Redis with encryption in transit)
// resets a client that speaks plain text, and the log and /readyz said
// "read: connection reset by peer" alone (TestLookupNamesWrongKindOfServer).
// A timeout (a hung server) and a clean close are left as they are: the
// first has its own naming (noAnswer), and go-redis retries the second.
// A unix:// socket has no TLS port, and its reset (a server that closed
// with the command unread: it exited, or is restarting) gets no such
// hint (TestUnixSocketResetNamesNoTLSPort).
func plainRefused(err error, addr net.Addr) error {
	if !errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	// Without the local address, which is new at every try: the
	// readiness watch logs a reason again only when it changes.
	var op *net.OpError
	if errors.As(err, &op) {
		err = op.Err
	}
	return &plainResetError{addr: addr.String(), err: err, unix: addr.Network() == "unix"}
}

// plainResetError is a plain-text connection reset before the server
// spoke. Like refusedConnError it wraps nothing (go-redis replaces an
// error met while connecting with the one it wraps), and quotes the
// reset instead. It is a net.Error that is no timeout, as the reset it
// stands for was: go-redis retries such an error, and a reset of a
// fresh connection is often a transient one (a Redis restarting, a load
// balancer in front of it), which a lookup must not fail on
// (TestLookupRetriesTransportErrors, "2 reset"); a TLS-only port resets every
// try, and its lookup fails with this error after the retries.
type plainResetError struct {
	addr string
	err  error
	unix bool // a unix:// socket's: no TLS port
}

// Timeout reports false: a reset is no timeout (net.Error).
func (e *plainResetError) Timeout() bool { return false }

// Temporary reports true: a reset may not recur (net.Error).
func (e *plainResetError) Temporary() bool { return true }

func (e *plainResetError) Error() string {
	msg := e.addr + " reset the connection before answering (" + e.err.Error() + ")"
	if e.unix {
		return msg
	}
	return msg + ": a TLS port? set redis.tls, or use a rediss:// URL"
}

// respScanner follows a stream of RESP2 replies (the clients speak
// protocol 2) header by header, skipping string data, and records in err
// the first reply over the limits.
type respScanner struct {
	state uint8
	kind  byte  // the header's type, '*' or '$'
	neg   bool  // the header's value is negative (a nil)
	n     int64 // the header's value so far
	skip  int64 // bytes of string data (and its CRLF) still to come
	size  int64 // bytes of the current top-level reply, announced data included
	depth int
	left  [maxReplyDepth]int64 // elements still to come in each open array
	// replies counts the replies read whole since the last Write. It is
	// atomic because a subscribed connection's PING may be written while
	// a message is read.
	replies atomic.Int32
	err     *ReplyTooLargeError
	header  int // where in the current feed the open header began (-1: before it)
}

const (
	scanType   = iota // at the type byte of a value
	scanHeader        // in the length of an array or string
	scanLine          // in a simple string, error or integer
	scanData          // in a string's data
)

// feed scans p and returns how many of its bytes may be handed on: all of
// them, or those before the header of a reply over the limits, once err
// is set.
func (s *respScanner) feed(p []byte) int {
	s.header = -1
	for i := 0; i < len(p); i++ {
		if s.state == scanData {
			k := min(s.skip, int64(len(p)-i))
			s.skip -= k
			i += int(k) - 1
			if s.skip == 0 {
				s.state = scanType
				s.complete()
			}
			continue
		}
		s.size++
		if s.size > MaxReplyBytes {
			return s.refuse(fmt.Sprintf("over %d bytes", MaxReplyBytes))
		}
		switch s.state {
		case scanType:
			s.header = i
			s.kind = p[i]
			s.state = scanLine
			if s.kind == '*' || s.kind == '$' {
				s.state, s.n, s.neg = scanHeader, 0, false
			}
		case scanLine:
			if p[i] == '\n' {
				s.state = scanType
				s.complete()
			}
		case scanHeader:
			switch b := p[i]; {
			case b >= '0' && b <= '9':
				s.n = s.n*10 + int64(b-'0')
				if s.n > MaxReplyBytes {
					return s.refuse(fmt.Sprintf("a header announces more than %d", MaxReplyBytes))
				}
			case b == '-':
				s.neg = true
			case b == '\n':
				if reason := s.opened(); reason != "" {
					return s.refuse(reason)
				}
			}
		}
	}
	return len(p)
}

// opened takes the header just read: a string's data follows, or an
// array's elements. It returns why a header is over the limits, or "".
func (s *respScanner) opened() string {
	switch {
	case s.neg || (s.kind == '*' && s.n == 0):
		s.state = scanType // a nil, or an empty array: complete as it is
		s.complete()
	case s.kind == '$':
		if s.size+s.n > MaxReplyBytes {
			return fmt.Sprintf("a string of %d bytes, over %d in all", s.n, MaxReplyBytes)
		}
		s.size += s.n // counted here, as go-redis allocates it here
		s.skip, s.state = s.n+2, scanData
	default: // '*'
		if s.n > MaxReplyElems {
			return fmt.Sprintf("an array of %d elements, over %d", s.n, MaxReplyElems)
		}
		if s.depth == maxReplyDepth {
			return fmt.Sprintf("arrays nested over %d deep", maxReplyDepth)
		}
		s.left[s.depth] = s.n
		s.depth++
		s.state = scanType
	}
	return ""
}

// complete counts a value as read: one element of the array it is in,
// which may complete that array in turn, or a whole reply.
func (s *respScanner) complete() {
	for s.depth > 0 {
		s.left[s.depth-1]--
		if s.left[s.depth-1] > 0 {
			return
		}
		s.depth--
	}
	s.size = 0
	s.replies.Add(1)
}

// refuse records err and returns how many bytes of the current feed go
// before the offending header (none when it began in an earlier feed: go-
// redis then holds an unfinished header line, which it cannot act on).
func (s *respScanner) refuse(reason string) int {
	s.err = &ReplyTooLargeError{Reason: reason}
	return max(s.header, 0)
}
