package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

//lint:file-ignore SA1019 sampling is deprecated from MCP protocol 2026-07-28 (SEP-2577), but the go-sdk still serves it for at least a year, and agents answer it

// At max_streams_per_sandbox, a POST whose Content-Length body is larger
// than the 8 KiB fasthttp reads before the handler is read whole (up to
// MaxHeldBody, within HeldBodyBudget across sandboxes) and judged: an
// agent's large answer to a sampling request passes, a large call does
// not, whatever the order of its keys.

// sizedAnswer is a JSON-RPC response (a sampling answer) of exactly n
// bytes.
func sizedAnswer(n int) string {
	const head, tail = `{"jsonrpc":"2.0","id":7,"result":{"role":"assistant","model":"m","content":{"type":"text","text":"`, `"}}}`
	return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
}

// sizedCall is a JSON-RPC request of exactly n bytes whose "method" comes
// after its params, past the first 8 KiB: only all of it tells that it is
// a call.
func sizedCall(n int) string {
	const head, tail = `{"jsonrpc":"2.0","id":2,"params":{"name":"x","arguments":{"t":"`, `"}},"method":"tools/call"}`
	return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
}

// bodyDigest is what the sandbox of heldBodyProxy answers for a body.
func bodyDigest(b []byte) string {
	return fmt.Sprintf("got %d bytes %x", len(b), sha256.Sum256(b))
}

// heldBodyProxy is a proxy with max_streams_per_sandbox 1 (unless mod
// sets another), its access log (JSON), and the sandboxes ids, each at its
// limit: as many GETs to /hold as the limit, which the sandbox holds until
// the test ends. The sandbox answers any other request 202 with
// bodyDigest of its body.
func heldBodyProxy(t *testing.T, mod func(*harnessOpts), ids ...string) (*harness, *obsLogBuf) {
	t.Helper()
	limit := 1
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		if mod != nil {
			mod(o)
		}
		limit = o.cfg.MaxStreamsPerSandbox
	})
	entered, release := make(chan struct{}, len(ids)*limit), make(chan struct{})
	t.Cleanup(func() { close(release) })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-release
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, bodyDigest(b))
	}))
	for _, id := range ids {
		h.put(id, map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
		for range limit {
			go func() {
				resp, err := h.client.Do(h.req("GET", "8080-"+id+".cube.test", "/hold", nil))
				if err == nil {
					resp.Body.Close()
				}
			}()
			testenv.Recv(t, entered, 10*time.Second, "a held request at the sandbox")
		}
		if n := h.proxy.sandboxes.get([]byte(id)).inFlight(); n != int64(limit) {
			t.Fatalf("%s: %d requests in flight with the held ones, want %d", id, n, limit)
		}
	}
	return h, logs
}

// heldBytes is how much of HeldBodyBudget is taken.
func heldBytes(p *Proxy) int64 { return p.heldBodies.used.Load() }

// postHead is the head of a POST of size bytes to host under request id.
func postHead(host, id string, size int, extra string) string {
	return fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n", host, id, size, extra)
}

// wantAnswer reads an answer from br and fails unless its status is want
// and, for a 202, it says the sandbox got body whole.
func wantAnswer(t *testing.T, br *bufio.Reader, want int, body string) (*http.Response, string) {
	t.Helper()
	resp, b := readExpectAnswer(t, br)
	if resp.StatusCode != want {
		t.Fatalf("%d %s, want %d", resp.StatusCode, b, want)
	}
	if want == http.StatusAccepted && b != bodyDigest([]byte(body)) {
		t.Fatalf("the sandbox answered %q for a %d-byte body", b, len(body))
	}
	return resp, b
}

// wantLogged waits for the access log line of request id and checks its
// status, error code and bytes_in.
func wantLogged(t *testing.T, logs *obsLogBuf, id string, status int, code string, bytesIn int) {
	t.Helper()
	e := logs.waitJSON(t, id)
	if got, _ := e["error_code"].(string); e["status"] != float64(status) || got != code || e["bytes_in"] != float64(bytesIn) {
		t.Errorf("access log %v: want status %d, error_code %q, bytes_in %d", e, status, code, bytesIn)
	}
}

