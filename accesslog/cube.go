package accesslog

import (
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// accessTime is the layout of the platform's $access_time, which its
// log_phase.lua sets (os.date("%Y-%m-%dT%H:%M:%S") and the millisecond
// of ngx.var.msec): local time without a zone, 2026-11-30T04:47:48.123.
// That Lua writes the millisecond without leading zeros (".5" for 5 ms),
// which a reader of decimal fractions takes for half a second; here it
// has its three digits, read right either way.
const accessTime = "2006-01-02T15:04:05.000"

// cubeSep separates the 22 fields of the cube format.
const cubeSep = "||"

const hexDigits = "0123456789ABCDEF"

// appendCube appends the platform's 22-field line (no newline):
// access_time, host, x_real_ip, x_forwarded_for, server_addr,
// x_forwarded_proto, method, request_uri, args, protocol, uri, status,
// body_bytes_sent, request_time, connection_requests, upstream_addr,
// upstream_status, upstream_response_time, user_agent, x_cube_request_id,
// x_cube_instance_id, backend_ip.
func appendCube(b []byte, e *Entry, now time.Time, ts *stamps) []byte {
	b = ts.append(b, e.Time, now)
	b = cubeHost(b, e.Host)
	b = cubeField(b, e.XRealIP)
	b = cubeField(b, e.XForwardedFor)
	b = cubeField(b, e.ServerAddr)
	b = cubeField(b, e.XForwardedProto)
	b = cubeField(b, e.Method)
	b = cubeRedacted(b, e.RequestURI, appendRedactedURI)
	b = cubeRedacted(b, e.Args, appendRedactedQuery)
	b = cubeField(b, e.Protocol)
	b = cubeURI(b, e.URI)
	b = cubeInt(b, int64(e.Status))
	b = append(b, cubeSep...)
	b = strconv.AppendInt(b, max(e.BodyBytesSent, 0), 10)
	b = append(b, cubeSep...)
	b = appendSeconds(b, e.RequestTime)
	b = cubeInt(b, e.ConnectionRequests)
	b = cubeField(b, e.UpstreamAddr)
	b = cubeInt(b, int64(e.UpstreamStatus))
	b = append(b, cubeSep...)
	if e.UpstreamAddr == "" {
		b = append(b, '-')
	} else {
		b = appendSeconds(b, e.UpstreamResponseTime)
	}
	b = cubeField(b, e.UserAgent)
	b = cubeField(b, e.RequestID)
	b = cubeField(b, e.InstanceID)
	b = cubeField(b, e.BackendIP)
	return b
}

// cubeField appends the separator and s escaped, or "-" when s is empty.
func cubeField(b []byte, s string) []byte {
	b = append(b, cubeSep...)
	if s == "" {
		return append(b, '-')
	}
	return appendCubeEscaped(b, s)
}

// cubeRedacted is cubeField for a field with secrets, which redact
// appends with them replaced.
func cubeRedacted(b []byte, s string, redact func(dst []byte, s string, esc appendFunc) []byte) []byte {
	b = append(b, cubeSep...)
	if s == "" {
		return append(b, '-')
	}
	return redact(b, s, appendCubeEscaped)
}

// cubeHost appends the separator and host as nginx's $host holds it (its
// ngx_http_validate_host): lowercased, without the port and without one
// trailing dot, an IPv6 literal with its brackets; "-" when nothing is
// left. A userinfo is REDACTED as in every format.
func cubeHost(b []byte, host string) []byte {
	b = append(b, cubeSep...)
	if at := strings.LastIndexByte(host, '@'); at > 0 {
		b = append(b, redacted+"@"...)
		host = host[at+1:]
	}
	end := len(host)
	if len(host) > 0 && host[0] == '[' {
		if i := strings.IndexByte(host, ']'); i > 0 {
			end = i + 1
		}
	} else if i := strings.IndexByte(host, ':'); i >= 0 {
		end = i
	}
	if end > 0 && host[end-1] == '.' {
		end--
	}
	if end == 0 {
		if len(b) > 0 && b[len(b)-1] == '@' { // REDACTED@, just written
			return b
		}
		return append(b, '-')
	}
	host = host[:end]
	start := 0 // host[start:i] is pending, needing neither escape nor lowercasing
	for i := 0; i < len(host); i++ {
		if c := host[i]; c >= 'A' && c <= 'Z' {
			b = appendCubeEscaped(b, host[start:i])
			b = append(b, c+'a'-'A')
			start = i + 1
		}
	}
	return appendCubeEscaped(b, host[start:])
}

// cubeURI appends the separator and path as nginx's $uri holds it
// (appendNginxURI), redacted and escaped, or as sent when nginx would
// refuse it or its "//" starts an authority with a userinfo to redact.
// The path is resolved at b's end and escaped after itself, then moved
// into place: no allocation beyond b's.
func cubeURI(b []byte, path string) []byte {
	if !nginxURIChanges(path) {
		return cubeRedacted(b, path, appendRedactedURI)
	}
	if strings.HasPrefix(path, "//") {
		if _, rest := appendRedactedAuthority(nil, path, appendCubeEscaped); len(rest) != len(path) {
			return cubeRedacted(b, path, appendRedactedURI)
		}
	}
	b = append(b, cubeSep...)
	n := len(b)
	b, ok := appendNginxURI(b, path)
	if !ok {
		return appendRedactedURI(b, path, appendCubeEscaped)
	}
	m := len(b)
	// The string aliases b[n:m], which appending past m does not change
	// (nor a growth of b, which copies it).
	b = appendRedactedURI(b, unsafe.String(&b[n], m-n), appendCubeEscaped)
	return append(b[:n], b[m:]...)
}

// cubeInt appends the separator and n, or "-" when n <= 0.
func cubeInt(b []byte, n int64) []byte {
	b = append(b, cubeSep...)
	if n <= 0 {
		return append(b, '-')
	}
	return strconv.AppendInt(b, n, 10)
}

// appendCubeEscaped escapes like nginx's default log escaping (`"`, `\`,
// control bytes and bytes >= 0x7F as \xHH) and additionally `|`, so a value
// can never forge a field separator or a line break.
func appendCubeEscaped(b []byte, s string) []byte {
	start := 0 // s[start:i] is pending, needing no escape
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7F || c == '"' || c == '\\' || c == '|' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xF])
			start = i + 1
		}
	}
	return append(b, s[start:]...)
}

// appendSeconds appends d as seconds with millisecond precision, truncated
// like nginx's $request_time ("0.003"); negative durations print as 0.000.
func appendSeconds(b []byte, d time.Duration) []byte {
	ms := max(d.Milliseconds(), 0)
	b = strconv.AppendInt(b, ms/1000, 10)
	frac := ms % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}
