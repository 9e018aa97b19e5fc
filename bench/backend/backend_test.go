package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func startFast(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newFastBackend(10 * time.Second).server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func TestFastEndpointsServeExactSizes(t *testing.T) {
	base := startFast(t)
	cases := []struct {
		path string
		size int
	}{{"/small", 64}, {"/bytes?size=1000", 1000}, {"/bytes", 64 << 10}}
	for _, tc := range cases {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) != tc.size {
			t.Errorf("%s: status %d, %d bytes, want %d", tc.path, resp.StatusCode, len(b), tc.size)
		}
	}
}

func TestSSEEventsCarrySendTimeAndExactSize(t *testing.T) {
	base := startFast(t)
	before := time.Now().UnixNano()
	resp, err := http.Get(base + "/sse?size=100&n=3&interval_ms=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	var prevPad string
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		blank, _ := br.ReadString('\n')
		if blank != "\n" || len(line)+1 != 100 || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("event %d = %q + %q, want 100 bytes of data: …\\n\\n", i, line, blank)
		}
		ts, err := strconv.ParseInt(line[6:25], 10, 64)
		if err != nil || ts < before || ts > time.Now().UnixNano() {
			t.Fatalf("event %d stamp %q not a send time", i, line[6:25])
		}
		if pad := line[26:]; pad == prevPad {
			t.Fatalf("event %d repeats the previous padding (would compress unrealistically)", i)
		} else {
			prevPad = pad
		}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("trailing bytes %q", rest)
	}
}

// TestSSEEndsAsAsked: a stream ends with its last chunk, or without it
// (cut=1, a sandbox dying mid-stream); either way the connection closes,
// and the head says so (a proxy must not pool it).
func TestSSEEndsAsAsked(t *testing.T) {
	base := startFast(t)
	for _, c := range []struct {
		query   string
		wantErr bool // the chunked body breaks off
	}{{"", false}, {"&cut=1", true}} {
		resp, err := http.Get(base + "/sse?size=64&n=2" + c.query)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if (err != nil) != c.wantErr || len(b) != 128 {
			t.Errorf("%q: %d bytes, err %v; want 128 bytes, error %t", c.query, len(b), err, c.wantErr)
		}
		if !resp.Close {
			t.Errorf("%q: the head does not say Connection: close", c.query)
		}
	}
}

func TestSSEIdleHoldsUntilPeerCloses(t *testing.T) {
	base := startFast(t)
	resp, err := http.Get(base + "/sse?size=64&n=1&hold_ms=5000")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, _ = br.ReadString('\n')
		_, err := br.ReadByte() // blocks while the stream is held open
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("idle stream ended early: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	resp.Body.Close()
}

func TestWSEchoesMessages(t *testing.T) {
	srv := httptest.NewServer(newStdMux(10 * time.Second))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	for _, msg := range []string{"a", strings.Repeat("x", 40000)} {
		if err := c.Write(ctx, websocket.MessageBinary, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		typ, b, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageBinary || string(b) != msg {
			t.Fatalf("echo of %d bytes: %v %d bytes %v", len(msg), typ, len(b), err)
		}
	}
}

func TestMCPProgressToolStreamsNotifications(t *testing.T) {
	srv := httptest.NewServer(newStdMux(10 * time.Second))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var progress atomic.Int64
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 4},
		Meta: mcp.Meta{"progressToken": "p1"}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	for end := time.Now().Add(5 * time.Second); progress.Load() < 4 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := progress.Load(); n != 4 {
		t.Fatalf("%d progress notifications, want 4", n)
	}
}
