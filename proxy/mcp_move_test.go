package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// addRelayTool adds "relay": it reports progress 1, waits for the agent to
// acknowledge it (acks), then for release, then reports progress 2, waits
// for that acknowledgement too and answers "relayed". It never sleeps: each
// progress is proven to have reached the agent while the call is open.
func addRelayTool(srv *mcp.Server, acks <-chan float64, release <-chan struct{}) {
	mcp.AddTool(srv, &mcp.Tool{Name: "relay"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		for i := 1; i <= 2; i++ {
			if i == 2 {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: 3}); err != nil {
				return nil, nil, err
			}
			select {
			case <-acks:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "relayed"}}}, nil, nil
	})
}

// The sandbox is scheduled to another address while a go-sdk agent has its
// standalone GET stream and a tool call reporting progress open (a VM
// restored elsewhere from its snapshot: the same gateway, its sessions and
// event store, behind a new address; here one gateway served on two
// listeners). The route change cuts both streams at the old address, the
// agent resumes both at the new one with Last-Event-ID, and gets every
// progress and notification once: the call's second progress and result,
// the list change announced after the move. A request sent right after the
// move goes to the new address. Without the cut, the streams stay on an
// address the sandbox has left, silent until upstream.idle_timeout.
func TestMCPRouteMovedMidSession(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	acks := make(chan float64, 4)
	release := make(chan struct{})
	addRelayTool(srv, acks, release)
	gw := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true})
	var mu sync.Mutex
	var resumedAtNew []string // Last-Event-IDs of the GETs the new address got
	var openAtOld, reqsAtNew atomic.Int64
	oldPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openAtOld.Add(1)
		defer openAtOld.Add(-1)
		gw.ServeHTTP(w, r)
	}))
	newPort := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqsAtNew.Add(1)
		if id := r.Header.Get("Last-Event-ID"); r.Method == "GET" && id != "" {
			mu.Lock()
			resumedAtNew = append(resumedAtNew, id)
			mu.Unlock()
		}
		gw.ServeHTTP(w, r)
	}))
	put := func(port uint16) {
		b, _ := json.Marshal(map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port)})
		if st, out := h.adminDo("PUT", "/admin/routes/movebox", string(b), ""); st != 200 {
			t.Fatalf("PUT route: %d %s", st, out)
		}
	}
	put(oldPort)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var progress [3]atomic.Int64
	changed := make(chan struct{}, 4)
	cs := agentConnect(t, ctx, h, "50005-movebox.cube.test", &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if p := int(req.Params.Progress); p == 1 || p == 2 {
				progress[p].Add(1)
			}
			acks <- req.Params.Progress
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}, &mcp.StreamableClientTransport{MaxRetries: 3})
	listChangedArrives(t, ctx, h, srv, changed, "standalone GET stream")
	done := callTool(ctx, cs, "relay", "relayed")
	testenv.WaitFor(t, 5*time.Second, "the call's first progress, acknowledged", func() bool {
		return progress[1].Load() == 1 && len(acks) == 0
	})

	put(newPort)
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("a request right after the move: %v", err)
	}
	if reqsAtNew.Load() == 0 {
		t.Fatal("a request right after the move did not reach the new address")
	}
	testenv.WaitFor(t, 5*time.Second, "the old address's streams ended", func() bool { return openAtOld.Load() == 0 })
	close(release)
	addNoopTool(srv, "after-move")
	if err := testenv.Recv(t, done, 5*time.Second, "the call's result"); err != nil {
		t.Fatalf("call across the move: %v", err)
	}
	testenv.Recv(t, changed, 5*time.Second, "the list change announced after the move")
	mu.Lock()
	resumed := len(resumedAtNew)
	mu.Unlock()
	if resumed != 2 {
		t.Errorf("resumed %d streams at the new address with Last-Event-ID (%v), want 2: the GET stream and the call", resumed, resumedAtNew)
	}
	if progress[1].Load() != 1 || progress[2].Load() != 1 {
		t.Errorf("progress 1 arrived %d times, 2 %d times; want once each", progress[1].Load(), progress[2].Load())
	}
	select {
	case <-changed:
		t.Error("a list change arrived twice")
	default:
	}
}

// reusePort listens with SO_REUSEPORT, so that a sandbox's gateway started
// again binds its port before the old one closes: a port closed and bound
// again could be taken by another socket of the machine in between.
var reusePort = net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); err != nil {
		return err
	}
	return serr
}}

// holdPort binds a socket to addr's port without listening (SO_REUSEPORT,
// as reusePort's listeners): connections to the port are refused, as while
// a gateway restarts, yet no other socket of the machine can take the port
// before the new gateway binds it. It returns the release.
func holdPort(t *testing.T, addr *net.TCPAddr) func() {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("hold port: socket: %v", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		unix.Close(fd)
		t.Fatalf("hold port: SO_REUSEPORT: %v", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: addr.Port}); err != nil {
		unix.Close(fd)
		t.Fatalf("hold port %d: bind: %v", addr.Port, err)
	}
	var once sync.Once
	release := func() { once.Do(func() { unix.Close(fd) }) }
	t.Cleanup(release)
	return release
}

