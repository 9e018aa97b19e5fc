package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// The size limits hold at their edges: a body of exactly
// max_request_body bytes and a head of exactly client.max_header_size
// bytes pass whole, one byte more is refused (413, 431) and the connection
// ends; for a chunked body however its chunks cut it, with a trailer or
// behind an Expect head. None had a test at the edge, where an off-by-one
// (a ">=" for a ">", a cap that counts the CRLF) would show.
func TestSizeLimitsAtTheirEdges(t *testing.T) {
	const maxBody, maxHead = 100, 4096
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxRequestBodySize = maxBody
		o.srv.MaxRequestHeaderSize = maxHead
	})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
		}
		w.Header().Set("X-Got", strconv.Itoa(len(b)))
	}))
	host := h.route("edgebox", port)
	post := "POST / HTTP/1.1\r\nHost: " + host + "\r\n"
	// chunked frames n bytes in chunks of at most size, and ends with
	// trailer (empty: none).
	chunked := func(n, size int, trailer string) string {
		s := post + "Transfer-Encoding: chunked\r\n\r\n"
		for n > 0 {
			k := min(n, size)
			s += strconv.FormatInt(int64(k), 16) + "\r\n" + strings.Repeat("a", k) + "\r\n"
			n -= k
		}
		return s + "0\r\n" + trailer + "\r\n"
	}
	sized := func(n int, extra string) string {
		return post + extra + "Content-Length: " + strconv.Itoa(n) + "\r\n\r\n" + strings.Repeat("a", n)
	}
	// head is a GET head of exactly n bytes.
	head := func(n int) string {
		bare := "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Pad: \r\n\r\n"
		return "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Pad: " + strings.Repeat("p", n-len(bare)) + "\r\n\r\n"
	}
	for _, tc := range []struct {
		name, raw string
		status    int
		code      string // the refusal's; "" for the sandbox's answer
		got       int    // body bytes the sandbox read, for its answer
	}{
		{"Content-Length at the limit", sized(maxBody, ""), 200, "", maxBody},
		{"Content-Length one over", sized(maxBody+1, ""), 413, CodeBodyTooLarge, 0},
		{"Expect, Content-Length one over", post + "Expect: 100-continue\r\nContent-Length: " + strconv.Itoa(maxBody+1) + "\r\n\r\n", 413, CodeBodyTooLarge, 0},
		{"one chunk at the limit", chunked(maxBody, maxBody, ""), 200, "", maxBody},
		{"small chunks to the limit", chunked(maxBody, 7, ""), 200, "", maxBody},
		{"at the limit with a trailer", chunked(maxBody, 50, "X-T: 1\r\n"), 200, "", maxBody},
		{"one chunk one over", chunked(maxBody+1, maxBody+1, ""), 413, CodeBodyTooLarge, 0},
		{"small chunks one over", chunked(maxBody+1, 10, ""), 413, CodeBodyTooLarge, 0},
		{"head at the limit", head(maxHead), 200, "", 0},
		{"head one over", head(maxHead + 1), 431, CodeHeaderTooLarge, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.addr)
			// From another goroutine: a refusal may come before the
			// client has sent it all.
			go func() { _, _ = io.WriteString(c, tc.raw) }()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err == nil && resp.StatusCode == http.StatusContinue {
				resp, err = http.ReadResponse(br, nil) // an Expect head's 100 comes first only if admitted
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, b, tc.status)
			}
			if tc.code != "" {
				if !strings.Contains(string(b), `"code":"`+tc.code+`"`) || !resp.Close {
					t.Fatalf("refusal %s (close %v), want code %s and the connection closed", b, resp.Close, tc.code)
				}
				return
			}
			if got := resp.Header.Get("X-Got"); got != strconv.Itoa(tc.got) || resp.Close {
				t.Fatalf("the sandbox read %s bytes (close %v), want %d on a kept connection", got, resp.Close, tc.got)
			}
		})
	}
}
