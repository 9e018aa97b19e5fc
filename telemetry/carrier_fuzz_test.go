package telemetry

import (
	"bufio"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// fasthttpOwn are the request fields fasthttp keeps apart from the others
// (one value, its own accessor): HeaderCarrier is for trace context, not
// for these.
var fasthttpOwn = []string{"host", "content-type", "content-length", "user-agent", "cookie", "connection", "transfer-encoding", "trailer"}

// FuzzHeaderCarrierGet checks HeaderCarrier against the field lines of a
// request head as a client sends them: Get combines a field's lines, in
// order, with "," (RFC 9110 5.3, as W3C Trace Context reads a tracestate
// sent as several lines), whatever the case of the name in the head or
// in the question, and Values returns them line by line.
func FuzzHeaderCarrierGet(f *testing.F) {
	f.Add("tracestate", "a=1\nb=2")
	f.Add("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("Tracestate", "a=1,b=2\n\nc=3")
	f.Add("baggage", "k=v;p\nk=w")
	f.Add("x-empty", "")
	f.Fuzz(func(t *testing.T, key, lines string) {
		if key == "" || strings.ContainsAny(key, ":\r\n \t\x00") || slices.Contains(fasthttpOwn, strings.ToLower(key)) {
			return
		}
		values := strings.Split(lines, "\n")
		for _, v := range values {
			// fasthttp trims the blanks around a value, and a value
			// left empty may be dropped: both are the parser's, not
			// the carrier's.
			if v == "" || strings.ContainsAny(v, "\r\x00") || strings.Trim(v, " \t") != v {
				return
			}
		}
		var head strings.Builder
		head.WriteString("GET / HTTP/1.1\r\nHost: x\r\n")
		for i, v := range values {
			name := key
			if i%2 == 1 {
				name = strings.ToUpper(key)
			}
			head.WriteString(name + ": " + v + "\r\n")
		}
		head.WriteString("\r\n")
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(head.String()))); err != nil {
			return
		}
		if len(h.PeekAll(key)) != len(values) {
			return // not a field fasthttp keeps line by line
		}
		c := HeaderCarrier{H: &h}
		want := strings.Join(values, ",")
		for _, k := range []string{key, strings.ToLower(key), strings.ToUpper(key)} {
			if got := c.Get(k); got != want {
				t.Fatalf("Get(%q) = %q, want %q (head %q)", k, got, want, head.String())
			}
			if got := c.Values(k); !slices.Equal(got, values) {
				t.Fatalf("Values(%q) = %q, want %q", k, got, values)
			}
		}
		if got := c.Get(key + "-other"); got != "" {
			t.Fatalf("Get of an absent field = %q", got)
		}
	})
}
