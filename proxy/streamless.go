package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// Above max_streams_per_sandbox an MCP agent must still be able to send
// what frees the slots it is stuck on: notifications/cancelled for a tool
// call that holds one, and its answer to an elicitation or sampling
// request that the call holding one waits for. In Streamable HTTP a POST
// that carries only notifications and responses produces no stream (the
// gateway answers 202 with no body), so it is let through the limit; and
// so is the DELETE that ends a session (the go-sdk's ClientSession.Close),
// which opens none either and is how a client at the limit gives back
// what its session holds at the gateway. See overLimit.
//
// Whether a body is only notifications and responses can be told only
// from all of it: JSON keys come in any order, and a request's "method"
// may follow kilobytes of "params". A sampling answer (the model's text, a
// base64 image) is often larger than the 8 KiB fasthttp reads before the
// handler, so the proxy reads the rest of such a body into memory to judge
// it, within Config.MaxHeldBody per body, Config.HeldBodyPerSandbox for
// one sandbox's bodies and Config.HeldBodyBudget across all sandboxes,
// and then sends it on from there.

// headerMCPSessionID names the Streamable HTTP session a request is for.
const headerMCPSessionID = "Mcp-Session-Id"

// Refusals of a request over max_streams_per_sandbox. Package values, so
// that a flood of refusals costs no allocation.
var (
	refusedTooMany = proxyError{status: 429, code: CodeTooManyStreams,
		msg: "too many concurrent requests for this sandbox", retryAfter: 1}
	// refusedNoRoom: a notification or response body that could pass, were
	// there room to hold it (HeldBodyBudget) while it is judged.
	refusedNoRoom = proxyError{status: 429, code: CodeTooManyStreams,
		msg: "too many concurrent requests for this sandbox, and no room to read this body", retryAfter: 1}
	// refusedShare: as refusedNoRoom, but what is full is this sandbox's
	// share of the budget (HeldBodyPerSandbox), taken by its own bodies:
	// others' may still pass.
	refusedShare = proxyError{status: 429, code: CodeTooManyStreams,
		msg: "too many concurrent requests for this sandbox, and its share of the room to read bodies is taken", retryAfter: 1}
	// refusedReadRequest: refusedTooMany's answer to a body readHeldBody
	// read from the client and found to be a request. A value of its own,
	// so that waitForSlot can tell it from the others: its body is gone
	// from the connection, so the request cannot be judged again.
	refusedReadRequest = refusedTooMany
)

// overLimit decides a request that makes its sandbox's count n, above
// limit: nil lets it pass, else it is the refusal to answer. While the
// sandbox has at most twice limit requests in flight, a POST whose body is
// JSON-RPC notifications and responses only (streamless) passes, and so
// does a DELETE of an MCP session (sessionDelete). It runs only where the
// limit would refuse, so requests below it pay nothing. It holds its slot
// while in flight like any request, reading a body included, so the limit
// still bounds what a client can open at once (at twice its value): a
// flood of such requests to a sandbox that never answers them is refused.
//
// A body fasthttp read before the handler (Content-Length up to 8 KiB) is
// judged where it is. A larger one, up to MaxHeldBody, is read whole
// (readHeldBody) if sb's share (HeldBodyPerSandbox) and HeldBodyBudget
// both have room for it, and 429 otherwise. A
// chunked body is refused: its size is known only at its end, and agents
// send JSON-RPC messages with a Content-Length.
//
// The head of an "Expect: 100-continue" request is admitted on its framing
// (and, for a body to be held, on the room the share and the budget have
// now); its body is judged when the request runs again with it.
func (p *Proxy) overLimit(ctx *fasthttp.RequestCtx, x *exchange, sb *sandboxState, n int64, limit int) *proxyError {
	if n > 2*int64(limit) {
		return &refusedTooMany
	}
	if x.held > 0 {
		// Read and judged already: serve looks the route up again after
		// the read, and counts the request in once more.
		return nil
	}
	h := &ctx.Request.Header
	if h.IsDelete() {
		if sessionDelete(h) {
			return nil
		}
		return &refusedTooMany
	}
	if !h.IsPost() {
		return &refusedTooMany
	}
	cl := h.ContentLength()
	large := cl > fasthttpPreRead
	if cl <= 0 || large && int64(cl) > p.cfg.MaxHeldBody {
		return &refusedTooMany
	}
	if x.expecting {
		if large && !room(&sb.held, p.heldShare, int64(cl)) {
			return &refusedShare
		}
		if large && !p.heldBodies.room(int64(cl)) {
			return &refusedNoRoom
		}
		return nil
	}
	if large && ctx.Request.IsBodyStream() {
		return p.readHeldBody(ctx, x, sb, cl)
	}
	// All of it is in memory already (fasthttp's pre-read, or a server
	// that reads bodies whole): Body reads no socket. The body then goes
	// to the sandbox from memory.
	x.bodyEnded = true
	if streamless(ctx.Request.Body()) {
		return nil
	}
	return &refusedTooMany
}