func TestStreamLimitJudgesLargeBodies(t *testing.T) {
	const kib = 1 << 10
	h, logs := heldBodyProxy(t, func(o *harnessOpts) {
		o.cfg.MaxHeldBody = 32 * kib
		o.cfg.HeldBodyBudget = 32 * kib
	}, "bigbox", "otherbox")
	const host, other = "8080-bigbox.cube.test", "8080-otherbox.cube.test"
	sb := h.proxy.sandboxes.get([]byte("bigbox"))
	settled := func(t *testing.T) {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, "the slot count back to the held request", func() bool { return sb.inFlight() == 1 })
		if n := heldBytes(h.proxy); n != 0 {
			t.Fatalf("%d bytes of the budget still taken", n)
		}
	}

	for _, tc := range []struct {
		name, body string
		want       int
		code       string
	}{
		{"20 KiB sampling answer", sizedAnswer(20 * kib), 202, ""},
		{"answer at the cap", sizedAnswer(32 * kib), 202, ""},
		{"20 KiB tools/call", sizedCall(20 * kib), 429, CodeTooManyStreams},
		{"20 KiB answer with a call behind it", `[` + sizedAnswer(20*kib) + `,{"jsonrpc":"2.0","id":3,"method":"ping"}]`, 429, CodeTooManyStreams},
		{"20 KiB of malformed JSON", sizedAnswer(20 * kib)[1:], 429, CodeTooManyStreams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Pieces (as a slow link delivers them): the head and some of
			// the body, then the rest. The connection stays usable after.
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			id := "held-" + strings.ReplaceAll(tc.name, " ", "-")
			io.WriteString(c, postHead(host, id, len(tc.body), "")+tc.body[:10*kib])
			io.WriteString(c, tc.body[10*kib:])
			wantAnswer(t, br, tc.want, tc.body)
			wantLogged(t, logs, id, tc.want, tc.code, len(tc.body))
			settled(t)
			// The whole body was read: the connection serves the next.
			io.WriteString(c, postHead(host, id+"-next", len(sizedAnswer(9*kib)), "")+sizedAnswer(9*kib))
			wantAnswer(t, br, 202, sizedAnswer(9*kib))
			settled(t)
		})
	}

	t.Run("over the cap", func(t *testing.T) {
		body := sizedAnswer(32*kib + 1)
		c := dialRaw(t, h.addr)
		io.WriteString(c, postHead(host, "held-over-cap", len(body), "")+body)
		resp, b := wantAnswer(t, bufio.NewReader(c), 429, "")
		if !strings.Contains(b, CodeTooManyStreams) || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("over the cap: %s, Retry-After %q", b, resp.Header.Get("Retry-After"))
		}
		settled(t)
	})

	t.Run("chunked", func(t *testing.T) {
		// Its size is known only at its end: refused as before.
		body := sizedAnswer(20 * kib)
		c := dialRaw(t, h.addr)
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", host, len(body), body)
		wantAnswer(t, bufio.NewReader(c), 429, "")
		settled(t)
	})

	t.Run("budget taken by another sandbox", func(t *testing.T) {
		// otherbox's answer is half sent: the proxy holds its 20 KiB while
		// it waits for the rest, and bigbox's 20 KiB do not fit beside it.
		body := sizedAnswer(20 * kib)
		slow := dialRaw(t, h.addr)
		io.WriteString(slow, postHead(other, "held-slow", len(body), "")+body[:10*kib])
		testenv.WaitFor(t, 5*time.Second, "the half-sent body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })

		c := dialRaw(t, h.addr)
		br := bufio.NewReader(c)
		io.WriteString(c, postHead(host, "held-no-room", len(body), "")+body)
		if _, b := wantAnswer(t, br, 429, ""); !strings.Contains(b, "no room") {
			t.Fatalf("no room in the budget: %s", b)
		}
		testenv.WaitFor(t, 5*time.Second, "the refused request's slot freed", func() bool { return sb.inFlight() == 1 })

		io.WriteString(slow, body[10*kib:])
		wantAnswer(t, bufio.NewReader(slow), 202, body)
		testenv.WaitFor(t, 5*time.Second, "the budget given back", func() bool { return heldBytes(h.proxy) == 0 })
		// Room again; the refused one's connection is still usable (its
		// body, unread, was small enough for fasthttp to drop).
		io.WriteString(c, postHead(host, "held-room-again", len(body), "")+body)
		wantAnswer(t, br, 202, body)
		settled(t)
	})

	t.Run("client leaves midway", func(t *testing.T) {
		body := sizedAnswer(20 * kib)
		c := dialRaw(t, h.addr)
		io.WriteString(c, postHead(host, "held-left", len(body), "")+body[:10*kib])
		testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })
		c.Close()
		wantLogged(t, logs, "held-left", statusClientClosed, CodeClientClosed, 10*kib)
		settled(t)
	})

	t.Run("expect 100-continue", func(t *testing.T) {
		for _, tc := range []struct {
			body string
			want int
		}{
			{sizedAnswer(20 * kib), 202},
			{sizedCall(20 * kib), 429},
		} {
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			io.WriteString(c, postHead(host, "held-expect", len(tc.body), "Expect: 100-continue\r\n"))
			if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
				t.Fatalf("head of a %d-byte POST at the limit: %d %s, want 100", len(tc.body), resp.StatusCode, b)
			}
			io.WriteString(c, tc.body)
			wantAnswer(t, br, tc.want, tc.body)
			settled(t)
		}
		// Over the cap, the head is refused before the body is sent.
		c := dialRaw(t, h.addr)
		io.WriteString(c, postHead(host, "held-expect-over", 33*kib, "Expect: 100-continue\r\n"))
		wantAnswer(t, bufio.NewReader(c), 429, "")
		settled(t)
	})
}

