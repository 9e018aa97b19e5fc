//go:build !unix

package proxy

import "time"

// sendWatch is empty here: without a RawConn write callback,
// client.write_timeout bounds each write whole (see sendconn_unix.go).
type sendWatch struct{}

// watchSends renews nothing here (see sendWatch).
func (c *clientConn) watchSends(time.Duration) {}
