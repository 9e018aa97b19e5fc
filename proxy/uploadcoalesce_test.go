package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chunkCountingBackend serves one request on a raw socket and reports, on
// the channel returned, how many data chunks its chunked body came in and
// how many bytes they held; it answers 200 with that count.
func chunkCountingBackend(t *testing.T) (uint16, <-chan [2]int) {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	got := make(chan [2]int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for { // the head
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "\r\n" {
				break
			}
		}
		chunks, size := 0, 0
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			n, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 64)
			if err != nil {
				return
			}
			if n == 0 {
				if _, err := br.ReadString('\n'); err != nil { // the empty trailer
					return
				}
				break
			}
			if _, err := io.CopyN(io.Discard, br, n+2); err != nil {
				return
			}
			chunks++
			size += int(n)
		}
		got <- [2]int{chunks, size}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port), got
}

// A chunked body the client sent as many 1-byte chunks in one write
// reaches the sandbox in few chunks: the pieces fasthttp's reader hands the
// copy from memory go out together before the proxy reads the client again
// (uploadWriter.beforeRead). Each went out as a chunk and a write syscall
// of its own: 256 KiB of 1-byte chunks cost 0.89 s of CPU. Over TLS too,
// whose connection runs the same hook. That a trickle still reaches the
// sandbox piece by piece is TestUploadPiecesArriveAtOnce's.
func TestChunkedUploadSmallChunksCoalesce(t *testing.T) {
	const n = 4096
	body := strings.Repeat("1\r\nx\r\n", n) + "0\r\n\r\n"
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", overTLS), func(t *testing.T) {
			h := newHarness(t)
			port, got := chunkCountingBackend(t)
			host := h.route("coalesce", port)
			c := dialProxy(t, h, host, overTLS)
			if _, err := fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", host, body); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			r := <-got
			if r[1] != n {
				t.Fatalf("the sandbox got %d bytes, want %d", r[1], n)
			}
			// fasthttp's reader holds 4 KiB of the client's bytes, 682
			// 1-byte chunks: a few reads of the client in all.
			if r[0] > n/64 {
				t.Fatalf("the sandbox got the %d 1-byte chunks in %d chunks, want at most %d", n, r[0], n/64)
			}
			t.Logf("%d 1-byte chunks reached the sandbox as %d", n, r[0])
		})
	}
}

// Each piece of a chunked upload that trickles in reaches the sandbox
// before the client sends the next, small chunks waiting in the proxy or
// not: the client sends a chunk only once the sandbox has read every byte
// sent so far, so a piece held back for company deadlocks the exchange and
// the test fails on its deadline. Over TLS too.
func TestChunkedUploadTrickleNotHeld(t *testing.T) {
	pieces := []string{"a", "bc", "d", strings.Repeat("e", 100), "f"}
	for _, overTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", overTLS), func(t *testing.T) {
			h := newHarness(t)
			port, progress := progressBackend(t, 4096)
			host := h.route("trickle", port)
			c := dialProxy(t, h, host, overTLS)
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", host)
			sent, seen := 0, 0
			for i, p := range pieces {
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(p), p)
				sent += len(p)
				for seen < sent {
					select {
					case seen = <-progress:
					case <-time.After(5 * time.Second):
						t.Fatalf("piece %d: the sandbox has %d of the %d bytes the client sent", i, seen, sent)
					}
				}
			}
			io.WriteString(c, "0\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("%d EOF", sent); string(b) != want {
				t.Fatalf("sandbox answered %q, want %q", b, want)
			}
		})
	}
}
