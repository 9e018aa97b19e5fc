package proxy

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An upload's copy gives its 64 KiB buffer back once a read has waited
// bulkHold for the client (readHold), by ending that read early and empty.
// The client must see none of it: an upload that pauses longer than that
// mid-body, in bulk, and then goes on reaches the sandbox whole, its answer
// keeps the connection, and the connection serves the next request (an
// error from fasthttp's body reader would have marked the body failed and
// closed the connection, and one in a chunk's size line would have lost the
// line). A client that stays silent is still cut at client.body_timeout, not
// at the hold's end. Over TLS too, whose reader takes a timed-out read up
// again. The memory this saves is TestREADMESizingCoversEveryKindOfConnection's
// "upload from a silent client".
func TestUploadPausedInBulkGoesOn(t *testing.T) {
	t.Parallel()
	const bodyTimeout = 3 * time.Second
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.ClientBodyTimeout = bodyTimeout
	})
	const burst = 64 << 10
	burstIn := make(chan struct{}, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, "next")
			return
		}
		first, _ := strconv.ParseInt(r.Header.Get("X-Burst"), 10, 64)
		sum := sha256.New()
		n, err := io.CopyN(sum, r.Body, first)
		if err != nil {
			fmt.Fprintf(w, "burst: %d bytes, %v", n, err)
			return
		}
		burstIn <- struct{}{}
		m, err := io.Copy(sum, r.Body)
		fmt.Fprintf(w, "%d %x %v", n+m, sum.Sum(nil), err)
	}))
	host := h.route("uploadhold", port)
	tlsAddr, roots := serveTLS(t, h)
	all := strings.Repeat("a", burst) + strings.Repeat("b", burst)
	whole := sha256.Sum256([]byte(all))
	for _, tc := range []struct {
		name    string
		overTLS bool
		chunked bool
		silent  bool // the client sends nothing after its burst
	}{
		{"Content-Length", false, false, false},
		{"chunked", false, true, false},
		{"Content-Length over TLS", true, false, false},
		{"chunked over TLS", true, true, false},
		{"Content-Length, client silent", false, false, true},
		{"Content-Length over TLS, client silent", true, false, true},
		{"chunked, client silent", false, true, true},
		{"chunked over TLS, client silent", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn = dialRaw(t, h.addr)
			if tc.overTLS {
				// crypto/tls sends its first 128 KiB in records of about
				// 1 KiB, which no read of the proxy's fills its small
				// buffer from: 16 KiB records, as curl's OpenSSL sends.
				c = tls.Client(dialRaw(t, tlsAddr), &tls.Config{RootCAs: roots, ServerName: host, DynamicRecordSizingDisabled: true})
			}
			framing, end, first := fmt.Sprintf("Content-Length: %d", 2*burst), "", burst
			frame := func(s string) string { return s }
			if tc.chunked {
				framing, end = "Transfer-Encoding: chunked", "0\r\n\r\n"
				frame = func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
				// A chunk 9 bytes short of 64 KiB, 64 KiB less a byte
				// with its size line and CRLF: over TLS its last 16 KiB
				// record, and so the copy's last read of it, is full. The
				// client pauses before the next chunk's size line, which
				// the copy waits for apart from its big buffer
				// (clientBody.nextChunk) and so gives that back.
				first = burst - 9
			}
			// The head alone, then the burst in one write: the proxy's
			// last read of it fills its small buffer, and its copy is in
			// bulk when the client pauses.
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nX-Burst: %d\r\n%s\r\n\r\n", host, first, framing)
			io.WriteString(c, frame(all[:first]))
			select {
			case <-burstIn:
			case <-time.After(5 * time.Second):
				t.Fatal("the burst did not reach the sandbox")
			}
			acked := time.Now()
			br := bufio.NewReader(c)
			if tc.silent {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no answer to a silent upload: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				checkProxyError(t, resp, string(b), http.StatusRequestTimeout, CodeBodyTimeout)
				// Renewed at most an eighth early (slack), never at the
				// hold's end, a second after the burst.
				if waited := time.Since(acked); waited < bodyTimeout*7/8-100*time.Millisecond {
					t.Errorf("a silent upload was cut %v after its last bytes, before client.body_timeout (%v)", waited, bodyTimeout)
				}
				return
			}
			// Longer than the hold: the stimulus, not a synchronisation.
			time.Sleep(bulkHold * 3 / 2)
			io.WriteString(c, frame(all[first:])+end)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("%d %x <nil>", 2*burst, whole); resp.StatusCode != 200 || string(b) != want {
				t.Fatalf("answer %d %q, want 200 %q", resp.StatusCode, b, want)
			}
			if resp.Close {
				t.Fatal("the answer to an upload that paused closes the connection")
			}
			fmt.Fprintf(c, "GET /next HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("the next request on the connection: %v", err)
			}
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "next" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, b)
			}
		})
	}
}