// A client that stalls in the middle of a large body at the limit is cut
// at client.body_timeout, as a streamed upload is: 408, the connection
// closed, the slot and the budget given back.
func TestStreamLimitHeldBodyTimeout(t *testing.T) {
	h, logs := heldBodyProxy(t, func(o *harnessOpts) { o.srv.ClientBodyTimeout = 300 * time.Millisecond }, "slowbox")
	sb := h.proxy.sandboxes.get([]byte("slowbox"))
	body := sizedAnswer(20 << 10)
	c := dialRaw(t, h.addr)
	io.WriteString(c, postHead("8080-slowbox.cube.test", "held-stall", len(body), "")+body[:10<<10])
	br := bufio.NewReader(c)
	resp, b := wantAnswer(t, br, http.StatusRequestTimeout, "")
	if !strings.Contains(b, CodeBodyTimeout) || !resp.Close {
		t.Fatalf("a stalled body: %s (close %v), want %s and the connection closed", b, resp.Close, CodeBodyTimeout)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the 408: %v, want the connection closed", err)
	}
	wantLogged(t, logs, "held-stall", http.StatusRequestTimeout, CodeBodyTimeout, 10<<10)
	testenv.WaitFor(t, 5*time.Second, "the slot given back", func() bool { return sb.inFlight() == 1 })
	if n := heldBytes(h.proxy); n != 0 {
		t.Fatalf("%d bytes of the budget still taken", n)
	}
}

// A tool call that holds the sandbox's last slot asks the agent for a
// sampling answer (the go-sdk's CreateMessage); the agent's answer, 20 KiB
// of text, is larger than the 8 KiB fasthttp reads before the handler.
// It passes the limit and the call completes with it; refused, the call
// would wait for it until a timeout.
func TestMCPSamplingAnswerAtStreamLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := newAgentServer()
	started, ended := addHoldTool(t, srv)
	mcp.AddTool(srv, &mcp.Tool{Name: "sample"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10000,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "write a lot"}}}})
		if err != nil {
			return nil, nil, err
		}
		text := res.Content.(*mcp.TextContent).Text
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("sampled %d bytes", len(text))}}}, nil, nil
	})
	answer := bigText(20 << 10)
	copts := &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: answer}}, nil
		},
	}
	h, sb, cs, wire := streamLimitAgent(t, ctx, "samplebox", srv, copts, `"model":"m"`)

	holdCancel, holdErr := callHold(t, ctx, cs, started)
	// The sample call takes the second slot; its tool waits for the answer.
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()
	res, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "sample"})
	if err != nil {
		t.Fatalf("the call that samples at the limit: %v (the answer's POST got %v)", err, wire.statuses(`"model":"m"`))
	}
	if got := res.Content[0].(*mcp.TextContent).Text; res.IsError || got != fmt.Sprintf("sampled %d bytes", len(answer)) {
		t.Fatalf("the call that samples answered %q", got)
	}
	testenv.WaitFor(t, 10*time.Second, "the sampling answer's POST answered", func() bool { return len(wire.statuses(`"model":"m"`)) == 1 })
	if got := wire.statuses(`"model":"m"`); got[0] != http.StatusAccepted {
		t.Fatalf("the sampling answer's POST got %v, want the gateway's 202", got)
	}
	holdCancel()
	<-holdErr
	if err := testenv.Recv(t, ended, 10*time.Second, "the hold tool's end after its call's cancellation"); err == nil {
		t.Fatal("the hold tool ended without its cancellation")
	}
	testenv.WaitFor(t, 10*time.Second, "the calls' slots freed", func() bool { return sb.inFlight() == 0 })
	testenv.WaitFor(t, 10*time.Second, "the budget given back", func() bool { return heldBytes(h.proxy) == 0 })
}