// readHeldBody reads the rest of a request's body, cl bytes in all, into
// memory, and judges it (overLimit). Admitted, the body goes to the sandbox
// from memory, and its bytes count against sb's share and HeldBodyBudget
// until it has been sent (letGoHeldBody); refused, they are given back at
// once. The share is taken first: a sandbox over it is told so, whether
// or not the budget has room, since only its own bodies can make room. The
// read goes through clientBody, as a streamed upload's: client.body_timeout
// bounds each wait for the client (408; the drain's cut of it is a 504), a
// client that leaves midway is a 499, and the connection is closed after
// either, since the rest of the body is lost.
func (p *Proxy) readHeldBody(ctx *fasthttp.RequestCtx, x *exchange, sb *sandboxState, cl int) *proxyError {
	size := int64(cl)
	if !take(&sb.held, p.heldShare, size) {
		return &refusedShare
	}
	if !p.heldBodies.take(size) {
		sb.held.Add(-size)
		return &refusedNoRoom
	}
	buf := make([]byte, cl)
	b := clientBody{ctx: ctx, r: ctx.RequestBodyStream(), size: size, left: size, timeout: p.clientBodyTimeout}
	_, err := io.ReadFull(&b, buf)
	x.bytesIn = b.n
	if err != nil {
		p.giveHeld(sb, size)
		if isTimeout(err) && p.pools.aborted.Load() {
			return &refusedBodyDrain // connSet.cutReads
		}
		return bodyFailure(err, b.gone)
	}
	x.bodyEnded = true
	if !streamless(buf) {
		p.giveHeld(sb, size)
		return &refusedReadRequest
	}
	// In place of the stream: prepareRequest then finds no stream to
	// wrap, and the request goes out with its body in one write.
	ctx.Request.SetBodyRaw(buf)
	// sb, not the entry serve may look up again after the read: the
	// share goes back to the entry it was taken from.
	x.held, x.heldOn = size, sb
	return nil
}

