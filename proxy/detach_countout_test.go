package proxy

import (
	"io"
	"net/http"
	"testing"
)

// A GET event stream is detached (detach.go) and its connection ends with
// it, so a client that reads the stream's end goes on with a new
// connection at once: an EventSource or MCP client reconnecting. At
// max_streams_per_sandbox that request must find the ended stream's slot
// free. The stream used to count its request out after writing its last
// chunk, so the client could read the end while the stream still counted,
// and its next request got 429.
func TestDetachedStreamCountsOutBeforeItsEnd(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 1 })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		io.WriteString(w, "data: one\n\n")
		f.Flush()
	}))
	h.put("endbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "80": itoa(port)})
	const rounds = 200
	for i := range rounds {
		resp := h.do(h.req("GET", "80-endbox.cube.test", "/", nil))
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(b) != "data: one\n\n" {
			t.Fatalf("round %d: %d %q %v", i, resp.StatusCode, b, err)
		}
		// The end has been read: the stream no longer counts.
		if n := h.proxy.sandboxes.get([]byte("endbox")).inFlight(); n != 0 {
			t.Fatalf("round %d: %d requests still counted in after the client read the stream's end", i, n)
		}
	}
}
