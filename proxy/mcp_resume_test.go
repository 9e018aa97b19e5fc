package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// heldEventWriter passes a gateway's GET stream through, except the event
// that cut picks (cut returns > 0): of that one it sends the first cut
// bytes, reports them on sent, and holds the rest until the request ends,
// as a large event still on the wire when the proxy's drain comes.
type heldEventWriter struct {
	http.ResponseWriter
	ctx  context.Context
	cut  func(event []byte) int
	sent chan<- []byte
}

func (w heldEventWriter) Write(b []byte) (int, error) {
	i := w.cut(b)
	if i <= 0 {
		return w.ResponseWriter.Write(b)
	}
	n, err := w.ResponseWriter.Write(b[:i])
	w.Flush()
	w.sent <- append([]byte(nil), b[:i]...)
	if err != nil {
		return n, err
	}
	<-w.ctx.Done()
	return n, w.ctx.Err()
}

func (w heldEventWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// balancer is a load balancer in front of proxy instances: every request
// goes to the instance addr names when it is sent.
type balancer struct {
	host string
	base http.RoundTripper
	addr atomic.Pointer[string]

	mu  sync.Mutex
	got []byte // every byte of GET streams the agent received
}

func (b *balancer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = *b.addr.Load()
	r.Host = b.host
	resp, err := b.base.RoundTrip(r)
	if err == nil && r.Method == "GET" {
		resp.Body = &recordedBody{ReadCloser: resp.Body, b: b}
	}
	return resp, err
}

// received reports whether the agent has read piece on a GET stream.
func (b *balancer) received(piece []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Contains(b.got, piece)
}

type recordedBody struct {
	io.ReadCloser
	b *balancer
}

func (r *recordedBody) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.b.mu.Lock()
	r.b.got = append(r.b.got, p[:n]...)
	r.b.mu.Unlock()
	return n, err
}

// A drain ends an agent's standalone GET stream so that it resumes, with
// Last-Event-ID, on another proxy instance. When the drain comes while an
// event is only partly through (a large notification spans several reads),
// the stream must end as cut, not cleanly: the go-sdk client takes what a
// cleanly ended stream holds for a whole event. Cut after its id line, it
// recorded that id, resumed after it, and the event was lost; cut inside
// its data, it failed the session ("failed to decode event"). Each of the
// gateway's notifications must reach the agent once, in order.
func TestMCPDrainMidEventResumesOnAnotherProxy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		at   func(event []byte) int // where the drain finds the event
	}{
		{"after its id line", func(e []byte) int { i := bytes.Index(e, []byte("\ndata: ")); return i + 1 }},
		{"inside its data", func(e []byte) int { return bytes.Index(e, []byte("two")) + len("two") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h1 := newHarness(t, func(o *harnessOpts) {
				o.cfg.HeartbeatInterval = time.Hour
				o.srv.DrainTimeout = 5 * time.Second
			})
			h2 := newHarness(t, func(o *harnessOpts) { o.cfg.HeartbeatInterval = time.Hour })
			srv := mcp.NewServer(&mcp.Implementation{Name: "gateway", Version: "v1"}, &mcp.ServerOptions{
				SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
				UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
			})
			var armed atomic.Bool
			sent := make(chan []byte, 1)
			hd := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
				&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true})
			port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == "GET" {
					w = heldEventWriter{ResponseWriter: w, ctx: r.Context(), sent: sent, cut: func(e []byte) int {
						if bytes.Contains(e, []byte(`"file:///two`)) && armed.CompareAndSwap(true, false) {
							return tc.at(e)
						}
						return 0
					}}
				}
				hd.ServeHTTP(w, r)
			}))
			route := map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)}
			h1.put("resumebox", route)
			h2.put("resumebox", route)

			lb := &balancer{host: "50005-resumebox.cube.test", base: h1.client.Transport}
			lb.addr.Store(&h1.addr)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			updates := make(chan string, 8)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
				ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
					updates <- strings.TrimRight(strings.TrimPrefix(r.Params.URI, "file:///"), "x")
				},
			}).Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint:   "http://" + h1.addr + "/mcp",
				HTTPClient: &http.Client{Transport: lb},
				MaxRetries: 5,
			}, nil)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer cs.Close()
			two := "two" + strings.Repeat("x", 2000) // an event of several reads
			for _, name := range []string{"one", two, "three"} {
				if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "file:///" + name}); err != nil {
					t.Fatal(err)
				}
			}
			testenv.WaitFor(t, 10*time.Second, "the GET stream open at the first proxy", func() bool {
				s, _ := h1.proxy.streams.open()
				return s == 1
			})
			update := func(name string) error {
				return srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "file:///" + name})
			}
			var got []string
			next := func(want int) {
				for len(got) < want {
					select {
					case s := <-updates:
						got = append(got, s)
					case <-time.After(10 * time.Second):
						t.Fatalf("notifications %q; the next never came", got)
					}
				}
			}
			if err := update("one"); err != nil {
				t.Fatal(err)
			}
			next(1)
			armed.Store(true)
			updated := make(chan error, 1)
			go func() { updated <- update(two) }()
			var piece []byte
			select {
			case piece = <-sent:
			case <-ctx.Done():
				t.Fatal("the gateway never sent the held event")
			}
			testenv.WaitFor(t, 10*time.Second, "the event's first part at the agent", func() bool { return lb.received(piece) })
			lb.addr.Store(&h2.addr) // new connections go to the other instance
			startDrain(t, h1)
			testenv.WaitFor(t, 10*time.Second, "the GET stream resumed at the other proxy", func() bool {
				s, _ := h2.proxy.streams.open()
				return s == 1
			})
			if err := <-updated; err != nil {
				t.Fatal(err)
			}
			if err := update("three"); err != nil {
				t.Fatal(err)
			}
			next(3)
			if want := []string{"one", "two", "three"}; strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("agent got %q, want %q", got, want)
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("session after resuming on the other proxy: %v", err)
			}
		})
	}
}