// A client stalled in the middle of a large body at the limit when the
// drain deadline comes is cut then, as a stalled upload is: 504
// drain_timeout rather than a 408 at client.body_timeout, after the
// process is gone.
func TestDrainCutsHeldBody(t *testing.T) {
	const drain = 300 * time.Millisecond
	h, logs := heldBodyProxy(t, func(o *harnessOpts) { o.srv.DrainTimeout = drain }, "drainbox")
	body := sizedAnswer(20 << 10)
	c := dialRaw(t, h.addr)
	io.WriteString(c, postHead("8080-drainbox.cube.test", "held-drain", len(body), "")+body[:10<<10])
	testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	resp, b := wantAnswer(t, bufio.NewReader(c), http.StatusGatewayTimeout, "")
	if !strings.Contains(b, CodeDrainTimeout) || !resp.Close {
		t.Fatalf("a body stalled at the drain deadline: %s (close %v), want %s and the connection closed", b, resp.Close, CodeDrainTimeout)
	}
	drainEnds(t, shutdownDone, drain+10*time.Second, "the drain outlived its deadline after cutting the held body")
	wantLogged(t, logs, "held-drain", http.StatusGatewayTimeout, CodeDrainTimeout, 10<<10)
	if n := heldBytes(h.proxy); n != 0 {
		t.Fatalf("%d bytes of the budget still taken", n)
	}
}

// The bounds of what overLimit holds: 4 MiB a body and 64 MiB in all by
// default, as the README says; never more a body than max_request_body.
func TestHeldBodyDefaults(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.MaxHeldBody != 4<<20 || c.HeldBodyBudget != 64<<20 {
		t.Errorf("defaults: MaxHeldBody %d, HeldBodyBudget %d; want 4 MiB, 64 MiB", c.MaxHeldBody, c.HeldBodyBudget)
	}
	small := Config{MaxRequestBodySize: 1 << 20}
	small.setDefaults()
	if small.MaxHeldBody != 1<<20 {
		t.Errorf("MaxHeldBody %d with max_request_body 1 MiB, want 1 MiB", small.MaxHeldBody)
	}
	off := Config{MaxHeldBody: -1}
	off.setDefaults()
	if off.MaxHeldBody != -1 {
		t.Errorf("MaxHeldBody -1 (off) became %d", off.MaxHeldBody)
	}
}

// A sandbox killed or paused while the proxy reads a held body (which may
// take minutes: client.body_timeout bounds each wait, not the read) is
// not sent that body: the request gets what a new one would, 410 or 503,
// with the budget and the slot given back. A killed sandbox's address may
// already be another's, and the kill cut nothing of this request, which
// had no sandbox connection yet.
func TestStreamLimitHeldBodyKilledOrPaused(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, code string
		want                   int
	}{
		{"killed", "/admin/meta/delete", `{"sandbox_id":"heldgone"}`, CodeSandboxKilled, http.StatusGone},
		{"paused", "/admin/state", `{"sandbox_id":"heldgone","state":"paused"}`, CodeSandboxPausing, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := heldBodyProxy(t, nil, "heldgone")
			body := sizedAnswer(20 << 10)
			c := dialRaw(t, h.addr)
			io.WriteString(c, postHead("8080-heldgone.cube.test", "held-"+tc.name, len(body), "")+body[:10<<10])
			testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })
			if st, b := h.adminDo("POST", tc.path, tc.body, ""); st != http.StatusOK {
				t.Fatalf("%s: %d %s", tc.path, st, b)
			}
			io.WriteString(c, body[10<<10:])
			resp, b := readExpectAnswer(t, bufio.NewReader(c))
			if resp.StatusCode != tc.want || !strings.Contains(b, tc.code) {
				t.Fatalf("held body of a sandbox %s meanwhile: %d %s, want %d %s", tc.name, resp.StatusCode, b, tc.want, tc.code)
			}
			wantLogged(t, logs, "held-"+tc.name, tc.want, tc.code, len(body))
			if n := heldBytes(h.proxy); n != 0 {
				t.Fatalf("%d bytes of the budget still taken", n)
			}
			// The kill ends the held GET; a pause leaves it in flight.
			sb := h.proxy.sandboxes.get([]byte("heldgone"))
			left := int64(1)
			if tc.name == "killed" {
				left = 0
			}
			testenv.WaitFor(t, 5*time.Second, "the refused request's slot given back", func() bool { return sb.inFlight() == left })
		})
	}
}

