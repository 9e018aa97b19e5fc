package telemetry

import (
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts a fasthttp request header to propagation.TextMapCarrier
// (and ValuesGetter, for propagators that read repeated headers) without
// copying the header into an http.Header.
type HeaderCarrier struct {
	H *fasthttp.RequestHeader // the header read and written
}

var (
	_ propagation.TextMapCarrier = HeaderCarrier{}
	_ propagation.ValuesGetter   = HeaderCarrier{}
)

// Get returns the value of key: its field lines combined in order with ","
// (RFC 9110 5.3), "" when absent. W3C Trace Context has a tracestate sent
// as several lines read so; the first line alone lost the entries of the
// others. Several traceparent lines combine into no valid traceparent, so
// such a request starts a new trace rather than the proxy guessing which
// line was meant.
func (c HeaderCarrier) Get(key string) string {
	all := c.H.PeekAll(key)
	switch len(all) {
	case 0:
		return ""
	case 1:
		return string(all[0])
	}
	n := len(all) - 1
	for _, v := range all {
		n += len(v)
	}
	b := make([]byte, 0, n)
	for i, v := range all {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, v...)
	}
	return string(b)
}

// Set replaces every value of key with value: fasthttp's Set replaces the
// first line and drops the others in place, where a delete first moved
// the head's last line into the first's place and reordered a repeated
// field.
func (c HeaderCarrier) Set(key, value string) {
	c.H.Set(key, value)
}

// Keys lists the header names present.
func (c HeaderCarrier) Keys() []string {
	var keys []string
	for k := range c.H.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// Values returns every value of key.
func (c HeaderCarrier) Values(key string) []string {
	all := c.H.PeekAll(key)
	if len(all) == 0 {
		return nil
	}
	vs := make([]string, len(all))
	for i, v := range all {
		vs[i] = string(v)
	}
	return vs
}
