package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
)

// The soak's traffic: many small actors, each a loop of one kind of
// exchange ending one way, all running at once against one proxy. Every
// actor paces itself (a pause between operations) so the whole mix stays
// at a fraction of one core: the soak looks for what accumulates, not for
// the proxy's ceiling.

// soakOpTimeout bounds every single operation, so that a hung exchange
// shows as an error instead of stalling its actor.
const soakOpTimeout = 10 * time.Second

// actorStats counts one actor's outcomes: ok, expected refusals (a 410
// from a killed sandbox, a 503 from a paused one) and unexpected ones.
type actorStats struct {
	name            string
	ok, expected    atomic.Int64
	unexpected      atomic.Int64
	mu              sync.Mutex
	firstUnexpected string
}

func (a *actorStats) fail(err error) {
	a.unexpected.Add(1)
	a.mu.Lock()
	if a.firstUnexpected == "" {
		a.firstUnexpected = err.Error()
	}
	a.mu.Unlock()
}

// soakLoad is the shared state of the traffic actors.
type soakLoad struct {
	addr, admin string
	fast, std   int
	hostTmpl    string
	rdb         *redis.Client
	channel     string // Redis invalidation channel
	mcpClient   *mcp.Client
	adminHC     *http.Client

	mu     sync.Mutex
	actors []*actorStats

	killEvery, pauseEvery time.Duration
	only                  map[string]bool // actors to run; empty = all
	kills, pauses         atomic.Int64
	coldSeq, unkSeq       atomic.Int64
	nonce                 string

	// accessLog, with pid and hupEvery, is the proxy's access-log file
	// that rotator renames before each SIGHUP; empty = no rotation.
	accessLog string
	pid       int
	hupEvery  time.Duration
	rotations atomic.Int64
}

func (l *soakLoad) stats(name string) *actorStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.actors {
		if a.name == name {
			return a
		}
	}
	a := &actorStats{name: name}
	l.actors = append(l.actors, a)
	return a
}

func (l *soakLoad) host(port int, id string) string {
	return fmt.Sprintf("%d-%s", port, id) + l.hostTmpl
}

// Sandboxes of the soak. victims are killed and re-created while they have
// streams open; pausy is paused and resumed under traffic.
const soakSandbox, soakPausy = "soak", "pausy"

var soakVictims = []string{"victim-0", "victim-1", "victim-2"}

// writeRoute stores the route of id (both backend ports) in Redis, as the
// control plane does, with createdAt as its incarnation.
func (l *soakLoad) writeRoute(ctx context.Context, id string, createdAt int64) error {
	f, s := strconv.Itoa(l.fast), strconv.Itoa(l.std)
	err := l.rdb.HSet(ctx, routeKeyPrefix+id, "HostIP", "127.0.0.1", "SandboxIP", "127.0.0.1",
		"CreatedAt", strconv.FormatInt(createdAt, 10), f, f, s, s).Err()
	if err != nil {
		return fmt.Errorf("redis hset route %s: %w", id, err)
	}
	return nil
}

// adminPost sends a JSON body to the admin API and wants a 200.
func (l *soakLoad) adminPost(path string, body any) error {
	b, _ := json.Marshal(body)
	resp, err := l.adminHC.Post("http://"+l.admin+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("admin %s: status %d: %s", path, resp.StatusCode, msg)
	}
	return nil
}