// One sandbox's clients cannot hold all of HeldBodyBudget: each sandbox
// holds at most its share (HeldBodyPerSandbox, by default a quarter of
// the budget, at least one MaxHeldBody). Its half-sent bodies fill its
// share, and its next large answer gets the 429, naming the share, while
// another sandbox's large answer still passes; once its clients finish or
// leave, its share and the budget are back to 0.
func TestStreamLimitHeldBodyShare(t *testing.T) {
	const kib = 1 << 10
	h, logs := heldBodyProxy(t, func(o *harnessOpts) {
		// At a limit of 2 a sandbox may have two more requests in flight
		// for the exception: two held bodies of 20 KiB, 40 KiB in all,
		// which the budget has room for and the 32 KiB share has not.
		o.cfg.MaxStreamsPerSandbox = 2
		o.cfg.MaxHeldBody = 32 * kib
		o.cfg.HeldBodyBudget = 128 * kib
	}, "greedybox", "fairbox")
	const greedy, fair = "8080-greedybox.cube.test", "8080-fairbox.cube.test"
	if share := h.proxy.Config().HeldBodyPerSandbox; share != 32*kib {
		t.Fatalf("HeldBodyPerSandbox %d, want a quarter of the budget, 32 KiB", share)
	}
	sb := h.proxy.sandboxes.get([]byte("greedybox"))
	body := sizedAnswer(20 * kib)
	given := func(t *testing.T) {
		t.Helper()
		testenv.WaitFor(t, 5*time.Second, "the share and the budget given back", func() bool {
			return sb.held.Load() == 0 && heldBytes(h.proxy) == 0
		})
	}

	slow := dialRaw(t, h.addr)
	io.WriteString(slow, postHead(greedy, "share-slow", len(body), "")+body[:10*kib])
	testenv.WaitFor(t, 5*time.Second, "the half-sent body's bytes taken", func() bool {
		return sb.held.Load() == int64(len(body)) && heldBytes(h.proxy) == int64(len(body))
	})

	c := dialRaw(t, h.addr)
	io.WriteString(c, postHead(greedy, "share-over", len(body), "")+body)
	if _, b := wantAnswer(t, bufio.NewReader(c), 429, ""); !strings.Contains(b, "share") {
		t.Fatalf("over the sandbox's share: %s, want the share named", b)
	}
	wantLogged(t, logs, "share-over", 429, CodeTooManyStreams, fasthttpPreRead) // what fasthttp read before the handler
	// An "Expect: 100-continue" head is refused on the share's room too,
	// before its body is sent.
	e := dialRaw(t, h.addr)
	io.WriteString(e, postHead(greedy, "share-expect", len(body), "Expect: 100-continue\r\n"))
	if _, b := wantAnswer(t, bufio.NewReader(e), 429, ""); !strings.Contains(b, "share") {
		t.Fatalf("expect head over the sandbox's share: %s, want the share named", b)
	}

	other := dialRaw(t, h.addr)
	io.WriteString(other, postHead(fair, "share-other", len(body), "")+body)
	wantAnswer(t, bufio.NewReader(other), 202, body)

	io.WriteString(slow, body[10*kib:])
	wantAnswer(t, bufio.NewReader(slow), 202, body)
	given(t)

	// A client that leaves midway gives its share back too.
	left := dialRaw(t, h.addr)
	io.WriteString(left, postHead(greedy, "share-left", len(body), "")+body[:10*kib])
	testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return sb.held.Load() == int64(len(body)) })
	left.Close()
	wantLogged(t, logs, "share-left", statusClientClosed, CodeClientClosed, 10*kib)
	given(t)
}

