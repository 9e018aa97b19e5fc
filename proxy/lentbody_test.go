package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// An answer body over keptBody is read into a buffer lent for the answer
// and pooled again once fasthttp has written it. Given back too early, it
// would carry another answer's bytes: every answer here is distinct and
// checked whole, from clients at once and from pipelined requests, whose
// answers fasthttp may hold back until the next request is read.
func TestLentBodyCarriesItsOwnAnswer(t *testing.T) {
	h := newHarness(t)
	sandbox := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n)) // read whole, not streamed
		w.Write(lentBodyAnswer(r.URL.Path, n))
	}))
	putAuthRoute(h, "lent", "", sandbox, 3000)
	sizes := []int{keptBody + 1, 20 << 10, wholeBody - 1, wholeBody, 100, keptBody}

	var wg sync.WaitGroup
	for client := range 4 {
		wg.Go(func() {
			c := dialRaw(t, h.addr)
			defer c.Close()
			br := bufio.NewReader(c)
			for round := range 25 {
				// Three pipelined requests in one write, then their answers.
				var reqs strings.Builder
				var want []string
				for i := range 3 {
					path := fmt.Sprintf("/c%d-r%d-%d", client, round, i)
					n := sizes[(client+round+i)%len(sizes)]
					fmt.Fprintf(&reqs, "GET %s?n=%d HTTP/1.1\r\nHost: 3000-lent.cube.test\r\n\r\n", path, n)
					want = append(want, string(lentBodyAnswer(path, n)))
				}
				if _, err := io.WriteString(c, reqs.String()); err != nil {
					t.Error(err)
					return
				}
				for i, w := range want {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Errorf("client %d round %d answer %d: %v", client, round, i, err)
						return
					}
					got, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || string(got) != w {
						t.Errorf("client %d round %d answer %d: %d, %d bytes (%v), want 200 and its own %d bytes (%.40q...)",
							client, round, i, resp.StatusCode, len(got), err, len(w), got)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// lentBodyAnswer is the body the sandbox answers path with: n bytes that
// name the path over and over.
func lentBodyAnswer(path string, n int) []byte {
	return bytes.Repeat([]byte(path+";"), n/(len(path)+1)+1)[:n]
}

// A full request whose answer is read whole into a lent buffer allocates
// nothing, as a short answer's does (TestInstrumentationAddsNoAllocs).
func TestLentBodyAllocs(t *testing.T) {
	if raceDetectorOn {
		t.Skip("the race detector changes allocation counts; make test runs this without -race")
	}
	do := newBenchProxy(t, benchInstr{body: 32 << 10})
	// Warm the pools, the route cache and the keep-alive connections, and
	// fasthttp's body buffer pool, which the test's own sandbox and client
	// share in this process: it drops buffers over the size it last
	// calibrated for, once every 42,000 uses, and a test of small answers
	// run before this one (TestAuthRefusalAllocs) left that size small, so
	// each 32 KiB body the sandbox wrote or the client read was allocated
	// anew until the next calibration: 3 allocations a request in 4 of 8
	// runs of the package's Alloc tests. 43,000 requests pass one.
	for range 43000 {
		do()
	}
	if n := testing.AllocsPerRun(500, do); n != 0 {
		t.Errorf("a request answered with a 32 KiB body allocates %v times, want 0", n)
	}
}