// run starts every actor; they stop when ctx ends, and run returns once
// all of them (and every connection they held) are gone.
func (l *soakLoad) run(ctx context.Context) {
	var wg sync.WaitGroup
	skip := func(name string) bool { return len(l.only) > 0 && !l.only[name] }
	spawn := func(name string, n int, pause time.Duration, op func(ctx context.Context, a *actorStats, i int)) {
		if skip(name) {
			return
		}
		a := l.stats(name)
		for w := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					op(ctx, a, w*1_000_000+i)
					sleepCtx(ctx, pause)
				}
			}()
		}
	}
	spawnConn := func(name string, n int, pause time.Duration, id string, port int, path string, want ...int) {
		if skip(name) {
			return
		}
		a := l.stats(name)
		req := buildGET(path, l.host(port, id))
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.keepAlive(ctx, a, req, pause, want)
			}()
		}
	}
	spawnConn("get-keepalive", 3, 4*time.Millisecond, soakSandbox, l.fast, "/small", 200)
	spawnConn("bytes-64k", 1, 20*time.Millisecond, soakSandbox, l.fast, "/bytes?size=65536", 200)
	spawnConn("pausy-get", 1, 20*time.Millisecond, soakPausy, l.fast, "/small", 200, -503)
	spawn("get-newconn", 1, 10*time.Millisecond, l.getNewConn)
	spawn("unknown-404", 1, 50*time.Millisecond, l.unknown)
	spawn("cold-id", 1, 400*time.Millisecond, l.cold)
	spawn("reset", 1, 50*time.Millisecond, l.reset)
	spawn("sse-complete", 1, 20*time.Millisecond, l.sseComplete)
	spawn("sse-client-cut", 2, 20*time.Millisecond, l.sseClientCut)
	spawn("sse-sandbox-cut", 1, 20*time.Millisecond, l.sseSandboxCut)
	spawn("sse-silent-cut", 2, 20*time.Millisecond, l.sseSilentCut)
	spawn("upload", 1, 20*time.Millisecond, l.upload)
	spawn("ws", 2, 20*time.Millisecond, l.wsSession)
	spawn("mcp", 2, 50*time.Millisecond, l.mcpSession)
	for _, v := range soakVictims {
		spawn("victim-sse", 1, 100*time.Millisecond, func(ctx context.Context, a *actorStats, _ int) { l.victimSSE(ctx, a, v) })
		spawn("victim-ws", 1, 100*time.Millisecond, func(ctx context.Context, a *actorStats, _ int) { l.victimWS(ctx, a, v) })
	}
	if !skip("kill+recreate") {
		wg.Add(1)
		go func() { defer wg.Done(); l.killer(ctx) }()
	}
	if !skip("pause+resume") {
		wg.Add(1)
		go func() { defer wg.Done(); l.pauser(ctx) }()
	}
	if l.accessLog != "" && !skip("rename+sighup") {
		wg.Add(1)
		go func() { defer wg.Done(); l.rotator(ctx) }()
	}
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// classify counts status in a: ok when want lists it, an expected refusal
// when want lists its negative, else a failure.
func classify(a *actorStats, status int, want []int) {
	for _, w := range want {
		switch {
		case status == w:
			a.ok.Add(1)
			return
		case status == -w:
			a.expected.Add(1)
			return
		}
	}
	a.fail(fmt.Errorf("status %d", status))
}

// soakRT is one round trip on a keep-alive connection with a per-operation
// deadline.
func soakRT(rc *rawConn, req []byte) (int, int64, error) {
	if rc.conn != nil {
		_ = rc.conn.SetDeadline(time.Now().Add(soakOpTimeout))
	} else {
		rc.deadline = time.Now().Add(soakOpTimeout)
	}
	return rc.roundTrip(req)
}

// keepAlive sends req back to back (with pause) on one connection.
func (l *soakLoad) keepAlive(ctx context.Context, a *actorStats, req []byte, pause time.Duration, want []int) {
	rc := newRawConn(l.addr, 64<<10)
	defer rc.close()
	for ctx.Err() == nil {
		st, _, err := soakRT(rc, req)
		if err != nil {
			a.fail(err)
		} else {
			classify(a, st, want)
		}
		sleepCtx(ctx, pause)
	}
}

// getNewConn is one request on a connection of its own, closed after.
func (l *soakLoad) getNewConn(_ context.Context, a *actorStats, _ int) {
	rc := newRawConn(l.addr, 4<<10)
	defer rc.close()
	st, _, err := soakRT(rc, buildGET("/small", l.host(l.fast, soakSandbox)))
	if err != nil {
		a.fail(err)
		return
	}
	classify(a, st, []int{200})
}