// The share's defaults and bounds: a quarter of HeldBodyBudget, never
// less than one MaxHeldBody; negative (no share) stays.
func TestHeldBodyShareDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Config
		want int64
	}{
		{"defaults", Config{}, 16 << 20},
		{"a quarter below one body", Config{MaxHeldBody: 8 << 20, HeldBodyBudget: 16 << 20}, 8 << 20},
		{"body clamped by max_request_body", Config{MaxRequestBodySize: 1 << 20, HeldBodyBudget: 2 << 20}, 1 << 20},
		{"set", Config{HeldBodyPerSandbox: 5 << 20}, 5 << 20},
		{"no share", Config{HeldBodyPerSandbox: -1}, -1},
	} {
		c := tc.in
		c.setDefaults()
		if c.HeldBodyPerSandbox != tc.want {
			t.Errorf("%s: HeldBodyPerSandbox %d, want %d", tc.name, c.HeldBodyPerSandbox, tc.want)
		}
	}
}

// A route changed or deleted while the proxy reads a held body (minutes,
// at worst) decides where the body goes: the route is looked up again
// after the read, as a new request's would be, so the body goes to the
// sandbox's new address, or gets the 404 of a deleted route, never to the
// address looked up before the read. The share and the budget are given
// back to the entry they were taken on either way.
func TestStreamLimitHeldBodyRouteChanged(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		want               int
		code               string
	}{
		{"moved", "PUT", `{"HostIP":"127.0.0.1","CreatedAt":"1","8080":"%d"}`, http.StatusAccepted, ""},
		{"deleted", "DELETE", "", http.StatusNotFound, CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := heldBodyProxy(t, nil, "movebox")
			sb := h.proxy.sandboxes.get([]byte("movebox"))
			moved := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "moved: "+bodyDigest(b))
			}))
			body := sizedAnswer(20 << 10)
			c := dialRaw(t, h.addr)
			io.WriteString(c, postHead("8080-movebox.cube.test", "held-"+tc.name, len(body), "")+body[:10<<10])
			testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })
			admin := tc.body
			if strings.Contains(admin, "%d") {
				admin = fmt.Sprintf(admin, moved)
			}
			if st, b := h.adminDo(tc.method, "/admin/routes/movebox", admin, ""); st != http.StatusOK {
				t.Fatalf("%s /admin/routes/movebox: %d %s", tc.method, st, b)
			}
			io.WriteString(c, body[10<<10:])
			resp, b := readExpectAnswer(t, bufio.NewReader(c))
			if resp.StatusCode != tc.want || tc.code != "" && !strings.Contains(b, tc.code) {
				t.Fatalf("held body of a route %s meanwhile: %d %s, want %d %s", tc.name, resp.StatusCode, b, tc.want, tc.code)
			}
			if tc.want == http.StatusAccepted && b != "moved: "+bodyDigest([]byte(body)) {
				t.Fatalf("held body of a route moved meanwhile: the old address answered %q", b)
			}
			wantLogged(t, logs, "held-"+tc.name, tc.want, tc.code, len(body))
			testenv.WaitFor(t, 5*time.Second, "the share and the budget given back", func() bool {
				return sb.held.Load() == 0 && heldBytes(h.proxy) == 0
			})
			// The request that held the other slot waited on the old
			// address: the change cut it (rejudge), so both are back.
			testenv.WaitFor(t, 5*time.Second, "the slots given back", func() bool { return sb.inFlight() == 0 })
		})
	}
}

