package proxy

import (
	"bytes"
	"html"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// Error codes in the JSON body of proxy errors. They are stable API:
// clients and dashboards branch on them.
const (
	CodeBadRequest     = "bad_request"
	CodeBadVersion     = "http_version_not_supported"
	CodeBadMethod      = "method_not_allowed"
	CodeNotFound       = "sandbox_not_found"
	CodePortNotMapped  = "port_not_mapped"
	CodeRouteInvalid   = "route_invalid"
	CodeSandboxKilled  = "sandbox_killed"
	CodeSandboxPausing = "sandbox_pausing"
	// CodeResumeFailed: the sandbox is paused and the lifecycle manager
	// (lifecycle.sidecar_addr) did not resume it: refused, an error
	// status, or no answer in time.
	CodeResumeFailed     = "resume_failed"
	CodeStoreUnavailable = "store_unavailable"
	CodeTooManyStreams   = "too_many_streams"
	CodeBodyTooLarge     = "request_body_too_large"
	CodeBadBody          = "bad_request_body"
	CodeBodyTimeout      = "request_body_timeout"
	// CodeHeaderTooLarge: the request head is over client.max_header_size,
	// or has more than maxHeaderLines lines.
	CodeHeaderTooLarge  = "request_header_too_large"
	CodeUpstreamConnect = "upstream_connect_failed"
	// CodeUpstreamConnectTimeout: the sandbox port neither accepted nor
	// refused the connection in time (a frozen sandbox, a full backlog).
	CodeUpstreamConnectTimeout = "upstream_connect_timeout"
	CodeUpstreamReset          = "upstream_reset"
	CodeUpstreamTimeout        = "upstream_timeout"
	CodeUpstreamBusy           = "upstream_busy"
	CodeUpstreamBadHeader      = "upstream_bad_response"
	// CodeOutOfResources: the proxy itself could not open a connection to
	// the sandbox (out of file descriptors, memory or local ports) or to
	// the route store (out of file descriptors or memory).
	CodeOutOfResources = "proxy_out_of_resources"
	// CodeOverloaded: the proxy refused the connection because it held
	// client.max_conns client connections already.
	CodeOverloaded = "proxy_overloaded"
	// CodeDrainTimeout marks, in the access log and the span, a response
	// the drain deadline cut after its status went out.
	CodeDrainTimeout = "drain_timeout"
	// CodeClientClosed: the client closed its connection before the
	// sandbox answered (nginx's 499); the answer goes to nobody, the log
	// and the metrics are what see it. On a streamed answer whose head went
	// out, it marks (log and span; the status stays) a body the client
	// left before its end. telemetry.ErrorCodeClientClosed is the same
	// string: spans do not count it as an error.
	CodeClientClosed = "client_closed_request"
	// CodeClientWriteTimeout marks (log and span; the status stays) a
	// streamed answer or tunnel cut because its client took none of a
	// write within client.write_timeout: it stopped reading. Like a
	// hang-up, the client's side, so no span counts it as an error
	// (telemetry.ErrorCodeClientWriteTimeout is the same string).
	CodeClientWriteTimeout = "client_write_timeout"
	// CodeProxyLoop: the route names one of the proxy's own listeners, so
	// the request would come back to the proxy (a route data error).
	CodeProxyLoop = "proxy_loop"
	// CodeCredentialRevoked: a change of the sandbox's route (a rotated
	// traffic token, a route made private) cut an exchange its old
	// credential had let through (rejudge); CodeRouteChanged: one the
	// route no longer sends to the same backend (moved, or deleted).
	CodeCredentialRevoked = "credential_revoked"
	CodeRouteChanged      = "route_changed"
	CodeACMEChallenge     = "acme_challenge_refused"
)

// proxyError is a failure the proxy answers itself, before or instead of a
// backend response.
type proxyError struct {
	status     int
	code       string
	msg        string
	retryAfter int // seconds; 0 = no Retry-After header
}

// clientClosedPhrase is the reason phrase of a 499, nginx's name for it.
var clientClosedPhrase = []byte("Client Closed Request")

// writeError renders e as JSON ({"error","code","sandbox_id"}) or, for a
// browser navigating, as a short HTML page. Errors are never cached.
func writeError(ctx *fasthttp.RequestCtx, e proxyError, sandboxID []byte) {
	resp := &ctx.Response
	// A failed upstream exchange may have left headers behind.
	resp.Reset()
	resp.SetStatusCode(e.status)
	if e.status == statusClientClosed {
		// fasthttp has no phrase for nginx's 499 and would write "Unknown
		// Status Code"; a client that only half-closed reads this line.
		resp.Header.SetStatusMessage(clientClosedPhrase)
	}
	resp.Header.Set("Cache-Control", "no-store")
	if e.retryAfter > 0 {
		resp.Header.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if isBrowserNavigation(&ctx.Request.Header) {
		resp.Header.SetContentType("text/html; charset=utf-8")
		resp.SetBodyString(errorPage(e, sandboxID))
		return
	}
	resp.Header.SetContentType("application/json")
	var buf [512]byte
	resp.SetBody(appendErrorJSON(buf[:0], e, sandboxID))
}

// exposeToPages lets a page of any origin read a proxy error answering its
// fetch(): without Access-Control-Allow-Origin the browser hides the
// answer, and the page's fetch fails as if the network were down, so a
// browser-based agent (the platform's UI, whose preflights the proxy
// answers itself) could not tell a wrong token from a paused sandbox, nor
// read the Retry-After of a 429 or 503. "*" admits no credentialed call (a
// fetch with the browser's cookies), so another sandbox's page, same-site,
// cannot learn from a refusal's code whether the browser holds this
// sandbox's cookie; what any other call reads, curl reads too. The
// sandbox's own answers keep the CORS headers it gives them.
func exposeToPages(h *fasthttp.ResponseHeader) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "Retry-After, "+HeaderRequestID+", "+HeaderRetcode)
}

func appendErrorJSON(dst []byte, e proxyError, sandboxID []byte) []byte {
	dst = append(dst, `{"error":`...)
	dst = appendJSONString(dst, e.msg)
	dst = append(dst, `,"code":`...)
	dst = appendJSONString(dst, e.code)
	if len(sandboxID) > 0 {
		dst = append(dst, `,"sandbox_id":`...)
		dst = appendJSONString(dst, string(sandboxID))
	}
	return append(dst, '}', '\n')
}

func errorPage(e proxyError, sandboxID []byte) string {
	title := strconv.Itoa(e.status) + " " + fasthttp.StatusMessage(e.status)
	var b bytes.Buffer
	b.WriteString("<!doctype html><html><head><meta charset=\"utf-8\"><title>")
	b.WriteString(title)
	b.WriteString("</title></head><body><h1>")
	b.WriteString(title)
	b.WriteString("</h1><p>")
	b.WriteString(html.EscapeString(e.msg))
	b.WriteString("</p>")
	if len(sandboxID) > 0 {
		b.WriteString("<p>Sandbox: <code>")
		b.WriteString(html.EscapeString(string(sandboxID)))
		b.WriteString("</code></p>")
	}
	b.WriteString("<p><small>code: ")
	b.WriteString(e.code)
	b.WriteString("</small></p></body></html>\n")
	return b.String()
}

// isBrowserNavigation reports whether a person's browser is loading a page,
// so an error page beats JSON.
func isBrowserNavigation(h *fasthttp.RequestHeader) bool {
	if mode := h.Peek("Sec-Fetch-Mode"); len(mode) > 0 {
		return string(mode) == "navigate"
	}
	return bytes.Contains(h.Peek("Accept"), []byte("text/html"))
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}
