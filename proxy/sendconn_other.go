//go:build !unix

package proxy

import "time"

// sendWatch is empty here: without a RawConn write callback,
// client.write_timeout bounds each write whole (see sendconn_unix.go).
type sendWatch struct{}

// watchSends renews nothing here (see sendWatch).
func (c *clientConn) watchSends(time.Duration) {}

// SetDeadline sets both deadlines, the read one through the hold
// (readHold).
func (c *clientConn) SetDeadline(t time.Time) error {
	if err := c.TCPConn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}