// A route removed straight from the store while a held body was read (as
// the control plane removes a sandbox in Redis, without meta/delete) is
// judged by the read after the body: the 404, and the entry's pause,
// set during the read, forgotten with the route, as a request that found
// the route gone at once would forget it. The request's first lookup was
// a cache hit, older than the pause: forgetting by it kept the pause.
func TestStreamLimitHeldBodyRouteRemovedFromStore(t *testing.T) {
	h, logs := heldBodyProxy(t, nil, "gonebox")
	sb := h.proxy.sandboxes.get([]byte("gonebox"))
	body := sizedAnswer(20 << 10)
	c := dialRaw(t, h.addr)
	io.WriteString(c, postHead("8080-gonebox.cube.test", "held-gone", len(body), "")+body[:10<<10])
	testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })
	if st, b := h.adminDo("POST", "/admin/state", `{"sandbox_id":"gonebox","state":"paused"}`, ""); st != http.StatusOK {
		t.Fatalf("pause: %d %s", st, b)
	}
	if ok, err := h.store.Remove("gonebox"); !ok || err != nil {
		t.Fatalf("the route was not in the store: %v", err)
	}
	h.cache.Invalidate("gonebox")
	io.WriteString(c, body[10<<10:])
	resp, b := readExpectAnswer(t, bufio.NewReader(c))
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(b, CodeNotFound) {
		t.Fatalf("held body of a route removed from the store: %d %s, want 404 %s", resp.StatusCode, b, CodeNotFound)
	}
	wantLogged(t, logs, "held-gone", http.StatusNotFound, CodeNotFound, len(body))
	// The held /hold request keeps the entry (its count), not the pause.
	if e := h.proxy.sandboxes.peek("gonebox"); e != sb {
		t.Fatalf("entry after the 404: %p, want the one with the held request in flight (%p)", e, sb)
	}
	if st := sb.state(); st != stateRunning {
		t.Fatalf("entry's state after the 404: %d, want %d (the pause forgotten with the route)", st, stateRunning)
	}
}

// cubeproxy_held_body_bytes shows how much of HeldBodyBudget is taken: a
// half-sent body's declared size while it is read, 0 once it was sent.
func TestHeldBodyGauge(t *testing.T) {
	tel := obsTelemetry(t, nil)
	h, _ := heldBodyProxy(t, func(o *harnessOpts) { o.cfg.Telemetry = tel }, "gaugebox")
	admin := obsMetricsAdmin(t, h, tel)
	if v := gaugeValue(t, admin, "cubeproxy_held_body_bytes"); v != 0 {
		t.Fatalf("cubeproxy_held_body_bytes = %v with nothing held, want 0", v)
	}
	body := sizedAnswer(20 << 10)
	c := dialRaw(t, h.addr)
	io.WriteString(c, postHead("8080-gaugebox.cube.test", "held-gauge", len(body), "")+body[:10<<10])
	testenv.WaitFor(t, 5*time.Second, "the body's bytes taken", func() bool { return heldBytes(h.proxy) == int64(len(body)) })
	if v := gaugeValue(t, admin, "cubeproxy_held_body_bytes"); v != float64(len(body)) {
		t.Fatalf("cubeproxy_held_body_bytes = %v while a %d-byte body is read", v, len(body))
	}
	io.WriteString(c, body[10<<10:])
	wantAnswer(t, bufio.NewReader(c), http.StatusAccepted, body)
	testenv.WaitFor(t, 5*time.Second, "cubeproxy_held_body_bytes back to 0", func() bool {
		return gaugeValue(t, admin, "cubeproxy_held_body_bytes") == 0
	})
}

// CheckHeldBodies (run by New, serve and check) refuses bounds under
// which a body MaxHeldBody allows could never be held, judged with the
// defaults in effect; "off" values pass.
func TestCheckHeldBodies(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string // "" = accepted
	}{
		{"defaults", Config{}, ""},
		{"holding off", Config{MaxHeldBody: -1, HeldBodyBudget: 1}, ""},
		{"no share", Config{HeldBodyPerSandbox: -1}, ""},
		{"small budget, share derived", Config{MaxHeldBody: 1 << 20, HeldBodyBudget: 2 << 20}, ""},
		{"body clamped by max_request_body", Config{MaxRequestBodySize: 1 << 20, HeldBodyBudget: 1 << 20}, ""},
		{"negative budget", Config{HeldBodyBudget: -1}, "held_body_budget: -1 is negative"},
		{"body above the default budget", Config{MaxHeldBody: 65<<20 + 1}, "max_held_body (68157441 bytes) is above held_body_budget (67108864 bytes)"},
		{"share below a body", Config{HeldBodyPerSandbox: 1 << 20}, "held_body_per_sandbox (1048576 bytes) is below max_held_body (4194304 bytes)"},
		// A max_held_body above max_request_body is taken as the latter:
		// the refusal names the value written, which the operator looks
		// for, and the one it was taken as.
		{"clamped body above the budget", Config{MaxHeldBody: 999999999999},
			"max_held_body (999999999999 bytes, taken as max_request_body's 268435456) is above held_body_budget (67108864 bytes)"},
		{"share below a clamped body", Config{MaxRequestBodySize: 8 << 20, MaxHeldBody: 999999999999, HeldBodyPerSandbox: 1 << 20},
			"held_body_per_sandbox (1048576 bytes) is below max_held_body (999999999999 bytes, taken as max_request_body's 8388608)"},
	} {
		err := tc.c.CheckHeldBodies()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(Config{HeldBodyBudget: -1}, nil); err == nil {
		t.Error("New took a negative HeldBodyBudget")
	}
}

