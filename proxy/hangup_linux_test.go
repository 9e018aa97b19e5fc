package proxy

import (
	"fmt"
	"net/http"
	"testing"
)

// watchedHangups is how many clients h watches for a hang-up.
func watchedHangups(h *hangups) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watched)
}

// hangupWatchesMade is how many watches h has registered so far.
func hangupWatchesMade(h *hangups) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// A streamed answer that ends within clientCheck is never put on the
// hang-up watch, which costs epoll_ctl calls and allocations: most chunked
// answers (a Go handler that flushed, a Node res.write) are short. An
// event stream is watched from its start.
func TestShortStreamsSkipHangupWatch(t *testing.T) {
	const requests = 20
	for _, tc := range []struct {
		ctype   string
		watched bool
	}{
		{"application/json", false},
		{"text/event-stream", true},
	} {
		t.Run(tc.ctype, func(t *testing.T) {
			h := newHarness(t)
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, "data: one\n\n")
				w.(http.Flusher).Flush() // chunked: no Content-Length
				fmt.Fprint(w, "data: two\n\n")
			}))
			host := h.route("short", port)
			before := hangupWatchesMade(h.proxy.hangups)
			for range requests {
				if code, body, hdr := h.get(host, "/"); code != 200 || body != "data: one\n\ndata: two\n\n" || hdr.Get("Content-Length") != "" {
					t.Fatalf("got %d %q (Content-Length %q), want 200 with both parts, streamed", code, body, hdr.Get("Content-Length"))
				}
			}
			made := hangupWatchesMade(h.proxy.hangups) - before
			// A loaded machine may stall one answer past clientCheck; the
			// eager watch would make one per request.
			if got := made >= requests/2; got != tc.watched {
				t.Fatalf("%d of %d short streams were watched; want watched=%v", made, requests, tc.watched)
			}
		})
	}
}
