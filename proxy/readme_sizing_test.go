package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"testing"
)

// The README's sizing of client.max_conns ("Allow about N KiB per
// connection", with GOMEMLIMIT at 90 % of the container's memory) must
// cover what the Go runtime counts against GOMEMLIMIT for an idle
// keep-alive connection under the default head limit: its whole fasthttp
// reader of client.max_header_size, touched or not, its goroutine's stack
// and the rest. RSS is less (untouched pages of the reader are not
// resident), but GOMEMLIMIT is held to the runtime's count: a figure under
// it let max_conns idle connections take the heap past GOMEMLIMIT, where
// the collector runs without pause. With the head limit at 32 KiB an idle
// connection counts ≈ 49 KiB (33 KiB at 16 KiB), over the 32 KiB the
// README allowed.
func TestREADMESizingCoversAnIdleConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 500 connections")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`Allow about (\d+) KiB per connection`).FindSubmatch(readme)
	if m == nil {
		t.Fatal(`README: no "Allow about N KiB per connection" (Client connections and memory, Sizing)`)
	}
	allowed, _ := strconv.Atoi(string(m[1]))

	h := newHarness(t) // the default head limit
	const n = 500
	before := limitCounted()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: 3000-nosuchbox.cube.test\r\nX-Cube-Request-Id: sizing-%d\r\n\r\n", i)
		resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			t.Fatalf("answer %d closes its connection: not an idle keep-alive one", resp.StatusCode)
		}
	}
	per := (int64(limitCounted()) - int64(before)) / n
	t.Logf("an idle keep-alive connection counts %d bytes against GOMEMLIMIT; the README allows %d KiB", per, allowed)
	if per > int64(allowed)<<10 {
		t.Errorf("an idle keep-alive connection counts %.1f KiB against GOMEMLIMIT, over the %d KiB per connection the README's sizing allows",
			float64(per)/1024, allowed)
	}
}

// limitCounted is the memory the Go runtime holds GOMEMLIMIT to, after a
// collection that gives every free page back, as the runtime does near
// the limit: all it has mapped but what it has given back. Giving the
// free pages back keeps the garbage of other goroutines of the test
// process (earlier tests' servers, exporters) out of the count.
func limitCounted() uint64 {
	debug.FreeOSMemory()
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}
