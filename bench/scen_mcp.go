package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hostRewriter sends every request to the dialled address with the sandbox
// Host header, the way clients without wildcard DNS reach the proxy.
type hostRewriter struct {
	host string
	next http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (h hostRewriter) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Host = h.host
	return h.next.RoundTrip(r)
}

// connectMCP opens a session or gives up after timeout. A session whose
// initialization hangs is abandoned rather than awaited: the go-sdk's Connect
// may only return once its standalone stream ends, and the sample must not
// wait for that.
func connectMCP(ctx context.Context, client *mcp.Client, endpoint string, hc *http.Client, timeout time.Duration) (*mcp.ClientSession, error) {
	type result struct {
		cs  *mcp.ClientSession
		err error
	}
	done := make(chan result, 1)
	go func() {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
		done <- result{cs, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("connect session: %w", r.err)
		}
		return r.cs, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("connect session: no session after %s", timeout)
	}
}

func runMCP(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	o.register(fs, 20002)
	sessions := fs.Int("m", 8, "concurrent MCP sessions")
	steps := fs.Int("steps", 5, "progress notifications streamed per tools/call")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4 * *sessions // POSTs plus one standalone GET stream per session
	tr.Proxy = nil
	// Every connection dies at the end of the sample, so a subject that holds
	// a stream forever cannot keep the load generator alive.
	deadline := time.Now().Add(o.warm + o.dur + 10*time.Second)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		if err == nil {
			_ = c.SetDeadline(deadline)
		}
		return c, err
	}
	hc := &http.Client{Transport: hostRewriter{host: o.host(o.id), next: tr}}
	defer tr.CloseIdleConnections()
	endpoint := "http://" + o.addr + "/mcp"

	var progress atomic.Int64
	client := mcp.NewClient(&mcp.Implementation{Name: "cube-bench", Version: "v1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), o.warm+o.dur+30*time.Second)
	defer cancel()

	type worker struct{ tally }
	var phase, dead atomic.Int32
	workers := make([]*worker, *sessions)
	var wg sync.WaitGroup
	for i := range workers {
		wk := &worker{tally{h: newHist()}}
		workers[i] = wk
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A session starts in milliseconds through every subject that
			// can carry one; nginx with the platform's buffering never
			// starts one, and each of its samples waited out this bound
			// (5 s past the warm-up took 15 s of a 2.5-minute --quick).
			cs, err := connectMCP(ctx, client, endpoint, hc, o.warm+2*time.Second)
			if err != nil {
				// One dead session is a failed sample, however many calls
				// the others complete (an error per call would drown it).
				dead.Add(1)
				wk.err = err
				return
			}
			defer cs.Close()
			params := &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": *steps}}
			for n := 0; ; n++ {
				ph := phase.Load()
				if ph == phaseStop {
					return
				}
				params.Meta = mcp.Meta{"progressToken": fmt.Sprintf("w%d-%d", i, n)}
				t0 := time.Now()
				res, err := cs.CallTool(ctx, params)
				el := time.Since(t0)
				if err == nil && res.IsError {
					err = errors.New("tool returned an error result")
				}
				if err != nil {
					if ph == phaseMeasure {
						wk.errs++ // calls are counted in the window only
					}
					wk.err = err
					if ctx.Err() != nil {
						return
					}
					continue
				}
				if ph == phaseMeasure && phase.Load() == phaseMeasure {
					wk.ops++
					wk.h.record(int64(el))
				}
			}
		}()
	}
	m := o.newMeter()
	time.Sleep(o.warm)
	var marks []int64
	o.window(m, &phase, func() { marks = append(marks, progress.Load()) })
	p0, p1 := marks[0], marks[1]
	wg.Wait()

	s := o.newSample("mcp", fmt.Sprintf("m=%d steps=%d d=%s", *sessions, *steps, o.dur), m)
	h, firstErr := mergeTallies(s, workers)
	sec := m.wall.Seconds()
	s.Metrics["calls_per_s"] = float64(s.Ops) / sec
	s.Metrics["p50_us"] = us(h.quantile(0.5))
	s.Metrics["p99_us"] = us(h.quantile(0.99))
	s.Metrics["progress_per_s"] = float64(p1-p0) / sec
	if len(m.subject) > 0 && s.Ops > 0 {
		s.Metrics["cpu_us_per_call"] = m.subjectCPU.Seconds() * 1e6 / float64(s.Ops)
	}
	o.checkErrors(s, firstErr)
	if n := dead.Load(); n > 0 {
		s.Failed = fmt.Sprintf("%d of %d sessions did not start: %v", n, *sessions, firstErr)
	}
	return s, nil
}