// A held body goes to the sandbox from memory, watched for an early
// answer as a streamed upload is: a sandbox that refuses it from the head
// alone (a 413) and then neither reads nor closes has its answer relayed
// at once, and the request's slot, share and held bytes given back, not
// kept until upstream.idle_timeout while the write waits for a read that
// never comes.
func TestHeldBodyAnsweredEarly(t *testing.T) {
	size := unsendableBodySize()
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.MaxRequestBodySize = 2 * size
		o.cfg.MaxHeldBody = size
		o.cfg.HeldBodyBudget = 2 * size
		o.cfg.IdleStreamTimeout = time.Hour
	})
	ln := testenv.ServeTCP(t, func(c net.Conn) {
		// Small: the body cannot fill the socket buffers unread.
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		for {
			l, err := br.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		if strings.HasPrefix(line, "GET /hold ") {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
		} else {
			io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\n\r\ntoo large")
		}
		// Neither reads nor closes: closed when the test ends.
	})
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	h.put("earlybox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
	sb := h.proxy.sandboxes.get([]byte("earlybox"))
	hold, err := h.client.Do(h.req("GET", "8080-earlybox.cube.test", "/hold", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Body.Close()
	if n := sb.inFlight(); n != 1 {
		t.Fatalf("%d requests in flight with the stream open, want 1", n)
	}
	// Without the watch the write waits for the hour of IdleStreamTimeout:
	// the bound only ends that wait, and the harness client's 30 s does
	// not apply. A tight one failed a passing run: the body is read whole,
	// judged and copied under -race, 9-20 s on a 2-core machine at load 8
	// (2 of 5 runs there failed at 20 s).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := h.req("POST", "8080-earlybox.cube.test", "/mcp", strings.NewReader(sizedAnswer(int(size)))).WithContext(ctx)
	client := *h.client
	client.Timeout = 0
	resp, err := client.Do(r)
	if err != nil {
		t.Fatalf("a held body the sandbox refused early: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large" {
		t.Fatalf("a held body the sandbox refused early: %d %q, want its 413", resp.StatusCode, b)
	}
	testenv.WaitFor(t, 5*time.Second, "the share and the budget given back", func() bool {
		return sb.held.Load() == 0 && heldBytes(h.proxy) == 0
	})
	testenv.WaitFor(t, 5*time.Second, "the request's slot given back", func() bool { return sb.inFlight() == 1 })
}

// unsendableBodySize is the size of a body a sandbox that reads none of it
// cannot be sent whole: twice what loopback can buffer, the sender's send
// buffer at most (its autotuning cap, tcp_wmem's last value) and the
// receiver's before it stopped reading (tcp_rmem's default), and at least
// 8 MiB. Derived rather than fixed large: every byte is read, judged and
// copied under -race: about a third of a second a MiB at load 8.
func unsendableBodySize() int64 {
	buffered := int64(4<<20 + 128<<10) // Linux's defaults
	if w, r := procSysInts("/proc/sys/net/ipv4/tcp_wmem"), procSysInts("/proc/sys/net/ipv4/tcp_rmem"); len(w) == 3 && len(r) == 3 {
		buffered = w[2] + r[1]
	}
	return max(2*buffered, 8<<20)
}

// procSysInts reads the numbers of a /proc/sys file; nil if it cannot.
func procSysInts(path string) []int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int64
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}
