package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The idle figure is RSS growth divided by the streams held open. A
// subject that ended the streams after their first event (a short idle
// or read timeout, a connection cap that evicts) held none of them
// through the hold, yet the sample counted every one and passed: the
// growth of fewer streams, or of none, divided by n read as a low cost
// per stream. A stream that is not open at the end of the hold must fail
// the sample.
func TestIdleStreamsEndedDuringTheHoldFailTheSample(t *testing.T) {
	event := fmt.Sprintf("data: %019d ", time.Now().UnixNano())
	event += strings.Repeat("p", 64-len(event)-2) + "\n\n"
	chunk := fmt.Sprintf("%x\r\n%s\r\n", len(event), event)
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	cases := []struct {
		name string
		// after runs once the first event is written.
		after func(c net.Conn)
		want  string // "" = a good sample
	}{
		{"held", func(c net.Conn) { _, _ = c.Read(make([]byte, 1)) }, ""},
		{"connection closed", func(net.Conn) {}, "4 of 4 streams were not held through the window: the subject ended the stream"},
		{"response ended, connection kept", func(c net.Conn) {
			if _, err := c.Write([]byte("0\r\n\r\n")); err == nil {
				_, _ = c.Read(make([]byte, 1))
			}
		}, "4 of 4 streams were not held through the window: the subject ended the stream"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln := testenv.ServeTCP(t, func(c net.Conn) {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if _, err := c.Write([]byte(head + chunk)); err != nil {
					return
				}
				tc.after(c)
			})
			o := &options{scenario: "idle", defLabel: "idle"}
			s, err := runIdle(o, []string{"-addr", ln.Addr().String(), "-n", "4", "-par", "4", "-settle", "20ms",
				"-d", "50ms", "-subject", subjCube, "-pids", strconv.Itoa(os.Getpid()), "-out", ""})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if s.Failed != "" || s.Metrics["streams"] != 4 {
					t.Fatalf("sample failed = %q with %v streams, want a good sample of 4", s.Failed, s.Metrics["streams"])
				}
				return
			}
			if !strings.Contains(s.Failed, tc.want) {
				t.Fatalf("sample failed = %q (%v streams counted, %.1f KiB each), want %q",
					s.Failed, s.Metrics["streams"], s.Metrics["rss_kib_per_stream"], tc.want)
			}
		})
	}
}