// unknown asks for a sandbox no route names: 404 (and a negative cache
// entry, one per id).
func (l *soakLoad) unknown(_ context.Context, a *actorStats, _ int) {
	rc := newRawConn(l.addr, 4<<10)
	defer rc.close()
	id := fmt.Sprintf("unk-%s-%d", l.nonce, l.unkSeq.Add(1))
	st, _, err := soakRT(rc, buildGET("/small", l.host(l.fast, id)))
	if err != nil {
		a.fail(err)
		return
	}
	classify(a, st, []int{-404})
}

// cold writes a new sandbox to Redis, requests it once (a cache miss, a
// new upstream pool), then removes it as the control plane would: DEL and
// an invalidation on the channel.
func (l *soakLoad) cold(ctx context.Context, a *actorStats, _ int) {
	id := fmt.Sprintf("cold-%s-%d", l.nonce, l.coldSeq.Add(1))
	if err := l.writeRoute(ctx, id, time.Now().UnixNano()); err != nil {
		if ctx.Err() == nil {
			a.fail(err)
		}
		return
	}
	defer func() {
		bg := context.Background()
		_ = l.rdb.Del(bg, routeKeyPrefix+id).Err()
		_ = l.rdb.Publish(bg, l.channel, id).Err()
	}()
	rc := newRawConn(l.addr, 4<<10)
	defer rc.close()
	st, _, err := soakRT(rc, buildGET("/small", l.host(l.fast, id)))
	if err != nil {
		a.fail(err)
		return
	}
	classify(a, st, []int{200})
}

// resetClose closes c with SO_LINGER 0: the peer gets a reset, not a FIN.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// reset is a client that resets its connection at four moments: mid-way
// through a 4 MiB download, in an SSE stream, half-way through sending a
// request head, and in a WebSocket with an echo on its way back.
func (l *soakLoad) reset(_ context.Context, a *actorStats, i int) {
	rc := newRawConn(l.addr, 16<<10)
	rc.deadline = time.Now().Add(soakOpTimeout)
	if err := rc.dial(); err != nil {
		a.fail(err)
		return
	}
	defer resetClose(rc.conn)
	var err error
	switch i % 4 {
	case 0:
		err = writeReadHead(rc, buildGET("/bytes?size=4194304", l.host(l.fast, soakSandbox)), 200)
		if err == nil {
			_, err = rc.br.Discard(100 << 10)
		}
	case 1:
		err = writeReadHead(rc, buildGET("/sse?size=256&interval_ms=10", l.host(l.fast, soakSandbox)), 200)
		if err == nil {
			_, err = readEvents(newBodyStream(rc.br, rc.hdr.ContentLength()), 2)
		}
	case 2:
		_, err = rc.conn.Write([]byte("GET /small HTTP/1.1\r\nHost: " + l.host(l.fast, soakSandbox) + "\r\nX-Half: "))
	case 3:
		ws := &wsConn{rc: rc, frame: newWSFrame(64), size: 64}
		if err = ws.upgrade("/ws", l.host(l.std, soakSandbox)); err == nil {
			if err = ws.roundTrip(); err == nil {
				_, err = rc.conn.Write(ws.frame)
			}
		}
	}
	if err != nil {
		a.fail(err)
		return
	}
	a.ok.Add(1)
}

// writeReadHead sends req and reads the response head, wanting status.
func writeReadHead(rc *rawConn, req []byte, status int) error {
	if _, err := rc.conn.Write(req); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	if err := rc.hdr.Read(rc.br); err != nil {
		return fmt.Errorf("read response header: %w", err)
	}
	if st := rc.hdr.StatusCode(); st != status {
		return statusError(st)
	}
	return nil
}

// statusError is an answer with another status than wanted.
type statusError int

func (e statusError) Error() string { return "status " + strconv.Itoa(int(e)) }

// readEvents reads n events of the backend's format (0: until the body
// ends) and returns how many arrived.
func readEvents(bs *bodyStream, n int) (int, error) {
	var p sseParser
	got := 0
	for n == 0 || got < n {
		b, err := bs.next()
		if err != nil {
			return got, err
		}
		got += p.feed(b, nil)
		if p.bad {
			return got, errors.New("response body is not the backend's event format")
		}
	}
	return got, nil
}

