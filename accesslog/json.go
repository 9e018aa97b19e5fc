package accesslog

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// jsonTime is RFC 3339 with milliseconds.
const jsonTime = "2006-01-02T15:04:05.000Z07:00"

// appendJSON appends one JSON object (no newline). Every key is always
// present so the schema is stable; missing upstream numbers are null.
func appendJSON(b []byte, e *Entry, now time.Time, ts *stamps) []byte {
	b = append(b, `{"time":"`...)
	b = ts.append(b, e.Time, now)
	b = append(b, '"')
	b = jsonStr(b, "remote_addr", e.RemoteAddr)
	b = append(b, `,"host":"`...)
	b = appendRedactedHost(b, e.Host, appendJSONEscaped)
	b = append(b, '"')
	b = jsonStr(b, "method", e.Method)
	b = append(b, `,"request_uri":"`...)
	b = appendRedactedURI(b, e.RequestURI, appendJSONEscaped)
	b = append(b, `","args":"`...)
	b = appendRedactedQuery(b, e.Args, appendJSONEscaped)
	b = append(b, '"')
	b = append(b, `,"uri":"`...)
	b = appendRedactedURI(b, e.URI, appendJSONEscaped)
	b = append(b, '"')
	b = jsonStr(b, "protocol", e.Protocol)
	b = jsonInt(b, "status", int64(e.Status))
	b = jsonInt(b, "body_bytes_sent", e.BodyBytesSent)
	b = jsonInt(b, "bytes_in", e.BytesIn)
	b = append(b, `,"request_time":`...)
	b = appendSeconds(b, e.RequestTime)
	b = jsonInt(b, "connection_requests", e.ConnectionRequests)
	b = jsonStr(b, "sandbox_id", e.SandboxID)
	b = jsonInt(b, "port", int64(e.Port))
	b = jsonStr(b, "route_kind", e.RouteKind)
	b = jsonStr(b, "cache_result", e.CacheResult)
	b = jsonStr(b, "error_code", e.ErrorCode)
	b = jsonStr(b, "upstream_addr", e.UpstreamAddr)
	b = append(b, `,"upstream_status":`...)
	if e.UpstreamStatus > 0 {
		b = strconv.AppendInt(b, int64(e.UpstreamStatus), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"upstream_response_time":`...)
	if e.UpstreamAddr != "" {
		b = appendSeconds(b, e.UpstreamResponseTime)
	} else {
		b = append(b, "null"...)
	}
	b = jsonInt(b, "upstream_retries", int64(e.UpstreamRetries))
	b = jsonStr(b, "upstream_retry_code", e.UpstreamRetryCode)
	b = jsonStr(b, "backend_ip", e.BackendIP)
	b = jsonStr(b, "server_addr", e.ServerAddr)
	b = jsonStr(b, "x_real_ip", e.XRealIP)
	b = jsonStr(b, "x_forwarded_for", e.XForwardedFor)
	b = jsonStr(b, "x_forwarded_proto", e.XForwardedProto)
	b = jsonStr(b, "user_agent", e.UserAgent)
	b = jsonStr(b, "x_cube_request_id", e.RequestID)
	b = jsonStr(b, "x_cube_instance_id", e.InstanceID)
	return append(b, '}')
}

// jsonStr appends ,"key":"value"; key must need no escaping.
func jsonStr(b []byte, key, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':', '"')
	b = appendJSONEscaped(b, v)
	return append(b, '"')
}

func jsonInt(b []byte, key string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

// appendJSONEscaped escapes s for a JSON string as encoding/json does
// (without HTML escaping): quotes, backslashes, control characters,
// U+2028/U+2029, and invalid UTF-8 as U+FFFD.
func appendJSONEscaped(b []byte, s string) []byte {
	start := 0 // s[start:i] is pending, needing no escape
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}
