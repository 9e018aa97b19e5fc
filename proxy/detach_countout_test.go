package proxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
)

// A client may send its next request as soon as it has read a streamed
// answer's end, on a new connection: an EventSource or MCP client
// reconnecting after a GET event stream (detach.go; its connection ends
// with it), or any client with a second connection in use. At
// max_streams_per_sandbox that request must find the ended stream's slot
// free, so a stream must count its request out before the write that
// carries its end. Streams used to do it after: a detached stream after its
// last chunk, any other once fasthttp had written the last piece of a
// Content-Length body or the last chunk; a client that read the end could
// be refused 429 for a stream that had ended.
//
// The proxy serves a listener whose connections report, at the write that
// ends the answer and before it goes out, whether the sandbox still counts
// the request.
func TestStreamCountsOutBeforeItsEnd(t *testing.T) {
	big := countingBody(256 << 10) // above wholeBody: streamed, copied by WriteTo
	sse := func(w http.ResponseWriter) {
		f := sseHeaders(w)
		io.WriteString(w, "data: one\n\n")
		f.Flush()
	}
	tests := []struct {
		name, method string
		serve        func(w http.ResponseWriter)
		want         string
		end          string // what the write carrying the end ends with
	}{
		{"detached GET event stream", "GET", sse, "data: one\n\n", lastChunkEnd},
		{"POST event stream", "POST", sse, "data: one\n\n", lastChunkEnd},
		{"Content-Length download", "GET", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			io.WriteString(w, big)
		}, big, big[len(big)-32:]},
		{"chunked download", "GET", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "part one,")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
		}, "part one,part two", lastChunkEnd},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 1 })
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tc.serve(w)
			}))
			h.put("endbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "80": itoa(port)})
			var ends, countedAtEnd atomic.Int64
			ln := &endWatchListener{Listener: listen(t, "127.0.0.1:0"), end: []byte(tc.end), onEnd: func() {
				ends.Add(1)
				countedAtEnd.Add(h.proxy.sandboxes.get([]byte("endbox")).inFlight())
			}}
			go h.server.Serve(ln)
			h.addr = ln.Addr().String()
			for i := range 3 {
				resp, b := h.dialProxy(t).do(tc.method, "80-endbox.cube.test", "/", "")
				if resp.StatusCode != 200 || b != tc.want {
					t.Fatalf("round %d: %d %d bytes", i, resp.StatusCode, len(b))
				}
				if got := ends.Load(); got != int64(i+1) {
					t.Fatalf("round %d: saw %d writes ending an answer, want %d", i, got, i+1)
				}
				if n := countedAtEnd.Load(); n != 0 {
					t.Fatalf("round %d: the sandbox still counted the request when its end went out", i)
				}
			}
		})
	}
}

// lastChunkEnd stands for a chunked answer's end: the last chunk, alone or
// after a chunk's CRLF. Its bare bytes are not enough: a header block
// written on its own ends with them too when its last line's value ends
// in 0 ("X-Cube-Retcode: 310200\r\n\r\n").
const lastChunkEnd = "\r\n0\r\n\r\n"

// endWatchListener's connections call onEnd before a write that ends with
// end, the last bytes of an answer.
type endWatchListener struct {
	net.Listener
	end   []byte
	onEnd func()
}

func (l *endWatchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// The proxy finds the socket's methods (SyscallConn, CloseWrite) on
	// the embedded *net.TCPConn.
	return &endWatchConn{TCPConn: c.(*net.TCPConn), l: l}, nil
}

type endWatchConn struct {
	*net.TCPConn
	l *endWatchListener
}

func (c *endWatchConn) Write(p []byte) (int, error) {
	end := c.l.end
	if bytes.HasSuffix(p, end) || string(end) == lastChunkEnd && string(p) == lastChunkEnd[2:] {
		c.l.onEnd()
	}
	return c.TCPConn.Write(p)
}