// openSSE dials and opens a stream on path of sandbox id.
func (l *soakLoad) openSSE(id, path string, deadline time.Time) (*rawConn, *bodyStream, error) {
	rc := newRawConn(l.addr, 16<<10)
	rc.deadline = deadline
	if err := rc.dial(); err != nil {
		return nil, nil, err
	}
	if err := writeReadHead(rc, buildGET(path, l.host(l.fast, id)), 200); err != nil {
		rc.close()
		return nil, nil, err
	}
	return rc, newBodyStream(rc.br, rc.hdr.ContentLength()), nil
}

// sseComplete reads a 20-event stream to its end.
func (l *soakLoad) sseComplete(_ context.Context, a *actorStats, _ int) {
	rc, bs, err := l.openSSE(soakSandbox, "/sse?size=256&n=20&interval_ms=10", time.Now().Add(soakOpTimeout))
	if err != nil {
		a.fail(err)
		return
	}
	defer rc.close()
	if got, err := readEvents(bs, 0); !errors.Is(err, io.EOF) || got != 20 {
		a.fail(fmt.Errorf("complete stream: %d of 20 events, then %v", got, err))
		return
	}
	a.ok.Add(1)
}

// sseClientCut leaves an endless stream after a few events (FIN).
func (l *soakLoad) sseClientCut(_ context.Context, a *actorStats, i int) {
	rc, bs, err := l.openSSE(soakSandbox, "/sse?size=256&interval_ms=20", time.Now().Add(soakOpTimeout))
	if err != nil {
		a.fail(err)
		return
	}
	defer rc.close()
	if _, err := readEvents(bs, 3+i%13); err != nil {
		a.fail(err)
		return
	}
	a.ok.Add(1)
}

// sseSandboxCut reads a stream whose sandbox drops the connection after 10
// events without ending the chunked body: the client must see it end too.
func (l *soakLoad) sseSandboxCut(_ context.Context, a *actorStats, _ int) {
	rc, bs, err := l.openSSE(soakSandbox, "/sse?size=256&n=10&interval_ms=10&cut=1", time.Now().Add(soakOpTimeout))
	if err != nil {
		a.fail(err)
		return
	}
	defer rc.close()
	got, err := readEvents(bs, 0)
	if got != 10 || err == nil {
		a.fail(fmt.Errorf("sandbox-cut stream: %d of 10 events, then %v", got, err))
		return
	}
	a.ok.Add(1)
}

// sseSilentCut leaves a stream that went silent after its first event
// (FIN or reset, in turn): only the hang-up watch, not a write, can tell
// the proxy that the client left.
func (l *soakLoad) sseSilentCut(_ context.Context, a *actorStats, i int) {
	rc, bs, err := l.openSSE(soakSandbox, "/sse?size=64&n=1&hold_ms=1800000", time.Now().Add(soakOpTimeout))
	if err != nil {
		a.fail(err)
		return
	}
	if _, err := readEvents(bs, 1); err != nil {
		rc.close()
		a.fail(err)
		return
	}
	time.Sleep(time.Duration(200+i%5*200) * time.Millisecond)
	if i%2 == 0 {
		rc.close()
	} else {
		resetClose(rc.conn)
	}
	a.ok.Add(1)
}

// upload sends a 256 KiB body, in turn whole (200), reset half-way, and
// the same two chunked in 64-byte chunks: the proxy sends the small chunks
// it has read together (its client read hook), a hook that each upload
// must take away however it ends.
func (l *soakLoad) upload(_ context.Context, a *actorStats, i int) {
	const size = 256 << 10
	rc := newRawConn(l.addr, 4<<10)
	rc.deadline = time.Now().Add(soakOpTimeout)
	if err := rc.dial(); err != nil {
		a.fail(err)
		return
	}
	head := "POST /small HTTP/1.1\r\nHost: " + l.host(l.fast, soakSandbox) +
		"\r\nContent-Type: application/octet-stream\r\n"
	body := soakUploadBody[:size]
	if i%4 >= 2 {
		head += "Transfer-Encoding: chunked\r\n\r\n"
		body = soakChunkedBody
	} else {
		head += "Content-Length: " + strconv.Itoa(size) + "\r\n\r\n"
	}
	reset := i%2 == 1
	if reset {
		body = body[:len(body)/2]
	}
	if _, err := rc.conn.Write(append([]byte(head), body...)); err != nil {
		resetClose(rc.conn)
		a.fail(err)
		return
	}
	if reset {
		resetClose(rc.conn)
		a.ok.Add(1)
		return
	}
	defer rc.close()
	if err := rc.hdr.Read(rc.br); err != nil {
		a.fail(fmt.Errorf("read response header: %w", err))
		return
	}
	if _, err := discardBody(rc.br, rc.hdr.ContentLength()); err != nil {
		a.fail(err)
		return
	}
	classify(a, rc.hdr.StatusCode(), []int{200})
}

