package proxy

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// An admitted head is pooled back only if it is no larger than what a
// connection keeps (letGoOfHead): more than keptHeadLines lines, short
// enough to stay under keptHeadBytes, leave a header whose line slots the
// pool would hold on to, each upload's copy of its head reusing them.
func TestAdmittedHeadOfManyLinesNotPooled(t *testing.T) {
	head := "POST /upload HTTP/1.1\r\nHost: 3000-abc.cube.test\r\nContent-Length: 5\r\n" +
		strings.Repeat("B: c\r\n", keptHeadLines+1) + "\r\n"
	if len(head) > keptHeadBytes {
		t.Fatalf("head of %d bytes: the test wants one under keptHeadBytes", len(head))
	}
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
		t.Fatal(err)
	}
	ah := admittedHeads.Get().(*admittedHead)
	h.CopyTo(&ah.h)
	ah.release()
	// Put then Get on one goroutine returns what was put (the pool's
	// per-P slot), unless the pool dropped it (as -race does at random).
	if got := admittedHeads.Get().(*admittedHead); got == ah {
		t.Fatalf("a head of %d lines went back to the pool", keptHeadLines+1)
	}
}
