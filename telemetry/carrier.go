package telemetry

import (
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts a fasthttp request header to propagation.TextMapCarrier
// (and ValuesGetter, for propagators that read repeated headers) without
// copying the header into an http.Header.
type HeaderCarrier struct{ H *fasthttp.RequestHeader }

var (
	_ propagation.TextMapCarrier = HeaderCarrier{}
	_ propagation.ValuesGetter   = HeaderCarrier{}
)

// Get returns the first value of key, or "".
func (c HeaderCarrier) Get(key string) string { return string(c.H.Peek(key)) }

// Set replaces every value of key with value.
func (c HeaderCarrier) Set(key, value string) {
	c.H.Del(key) // Set alone replaces only the first
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
