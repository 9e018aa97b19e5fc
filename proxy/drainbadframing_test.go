package proxy

import (
	"io"
	"testing"
	"time"
)

// A GET's event stream that the drain is ending, whose sandbox then breaks
// its chunked framing, ends as the drain promises (README, Drain): cleanly
// after a whole event, so that the client reconnects elsewhere with
// Last-Event-ID, and cut inside one, so that it drops the part. On Linux
// the stream is detached, and the drain's own wake-up ends it in
// copyEvents; a read that fails on bytes already buffered (here the bad
// chunk-size line that came with the head) fails in bodyStream.Read
// instead, and only its drain branch keeps that end clean: returning the
// read's error there went unnoticed by every other test.
func TestDrainEndsSSECleanlyWhenItsFramingBreaks(t *testing.T) {
	t.Parallel()
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, tc := range []struct {
		name, body, want string
		clean            bool
	}{
		{"after an event", "13\r\nid: 1\ndata: hello\n\n\r\nzz\r\n", "id: 1\ndata: hello\n\n", true},
		{"inside an event", "e\r\nid: 1\ndata: he\r\nzz\r\n", "id: 1\ndata: he", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			port, _ := muteSandbox(t, head+tc.body)
			// The drain has begun: the stream is ended as it registers,
			// with the sandbox's whole answer already on its way.
			h.proxy.streams.endSSE()
			resp := h.do(h.req("GET", h.route("badframing", port), "/", nil))
			defer resp.Body.Close()
			type result struct {
				body string
				err  error
			}
			read := make(chan result, 1)
			go func() { b, err := io.ReadAll(resp.Body); read <- result{string(b), err} }()
			select {
			case r := <-read:
				if r.body != tc.want {
					t.Errorf("client got %q, want %q", r.body, tc.want)
				}
				if tc.clean && r.err != nil {
					t.Errorf("stream ended with %v after a whole event, want a clean end (the client reconnects)", r.err)
				}
				if !tc.clean && r.err == nil {
					t.Error("stream ended cleanly inside an event: the client would take the part for a whole event")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the stream is still open")
			}
		})
	}
}
