package proxy

import (
	"encoding/binary"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"golang.org/x/sys/unix"
)

// tcpSocketOpen reports whether the kernel holds a TCP socket from local
// port to remote port on 127.0.0.1 (on loopback, the proxy's side of a
// client's connection until it processes the client's reset). It asks
// sock_diag for that one socket, a hash lookup: reading /proc/net/tcp
// formats every socket on the machine, and with tens of thousands open
// (TIME_WAIT after a load run) one read took longer than the 100 ms
// client check the tests race against.
func tcpSocketOpen(t *testing.T, local, remote int) bool {
	t.Helper()
	open, _ := tcpSocket(t, local, remote)
	return open
}

// tcpSocket is tcpSocketOpen, and the bytes in the socket's receive queue
// that its owner has not read yet.
func tcpSocket(t *testing.T, local, remote int) (open bool, unread int) {
	t.Helper()
	state, unread := tcpSocketState(t, local, remote)
	return state != 0, unread
}

// tcpState* are the kernel's TCP states (include/net/tcp_states.h) that
// tcpSocketState reports.
const (
	tcpStateEstablished = 1
	tcpStateCloseWait   = 8
)

// tcpSocketState is tcpSocket with the socket's TCP state (as ss shows
// it; 0: no such socket).
func tcpSocketState(t *testing.T, local, remote int) (state uint8, unread int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		t.Fatal(os.NewSyscallError("socket", err))
	}
	defer unix.Close(fd)
	// struct nlmsghdr, then struct inet_diag_req_v2 with its
	// inet_diag_sockid (ports and addresses in network order).
	req := make([]byte, unix.NLMSG_HDRLEN+56)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST) // no dump: this one socket
	d := req[unix.NLMSG_HDRLEN:]
	d[0], d[1] = unix.AF_INET, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(d[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(d[8:], uint16(local))
	binary.BigEndian.PutUint16(d[10:], uint16(remote))
	copy(d[12:], []byte{127, 0, 0, 1})
	copy(d[28:], []byte{127, 0, 0, 1})
	binary.NativeEndian.PutUint32(d[48:], 0xffffffff) // INET_DIAG_NOCOOKIE
	binary.NativeEndian.PutUint32(d[52:], 0xffffffff)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		t.Fatal(os.NewSyscallError("sendto", err))
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		t.Fatal(os.NewSyscallError("recvfrom", err))
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil || len(msgs) == 0 {
		t.Fatalf("sock_diag answer: %v (%d messages)", err, len(msgs))
	}
	switch m := msgs[0]; m.Header.Type {
	case unix.SOCK_DIAG_BY_FAMILY:
		// struct inet_diag_msg: family, state, timer, retrans, then the
		// sockid (48 bytes), expires, then the receive queue. With no
		// connection left the lookup falls back on the listener of the
		// local port, whose peer port is 0.
		if len(m.Data) < 60 || int(binary.BigEndian.Uint16(m.Data[6:])) != remote {
			return 0, 0
		}
		return m.Data[1], int(binary.NativeEndian.Uint32(m.Data[56:]))
	case unix.NLMSG_ERROR:
		if len(m.Data) < 4 {
			t.Fatal("short sock_diag error")
		}
		errno := -int32(binary.NativeEndian.Uint32(m.Data))
		if syscall.Errno(errno) == syscall.ENOENT {
			return 0, 0
		}
		t.Fatalf("sock_diag: %v", syscall.Errno(errno))
	default:
		t.Fatalf("sock_diag answered message type %d", m.Header.Type)
	}
	return 0, 0
}

// tcpSocketOpen sees a connection's socket while it is open and stops
// seeing it once a reset took it away, with the listener of its port still
// there.
func TestTCPSocketOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, c := acceptPair(t, ln)
	local, remote := s.LocalAddr().(*net.TCPAddr).Port, s.RemoteAddr().(*net.TCPAddr).Port
	if !tcpSocketOpen(t, local, remote) {
		t.Fatal("an open connection's socket not found")
	}
	if tcpSocketOpen(t, local, remote+1) {
		t.Error("a socket found for a peer port nobody connected from")
	}
	_ = c.(*net.TCPConn).SetLinger(0)
	c.Close()
	testenv.WaitFor(t, 5*time.Second, "the reset to take the socket away", func() bool {
		return !tcpSocketOpen(t, local, remote)
	})
}
