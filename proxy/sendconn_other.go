//go:build !unix

package proxy

import (
	"net"
	"time"
)

// watchSends keeps c as it is here: without a RawConn write callback,
// client.write_timeout bounds each write whole (see sendconn_unix.go).
func watchSends(c net.Conn, _ time.Duration) net.Conn { return c }