// waitForSlot waits, after refusal of a request over limit at sb
// (overLimit; the request has left its slot), for sb's count to fall
// below limit, until Config.StreamLimitWait after the request's first
// wait (x.limitUntil), and reports whether the request is to be judged
// again: a slot came free (counted in cubeproxy_stream_limit_waits_total
// as "slot"), or sb's state changed ("state"), which the caller answers
// as for a new request. A client that sends its next request as soon as
// it reads a result's event (an MCP SDK) is otherwise refused for the
// slot of the answer it has just read, whose end the proxy has not seen
// yet.
//
// A slot seen free is not the request's: another may count itself in
// first, and the request, judged again, is refused again. It then waits
// on, for what is left of its wait: with waiters polling on their own,
// several may see the one slot that frees, and only one gets it; the
// others are no more over the limit than before. The end stays the first
// wait's, so a request waits stream_limit_wait at most in all, however
// often it loses.
//
// An "Expect: 100-continue" request's body runs as a request of its own
// (an exchange of its own) once its head is admitted: a head that waited
// passes the end of its wait on to it (headWaitEnd), so that head and body
// together wait stream_limit_wait at most too.
//
// Only for a refusal that left the request as it came: the plain 429, or
// no room to hold its body (readHeldBody refuses those before reading).
// Not for a body read whole and judged a request (refusedReadRequest: it
// is gone from the connection), nor for one held in memory (x.held:
// passed once already, and holding room in the held-body budget a wait
// would keep from others). A body fasthttp pre-read is in memory, and an
// Expect head has sent none: both can be judged again.
//
// It polls, with sleeps from slotPollFirst doubling up to slotPollMax:
// enter and leave, which every request pays, stay one atomic add each,
// with nothing to wake a waiter. The drain ends the wait at once (at the
// next poll): the refusal is answered, not held through the drain. So
// does the client's close of its connection (gone; a 499 for the log):
// fasthttp does not tell its handler, and a request whose client left
// would otherwise still go to the sandbox once a slot came free, as late
// as stream_limit_wait after it was sent (a tool call the agent gave up
// on, run minutes later with a long wait). A client with bytes still
// unread (a body refused unread, a pipelined request) reads as there,
// unless, over TLS, a FIN came behind them (clientLeft).
func (p *Proxy) waitForSlot(ctx *fasthttp.RequestCtx, x *exchange, sb *sandboxState, limit int, refusal *proxyError) (again, gone bool) {
	wait := p.cfg.StreamLimitWait
	if wait <= 0 || x.held > 0 ||
		refusal != &refusedTooMany && refusal != &refusedNoRoom && refusal != &refusedShare {
		return false, false
	}
	if x.limitUntil.IsZero() {
		if x.seen.expect && !x.expecting {
			// The body's run of an Expect head that waited: what is
			// left of the head's wait (handle).
			x.limitUntil, _ = ctx.UserValue(headWaitEnd{}).(time.Time)
		}
		if x.limitUntil.IsZero() {
			x.limitUntil = time.Now().Add(wait)
		}
	}
	if time.Until(x.limitUntil) <= 0 {
		// Lost the slot it saw free at its wait's end, or its Expect
		// head's wait is over: no look past it.
		p.metrics.StreamLimitWait(telemetry.WaitRefused)
		return false, false
	}
	p.limitWaiting.Add(1)
	defer p.limitWaiting.Add(-1)
	for pause := slotPollFirst; ; pause = min(2*pause, slotPollMax) {
		if p.draining != nil && p.draining.Load() {
			break
		}
		if sb.state() != stateRunning {
			// Paused, killed or forgotten: answered as such.
			p.metrics.StreamLimitWait(telemetry.WaitState)
			return true, false
		}
		if sb.inFlight() < int64(limit) {
			p.metrics.StreamLimitWait(telemetry.WaitSlot)
			return true, false
		}
		if clientLeft(ctx.Conn()) {
			gone = true
			break
		}
		left := time.Until(x.limitUntil)
		if left <= 0 {
			break
		}
		time.Sleep(min(pause, left))
	}
	p.metrics.StreamLimitWait(telemetry.WaitRefused)
	return false, gone
}

// clientLeft reports whether the client of c, a connection whose request
// waits, has closed it (clientClosed). Over TLS a FIN counts even behind
// unread bytes (clientHungUp, nginx's EPOLLRDHUP test): a TLS client
// sends close_notify before its FIN, which the peek reads as data, and a
// request whose HTTPS client had left went on waiting, then reached the
// sandbox once a slot freed, and held that slot.
func clientLeft(c net.Conn) bool {
	if _, ok := c.(serverTLSConn); ok {
		return clientHungUp(c)
	}
	return clientClosed(c)
}

// The polling of waitForSlot: its first sleep, doubled each time up to
// the last. The slot of a stream whose end is on its way frees within a
// millisecond or so; a longer wait is a loaded machine, polled less often.
const (
	slotPollFirst = 500 * time.Microsecond
	slotPollMax   = 10 * time.Millisecond
)

// giveHeld gives n bytes taken for a held body back to sb's share and to
// HeldBodyBudget.
func (p *Proxy) giveHeld(sb *sandboxState, n int64) {
	sb.held.Add(-n)
	p.heldBodies.give(n)
}