// The sandbox's gateway process restarts in place (same route, same port,
// its sessions gone) while a go-sdk agent has its standalone GET stream
// open and the proxy holds idle connections to the old process. The stream
// ends at once; while the port is closed a request gets the proxy's 502 at
// once (transient to the go-sdk); the agent's first call once the new
// gateway listens reaches it, no failure kept from the closed port, and
// gets its 404 for the old session (ErrSessionMissing), not a 502 from a
// pooled connection the old process closed; a new session works at once.
func TestMCPGatewayRestartsInPlace(t *testing.T) {
	h := newHarness(t)
	serve := func(ln net.Listener) *http.Server {
		srv := newAgentServer()
		bs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
			&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})}
		go bs.Serve(ln)
		return bs
	}
	ln, err := reusePort.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	old := serve(ln)
	t.Cleanup(func() { old.Close() })
	h.put("inplace", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(uint16(ln.Addr().(*net.TCPAddr).Port))})
	host := "50005-inplace.cube.test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{MaxRetries: 1})
	call := func(cs *mcp.ClientSession) error {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}})
		return err
	}
	for range 3 { // connections for the pool
		if err := call(cs); err != nil {
			t.Fatalf("call before the restart: %v", err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the standalone GET stream is open", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 1
	})

	release := holdPort(t, ln.Addr().(*net.TCPAddr))
	old.Close() // its listener and every connection, the GET stream's too
	testenv.WaitFor(t, 5*time.Second, "the standalone GET stream ended at the proxy", func() bool {
		s, _ := h.proxy.streams.open()
		return s == 0
	})
	r := h.req("POST", host, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Mcp-Session-Id", cs.ID())
	resp := h.do(r)
	var refusal struct{ Code string }
	err = json.NewDecoder(resp.Body).Decode(&refusal)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || err != nil || refusal.Code != CodeUpstreamConnect {
		t.Fatalf("request while the port is closed: %d, code %q (%v), want 502 %s", resp.StatusCode, refusal.Code, err, CodeUpstreamConnect)
	}
	ln2, err := reusePort.Listen(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	release()
	nb := serve(ln2)
	t.Cleanup(func() { nb.Close() })
	if err := call(cs); !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("call on the old session after the restart: %v, want ErrSessionMissing", err)
	}
	cs2 := agentConnect(t, ctx, h, host, nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	if err := call(cs2); err != nil {
		t.Fatalf("call on a new session after the restart: %v", err)
	}
}

// rollbackListener hands out connections that a rollback (rolledBack)
// kills: each connection open at that moment resets at the next request
// it reads, as a sandbox restored from its snapshot resets what comes on a
// connection opened after the snapshot. Later connections work.
type rollbackListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*rollbackConn
}

func (l *rollbackListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	rc := &rollbackConn{TCPConn: c.(*net.TCPConn)}
	l.mu.Lock()
	l.conns = append(l.conns, rc)
	l.mu.Unlock()
	return rc, nil
}

// rolledBack dooms every connection accepted so far.
func (l *rollbackListener) rolledBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.doomed.Store(true)
	}
}

type rollbackConn struct {
	*net.TCPConn
	doomed atomic.Bool
}

func (c *rollbackConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	if n > 0 && c.doomed.Load() {
		_ = c.SetLinger(0)
		_ = c.TCPConn.Close() // a reset, the request unread
		return 0, net.ErrClosed
	}
	return n, err
}

// A sandbox restored from its snapshot resets the proxy's idle connections
// opened after the snapshot, and the proxy does not re-send a POST (the
// sandbox might have read it): the agent's first call after the restore
// fails with the proxy's 502 upstream_reset, "Bad Gateway" to the go-sdk,
// which takes it as transient and re-sends nothing; the same session's next
// call works. A status the go-sdk does not take as transient (a 4xx; it
// takes 429, 500, 502, 503 and 504 so) would end every session of the
// sandbox at its restore; a POST re-sent would run a call the sandbox may
// have read twice.
func TestMCPCallAfterSnapshotRestore(t *testing.T) {
	h := newHarness(t)
	srv := newAgentServer()
	ln := &rollbackListener{Listener: listen(t, "127.0.0.1:0")}
	bs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})}
	go bs.Serve(ln)
	t.Cleanup(func() { bs.Close() })
	h.put("restored", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(uint16(ln.Addr().(*net.TCPAddr).Port))})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := agentConnect(t, ctx, h, "50005-restored.cube.test", nil, &mcp.StreamableClientTransport{DisableStandaloneSSE: true})
	call := func() error {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"n": 3}})
		return err
	}
	if err := call(); err != nil {
		t.Fatalf("call before the restore: %v", err)
	}
	// Every connection the session opened is back in the pool (each goes
	// back a moment after the agent has its answer), for the next call to
	// take the newest and its reset to drop the others. There may be two:
	// a request that went out while an earlier one's connection was still
	// ending its answer opened another. One still busy at the rollback
	// would come back after the reset, doomed but not dropped (a restored
	// sandbox's busy connection fails too; rollbackConn lets it finish),
	// and fail the call after.
	testenv.WaitFor(t, 5*time.Second, "only idle sandbox connections", func() bool {
		_, idle := h.proxy.pools.gauges()
		return idle > 0 && idle == poolConns(h)
	})
	ln.rolledBack()
	if err := call(); err == nil || !strings.HasSuffix(err.Error(), "Bad Gateway") {
		t.Fatalf("first call after the restore: %v, want Bad Gateway", err)
	}
	if err := call(); err != nil {
		t.Fatalf("the same session's next call: %v", err)
	}
}
