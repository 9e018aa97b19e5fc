package testenv

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// A connection its handler closed is not held to the end of the test (a
// fuzz target's server accepts one per input); one left open is.
func TestServeLetsClosedConnectionsGo(t *testing.T) {
	cases := []struct {
		name  string
		close bool
		want  int
	}{
		{"handler closes", true, 0},
		{"handler leaves open", false, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := serve(t, ln, func(c net.Conn) {
				_, _ = c.Write([]byte("x"))
				if tc.close {
					_ = c.Close()
				}
			})
			for range 5 {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			// The handlers return after their write, on their own time.
			WaitFor(t, 5*time.Second, fmt.Sprintf("%d connections held", tc.want), func() bool {
				return s.held() == tc.want
			})
		})
	}
}

// held is how many connections s would close at the test's end.
func (s *tcpServer) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
