package rfc2136

import (
	"strings"
	"testing"
	"time"

	"github.com/libdns/libdns"
	"github.com/miekg/dns"
)

// FuzzTXTWire checks the TXT record an ACME DNS-01 update carries, for any
// text libdns hands over: packed to the wire (as the UPDATE message sends
// it), its character-strings are each at most 255 bytes and joined are the
// text byte for byte, whatever backslashes, quotes, \DDD look-alikes or
// non-ASCII bytes it holds; and the record unpacked from the wire (as the
// DNS server reads it) packs to the same bytes.
func FuzzTXTWire(f *testing.F) {
	for _, s := range []string{"Ab3-_xyzzy", `a\b`, `\065`, `"quoted" text`, strings.Repeat("x", 255) + `\`, strings.Repeat(`\`, 300), "\x00\xff", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		rr, err := toDNS(libdns.RR{Name: "_acme-challenge", TTL: time.Minute, Type: "TXT", Data: data}, "example.com.")
		if err != nil {
			t.Fatalf("toDNS(%q): %v", data, err)
		}
		buf := make([]byte, dns.MaxMsgSize)
		n, err := dns.PackRR(rr, buf, 0, nil, false)
		if err != nil {
			if len(data) > 60000 {
				return // more than one message holds
			}
			t.Fatalf("packing TXT %q: %v", data, err)
		}
		wire := buf[:n]
		h := rr.Header()
		off := n - int(h.Rdlength)
		if h.Rdlength == 0 && data != "" {
			t.Fatalf("TXT %q packed without data", data)
		}
		var joined []byte
		for rd := wire[off:]; len(rd) > 0; {
			l := int(rd[0])
			if 1+l > len(rd) {
				t.Fatalf("TXT %q: character-string of %d bytes overruns the rdata", data, l)
			}
			joined = append(joined, rd[1:1+l]...)
			rd = rd[1+l:]
		}
		if string(joined) != data {
			t.Fatalf("TXT %q reached the wire as %q", data, joined)
		}
		back, _, err := dns.UnpackRR(wire, 0)
		if err != nil {
			t.Fatalf("unpacking TXT %q: %v", data, err)
		}
		again := make([]byte, dns.MaxMsgSize)
		m, err := dns.PackRR(back, again, 0, nil, false)
		if err != nil || string(again[:m]) != string(wire) {
			t.Fatalf("TXT %q read back from the wire as %v, which packs to %q (%v), not %q", data, back, again[:m], err, wire)
		}
	})
}
