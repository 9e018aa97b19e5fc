package proxy

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/valyala/fasthttp"
)

// Above max_streams_per_sandbox an MCP agent must still be able to send
// what frees the slots it is stuck on: notifications/cancelled for a tool
// call that holds one, and its answer to an elicitation or sampling
// request that the call holding one waits for. In Streamable HTTP a POST
// that carries only notifications and responses produces no stream (the
// gateway answers 202 with no body), so it is let through the limit; and
// so is the DELETE that ends a session (the go-sdk's ClientSession.Close),
// which opens none either and is how a client at the limit gives back
// what its session holds at the gateway. See overLimitAdmits.

// headerMCPSessionID names the Streamable HTTP session a request is for.
const headerMCPSessionID = "Mcp-Session-Id"

// overLimitAdmits reports whether a request that makes its sandbox's
// count n, above limit, may pass anyway, while the sandbox has at most
// twice limit requests in flight: a POST whose body, already read in whole
// before the handler ran, is JSON-RPC notifications and responses only
// (streamless), or a DELETE of an MCP session (sessionDelete). It runs
// only where the limit would refuse, so requests below it pay nothing. It
// holds its slot while in flight like any request, so the limit still
// bounds what a client can open at once (at twice its value): a flood of
// such requests to a sandbox that never answers them is refused.
//
// The head of an "Expect: 100-continue" request is admitted on its framing
// alone; its body is judged when the request runs again with it.
func overLimitAdmits(ctx *fasthttp.RequestCtx, x *exchange, n int64, limit int) bool {
	if n > 2*int64(limit) {
		return false
	}
	h := &ctx.Request.Header
	if h.IsDelete() {
		return sessionDelete(h)
	}
	if !h.IsPost() {
		return false
	}
	// A chunked body (-1), or one longer than fasthttp reads before the
	// handler, would have to be read from the client here: neither is
	// what an agent sends for a notification or a response.
	if cl := h.ContentLength(); cl <= 0 || cl > fasthttpPreRead {
		return false
	}
	if x.expecting {
		return true
	}
	// All of it is in memory already (fasthttp's pre-read): Body reads no
	// socket. The body then goes to the sandbox from memory.
	x.bodyEnded = true
	return streamless(ctx.Request.Body())
}

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
