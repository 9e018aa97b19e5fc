package redisstore

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// A sentinel connection's read deadline is capped at max from now,
// whether set alone or with the write deadline (go-redis sets both with
// SetDeadline on some paths), and a connection with no deadline, as a
// subscription waiting for +switch-master, keeps none: capping it would
// cut the subscription every max.
func TestShortReadsCapsReadDeadlines(t *testing.T) {
	const max = 20 * time.Millisecond
	far := func() time.Time { return time.Now().Add(time.Hour) }
	for _, tc := range []struct {
		name    string
		set     func(c *shortReads) error
		timeout bool // the read times out, within seconds, not the hour
	}{
		{"SetReadDeadline far away", func(c *shortReads) error { return c.SetReadDeadline(far()) }, true},
		{"SetDeadline far away", func(c *shortReads) error { return c.SetDeadline(far()) }, true},
		{"SetReadDeadline none", func(c *shortReads) error { return c.SetReadDeadline(time.Time{}) }, false},
		{"SetDeadline none", func(c *shortReads) error { return c.SetDeadline(time.Time{}) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, peer := tcpPair(t)
			c := &shortReads{Conn: raw, max: max}
			set := time.Now()
			if err := tc.set(c); err != nil {
				t.Fatal(err)
			}
			if !tc.timeout {
				// Let time pass beyond the cap (what is tested, not a
				// synchronisation): a capped deadline would have expired,
				// and a read then fails even with the byte waiting.
				time.Sleep(time.Until(set.Add(5 * max)))
				if _, err := peer.Write([]byte{'+'}); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 1))
				done <- err
			}()
			select {
			case err := <-done:
				if got := errors.Is(err, os.ErrDeadlineExceeded); got != tc.timeout {
					t.Fatalf("read: %v; want a timeout %v", err, tc.timeout)
				}
			case <-time.After(10 * time.Second):
				raw.Close()
				t.Fatal("read still waiting after 10s: the deadline was not capped")
			}
		})
	}
}
