package proxy

import "github.com/valyala/fasthttp"

// HeaderRetcode carries, on every traffic answer, the outcome code of the
// platform's proxy (its header_filter_phase.lua): the platform's tools and
// runbooks read it to tell the proxy's answers from the sandbox's.
const HeaderRetcode = "X-Cube-Retcode"

// keyRetcode is HeaderRetcode in fasthttp's canonical form, for SetCanonical.
var keyRetcode = []byte(HeaderRetcode)

// setRetcode sets X-Cube-Retcode for the answer in h, replacing any line
// the sandbox sent: "310200" for a 200, "330<status>" for any other answer
// once a sandbox was asked (its own status, or the proxy's 502 or 504 when
// the exchange with it failed; a 101 too, as there), and "310<status>" for
// an answer the proxy gave without asking one. The platform's "340<status>"
// (a backend its fault list marks) has no counterpart: nothing here keeps
// such a list.
func setRetcode(h *fasthttp.ResponseHeader, asked bool) {
	var buf [24]byte
	h.SetCanonical(keyRetcode, appendRetcode(buf[:0], h.StatusCode(), asked))
}

// appendRetcode appends the X-Cube-Retcode value of an answer of status
// (setRetcode).
func appendRetcode(dst []byte, status int, asked bool) []byte {
	if asked && status != fasthttp.StatusOK {
		dst = append(dst, "330"...)
	} else {
		dst = append(dst, "310"...)
	}
	return appendUint(dst, uint64(status))
}
