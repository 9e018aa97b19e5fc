package proxy

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// An admitted head is pooled back only if it is no larger than what a
// connection keeps (letGoOfHead): more than keptHeadLines lines, short
// enough to stay under keptHeadBytes, or fewer lines of more than
// keptHeadBytes, leave a header whose line slots or buffer the pool would
// hold on to, each upload's copy of its head reusing them.
func TestAdmittedHeadOverKeptSizeNotPooled(t *testing.T) {
	const start = "POST /upload HTTP/1.1\r\nHost: 3000-abc.cube.test\r\nContent-Length: 5\r\n"
	for _, tc := range []struct {
		name, head string
	}{
		{"many short lines", start + strings.Repeat("B: c\r\n", keptHeadLines+1) + "\r\n"},
		{"few long lines", start + "Cookie: " + strings.Repeat("c", keptHeadBytes) + "\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			if err := h.Read(bufio.NewReaderSize(strings.NewReader(tc.head), 64<<10)); err != nil {
				t.Fatal(err)
			}
			if h.Len() > keptHeadLines == (len(h.RawHeaders()) > keptHeadBytes) {
				t.Fatalf("head of %d lines, %d bytes: the case wants one over exactly one of keptHeadLines, keptHeadBytes",
					h.Len(), len(h.RawHeaders()))
			}
			ah := admittedHeads.Get().(*admittedHead)
			h.CopyTo(&ah.h)
			ah.release()
			// Put then Get on one goroutine returns what was put (the pool's
			// per-P slot), unless the pool dropped it (as -race does at random).
			if got := admittedHeads.Get().(*admittedHead); got == ah {
				t.Fatalf("a head of %d lines, %d bytes went back to the pool", h.Len(), len(h.RawHeaders()))
			}
		})
	}
}

// A connection holds an admitted head only while it is open: one that
// closes before its body's run or the error handler took the head lets
// go of it (remove), and one removed already (closed as Expect admitted
// its head) keeps none, or the set would hold every such head for good.
func TestConnSetHoldsHeadsOnlyWhileOpen(t *testing.T) {
	var cs connSet
	open, closed := net.Pipe()
	defer open.Close()
	defer closed.Close()

	cs.add(open)
	cs.keepHead(open, admittedHeads.Get().(*admittedHead))
	cs.remove(open)
	cs.keepHead(closed, admittedHeads.Get().(*admittedHead)) // never added: closed before
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.heads) != 0 {
		t.Errorf("%d heads held after their connections closed, want none", len(cs.heads))
	}
}