var soakUploadBody = bytes.Repeat([]byte("upload-"), 256<<10/7+1)

// soakChunkedBody is soakUploadBody's first 256 KiB in 64-byte chunks.
var soakChunkedBody = func() []byte {
	var b []byte
	for p := soakUploadBody[:256<<10]; len(p) > 0; p = p[64:] {
		b = append(b, "40\r\n"...)
		b = append(b, p[:64]...)
		b = append(b, "\r\n"...)
	}
	return append(b, "0\r\n\r\n"...)
}()

// upgrade is handshake on an already dialled connection.
func (w *wsConn) upgrade(path, host string) error {
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	return writeReadHead(w.rc, []byte(req), 101)
}

// wsCloseFrame is a masked close frame with status 1000.
var wsCloseFrame = []byte{0x88, 0x82, 0x11, 0x22, 0x33, 0x44, 0x03 ^ 0x11, 0xe8 ^ 0x22}

// wsSession echoes a few messages, then leaves with a close handshake, by
// closing TCP (a client that vanished) or by a reset, in turn.
func (l *soakLoad) wsSession(_ context.Context, a *actorStats, i int) {
	rc := newRawConn(l.addr, 16<<10)
	rc.deadline = time.Now().Add(soakOpTimeout)
	if err := rc.dial(); err != nil {
		a.fail(err)
		return
	}
	ws := &wsConn{rc: rc, frame: newWSFrame(64), size: 64}
	if err := ws.upgrade("/ws", l.host(l.std, soakSandbox)); err != nil {
		rc.close()
		a.fail(err)
		return
	}
	for range 5 + i%30 {
		if err := ws.roundTrip(); err != nil {
			rc.close()
			a.fail(err)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	switch i % 3 {
	case 0:
		if _, err := rc.conn.Write(wsCloseFrame); err != nil {
			rc.close()
			a.fail(err)
			return
		}
		// The echo of the close frame ends the session.
		if err := ws.roundTrip(); err == nil || err.Error() != "server closed the WebSocket" {
			rc.close()
			a.fail(fmt.Errorf("close handshake: %v", err))
			return
		}
		rc.close()
	case 1:
		rc.close()
	case 2:
		resetClose(rc.conn)
	}
	a.ok.Add(1)
}

// vanishingDialer remembers the connections of one MCP session, so that
// the session's client can vanish: every connection closed at once, and no
// new one (its DELETE never arrives).
type vanishingDialer struct {
	mu    sync.Mutex
	conns []net.Conn
	gone  bool
}

var errVanished = errors.New("client vanished")

func (d *vanishingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gone {
		return nil, errVanished
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *vanishingDialer) vanish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gone = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// mcpSession opens a go-sdk session (standalone SSE stream included),
// makes one to three progress calls, and ends it with DELETE or by
// vanishing, in turn.
func (l *soakLoad) mcpSession(ctx context.Context, a *actorStats, i int) {
	d := &vanishingDialer{}
	tr := &http.Transport{DialContext: d.dial, MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: hostRewriter{host: l.host(l.std, soakSandbox), next: tr}}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, err := connectMCP(cctx, l.mcpClient, "http://"+l.addr+"/mcp", hc, soakOpTimeout)
	if err != nil {
		d.vanish()
		if ctx.Err() == nil {
			a.fail(err)
		}
		return
	}
	for n := range 1 + i%3 {
		params := &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 3},
			Meta: mcp.Meta{"progressToken": fmt.Sprintf("s%d-%d", i, n)}}
		res, err := cs.CallTool(cctx, params)
		if err == nil && res.IsError {
			err = errors.New("tool returned an error result")
		}
		if err != nil {
			d.vanish()
			_ = cs.Close()
			if ctx.Err() == nil {
				a.fail(err)
			}
			return
		}
	}
	if i%2 == 1 {
		d.vanish()
	}
	_ = cs.Close()
	d.vanish()
	a.ok.Add(1)
}

// victimSSE holds an endless stream on a sandbox that the killer kills:
// the stream must end at the kill; while the sandbox is dead the answer
// is 410 (or 404 once the kill's tombstone has lost to the cache).
func (l *soakLoad) victimSSE(ctx context.Context, a *actorStats, id string) {
	rc, bs, err := l.openSSE(id, "/sse?size=128&interval_ms=50", time.Now().Add(5*time.Minute))
	var se statusError
	switch {
	case errors.As(err, &se) && (se == 410 || se == 404):
		a.expected.Add(1)
		return
	case err != nil:
		if ctx.Err() == nil {
			a.fail(err)
		}
		return
	}
	defer rc.close()
	conn := rc.conn // rc.close sets rc.conn to nil
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	_, _ = readEvents(bs, 0) // until the kill (or the end of the run) cuts it
	a.ok.Add(1)
}

// victimWS holds a slow echo on a sandbox that the killer kills.
func (l *soakLoad) victimWS(ctx context.Context, a *actorStats, id string) {
	rc := newRawConn(l.addr, 16<<10)
	rc.deadline = time.Now().Add(5 * time.Minute)
	if err := rc.dial(); err != nil {
		a.fail(err)
		return
	}
	defer rc.close()
	conn := rc.conn // rc.close sets rc.conn to nil
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	ws := &wsConn{rc: rc, frame: newWSFrame(32), size: 32}
	var se statusError
	if err := ws.upgrade("/ws", l.host(l.std, id)); err != nil {
		if errors.As(err, &se) && (se == 410 || se == 404) {
			a.expected.Add(1)
		} else if ctx.Err() == nil {
			a.fail(err)
		}
		return
	}
	for ctx.Err() == nil {
		if err := ws.roundTrip(); err != nil {
			break // the kill cut it
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	a.ok.Add(1)
}

// killer kills one victim after another with open streams and tunnels
// (the control plane deletes the route, then calls meta/delete), and
// re-creates it a moment later under a new CreatedAt (meta/upsert).
func (l *soakLoad) killer(ctx context.Context) {
	a := l.stats("kill+recreate")
	for i := 0; ; i++ {
		sleepCtx(ctx, l.killEvery)
		if ctx.Err() != nil {
			return
		}
		id := soakVictims[i%len(soakVictims)]
		bg := context.Background()
		err := l.rdb.Del(bg, routeKeyPrefix+id).Err()
		if err == nil {
			err = l.adminPost("/admin/meta/delete", map[string]string{"sandbox_id": id})
		}
		time.Sleep(1500 * time.Millisecond)
		if err == nil {
			err = l.writeRoute(bg, id, time.Now().UnixNano())
		}
		if err == nil {
			err = l.adminPost("/admin/meta/upsert", map[string]string{"sandbox_id": id})
		}
		if err != nil {
			a.fail(err)
			continue
		}
		l.kills.Add(1)
		a.ok.Add(1)
	}
}

// pauser pauses pausy for a second, then resumes it.
func (l *soakLoad) pauser(ctx context.Context) {
	a := l.stats("pause+resume")
	for {
		sleepCtx(ctx, l.pauseEvery)
		if ctx.Err() != nil {
			return
		}
		err := l.adminPost("/admin/state", map[string]string{"sandbox_id": soakPausy, "state": "paused"})
		time.Sleep(time.Second)
		// Resumed whatever happened: pausy must not stay paused.
		if err2 := l.adminPost("/admin/state", map[string]string{"sandbox_id": soakPausy, "state": "running"}); err == nil {
			err = err2
		}
		if err != nil {
			a.fail(err)
			continue
		}
		l.pauses.Add(1)
		a.ok.Add(1)
	}
}
