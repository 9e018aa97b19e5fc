//go:build !linux

package proxy

import "testing"

// tcpSocketOpen asks Linux's sock_diag (sockdiag_linux_test.go); a test
// that needs it is skipped elsewhere.
func tcpSocketOpen(t *testing.T, _, _ int) bool {
	t.Helper()
	t.Skip("needs Linux's sock_diag to see a socket's state")
	return false
}

// tcpSocket is tcpSocketOpen with the socket's unread bytes: Linux only.
func tcpSocket(t *testing.T, _, _ int) (open bool, unread int) {
	t.Helper()
	t.Skip("needs Linux's sock_diag to see a socket's state")
	return false, 0
}
