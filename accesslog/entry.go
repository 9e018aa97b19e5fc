package accesslog

import "time"

// Entry is one finished request (for a stream: the whole stream). Log
// formats it before returning and keeps no reference to it or its strings,
// so the strings may alias request buffers that are valid only until Log
// returns. Empty strings and zero numbers mean "missing" and print as "-"
// in the cube format, except where noted.
//
// There is deliberately no header map: only the listed headers are logged,
// and the cube_token parameter (in the query or a fragment) and the
// userinfo of an absolute-form target are redacted from RequestURI, Args
// and URI, and the userinfo of a Host from Host.
type Entry struct {
	// Time is when the request finished (nginx $time_local); zero means now.
	Time time.Time

	Host            string // Host as received (nginx $host)
	RemoteAddr      string // client IP of the TCP connection (JSON only)
	XRealIP         string // X-Real-IP request header as received
	XForwardedFor   string // X-Forwarded-For request header as received
	ServerAddr      string // local IP the request arrived on ($server_addr)
	XForwardedProto string // X-Forwarded-Proto request header as received
	Method          string // request method as received
	RequestURI      string // original request URI, with query
	Args            string // query string without "?"
	Protocol        string // "HTTP/1.1"
	URI             string // path without query ($uri)

	Status        int   // status sent to the client
	BodyBytesSent int64 // response body bytes sent (printed even when 0)
	BytesIn       int64 // request body bytes received (JSON only)
	// RequestTime is from the request's first byte to its last (nginx
	// $request_time), the client's time over its head included (printed
	// even when 0).
	RequestTime        time.Duration
	ConnectionRequests int64 // requests served on this client connection so far

	UpstreamAddr string // "ip:port" of the sandbox backend; "" when none was dialed
	// UpstreamStatus is the sandbox's status, or, as nginx's
	// $upstream_status, the proxy's 502 or 504 for an exchange the sandbox
	// failed before answering; 0 when no sandbox was asked or the request
	// ended otherwise before an answer.
	UpstreamStatus int
	// UpstreamResponseTime is nginx's $upstream_response_time: from the
	// start of the upstream exchange to the end of the sandbox's response
	// (of the stream or tunnel). Printed only when UpstreamAddr is set.
	UpstreamResponseTime time.Duration
	// UpstreamRetries counts the upstream attempts made again after one
	// failed before any answer (a connect retried, a request re-sent on a
	// new connection), and UpstreamRetryCode is the proxy error code of
	// the first that failed: what nginx's "$upstream_addr" and
	// "$upstream_status" lists ("a, a", "502, 200") tell. Every attempt
	// goes to UpstreamAddr. JSON only.
	UpstreamRetries   int
	UpstreamRetryCode string // error code of the first failed attempt, "" when none failed

	UserAgent  string // User-Agent request header as received
	RequestID  string // X-Cube-Request-Id as echoed to the client
	InstanceID string // X-Cube-Instance-Id request header
	BackendIP  string // node or sandbox IP the route resolved to

	// JSON-only fields.
	SandboxID   string
	Port        int    // container port
	RouteKind   string // telemetry.RouteKind.String(): http, sse, websocket, error
	ErrorCode   string // proxy error code, "" on success
	CacheResult string // telemetry.CacheResult.String(): hit, miss, negative_hit, stale
}
