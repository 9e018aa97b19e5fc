package proxy

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// A request whose route lookup is still waiting on the store at the drain
// deadline is cut then, as one waiting on its sandbox is: 504
// drain_timeout, logged before Shutdown returns. The lookup ran to its
// own budget (redis.command_timeout, which nothing bounds), and with one
// longer than the 2 s unwind the process went on to close the store and
// the access log under the request: answered 503 store_unavailable or
// not at all, its line racing the log's close.
func TestDrainCutsRequestWaitingOnItsLookup(t *testing.T) {
	st := &gatedStore{Store: routing.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(st.release) })
	const drain = 300 * time.Millisecond
	h, buf, al := drainLogHarness(t, drain, func(o *harnessOpts) {
		o.store = st
		o.cache.LookupTimeout = 30 * time.Second
	})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 8080-slowstore.cube.test\r\nX-Cube-Request-Id: lookup-cut\r\n\r\n")
	select {
	case <-st.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no lookup")
	}
	wantDrainCut(t, h, c, "GET", "lookup-cut", drain, buf, al)
}