// letGoHeldBody drops the body readHeldBody holds for x, if any, and gives
// its bytes back to the budget: once it has been sent, or when the
// request ends without being sent. Every request passes here: the check
// is inlined, the work is not.
func (p *Proxy) letGoHeldBody(ctx *fasthttp.RequestCtx, x *exchange) {
	if x.held > 0 {
		p.dropHeldBody(ctx, x)
	}
}

// dropHeldBody is letGoHeldBody's work.
func (p *Proxy) dropHeldBody(ctx *fasthttp.RequestCtx, x *exchange) {
	ctx.Request.SetBodyRaw(nil)
	p.giveHeld(x.heldOn, x.held)
	x.held, x.heldOn = 0, nil
}

// byteBudget is a number of bytes that may be held at once, taken before
// they are and given back after. Lock-free: requests for every sandbox
// share it.
type byteBudget struct {
	max  int64
	used atomic.Int64
}

// take reserves n bytes, and reports whether there was room for them.
func (b *byteBudget) take(n int64) bool { return take(&b.used, b.max, n) }

// room reports whether n bytes could be taken now.
func (b *byteBudget) room(n int64) bool { return room(&b.used, b.max, n) }

// take adds n to *used if that keeps it at most limit, and reports
// whether it did. A compare-and-swap, not an add and a check: an add that
// overshot and was undone would refuse a concurrent taker that fit.
func take(used *atomic.Int64, limit, n int64) bool {
	for {
		u := used.Load()
		if n > limit-u {
			return false
		}
		if used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// room reports whether n could be added to *used now, keeping it at most
// limit.
func room(used *atomic.Int64, limit, n int64) bool { return n <= limit-used.Load() }

// give returns n bytes taken.
func (b *byteBudget) give(n int64) { b.used.Add(-n) }

// sessionDelete reports whether h is the head of a Streamable HTTP
// session's termination: a DELETE with a non-empty Mcp-Session-Id and no
// body (no Content-Length above 0, not chunked), as the go-sdk's
// ClientSession.Close sends it. The gateway answers it without a stream,
// and with no body there is nothing to read from the client to judge it.
// A DELETE with a body is not what a client ending its session sends: it
// is refused, at its "Expect: 100-continue" head already if it has one
// (Expect judges only heads that frame a body).
func sessionDelete(h *fasthttp.RequestHeader) bool {
	return frameless(h) && len(h.Peek(headerMCPSessionID)) > 0
}

// streamless reports whether body is a JSON-RPC notification or response,
// or a non-empty batch of only those: what a Streamable HTTP MCP server
// answers with 202 and no stream. Each message must carry "jsonrpc":"2.0"
// and exactly one of "method" (a notification) and "id" (a response).
// Those two keys are matched without regard to case, as encoding/json
// matches struct fields (some MCP servers decode with it): a body that any
// such server might read as a request is not streamless. Malformed JSON is
// not streamless either.
func streamless(body []byte) bool {
	body = bytes.TrimLeft(body, " \t\r\n")
	if len(body) == 0 {
		return false
	}
	if body[0] != '[' {
		return streamlessMessage(body)
	}
	var batch []json.RawMessage
	if json.Unmarshal(body, &batch) != nil || len(batch) == 0 {
		return false
	}
	for _, m := range batch {
		if !streamlessMessage(m) {
			return false
		}
	}
	return true
}

// streamlessMessage reports whether m is one JSON-RPC notification or
// response (see streamless).
func streamlessMessage(m []byte) bool {
	m = bytes.TrimLeft(m, " \t\r\n")
	if len(m) == 0 || m[0] != '{' {
		return false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(m, &fields) != nil {
		return false
	}
	var method, id, version bool
	for k, v := range fields {
		switch {
		case strings.EqualFold(k, "method"):
			method = true
		case strings.EqualFold(k, "id"):
			id = true
		case k == "jsonrpc":
			version = string(v) == `"2.0"`
		}
	}
	return version && method != id
}
