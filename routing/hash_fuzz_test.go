package routing

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// hgetallReply turns fuzz bytes into what HGETALL returns: a flat list of
// field, value, field, value... (here separated by NUL). A field written
// twice keeps its last value, as HSET would; an odd trailing field gets "".
func hgetallReply(b []byte) map[string]string {
	parts := bytes.Split(b, []byte{0})
	m := make(map[string]string, len(parts)/2)
	for i := 0; i < len(parts); i += 2 {
		v := ""
		if i+1 < len(parts) {
			v = string(parts[i+1])
		}
		m[string(parts[i])] = v
	}
	return m
}

// FuzzRedisHash feeds arbitrary Redis hashes (as the control plane might
// write them) to ParseRoute, the decoder behind the Redis store. A route it
// accepts is what the proxy dials without further checks, so it must:
// name only addresses and ports the hash spells out, carry every exposed
// port, be restricted unless the hash says otherwise, and decode to the
// same route from its own Fields. A refusal must be a *FieldError whose
// message is the same every time, short, and never quotes the token.
func FuzzRedisHash(f *testing.F) {
	kv := func(pairs ...string) []byte { return []byte(strings.Join(pairs, "\x00")) }
	f.Add("sb1", kv(FieldHostIP, "10.0.0.7", FieldSandboxIP, "192.168.0.2", FieldCreatedAt, "1764460000000000000",
		FieldAllowPublicTraffic, "false", FieldTrafficAccessToken, testToken, FieldMaskRequestHost, "sbx-${PORT}.internal",
		"50005", "30001", "49983", "30002"))
	f.Add("sb2", kv(FieldHostIP, "::ffff:10.0.0.7", "0050005", "0030001", "Extra", "x"))
	f.Add("sb3", kv(FieldHostIP, "10.0.0.7", FieldAllowPublicTraffic, "false"))
	f.Add("sb4", kv(FieldHostIP, "10.0.0.7", FieldTrafficAccessToken, "not-a-token-"+testToken, "1", "65535"))
	f.Add("sb5", kv(FieldHostIP, "10.0.0.7", "000000000000050005", "30001"))
	f.Add("sb6", kv(FieldHostIP, "", FieldSandboxIP, "fe80::1%eth0", FieldCreatedAt, "-0"))
	f.Add("sb7", kv(FieldHostIP, "::ffff:0.0.0.0", "1", "1"))
	f.Fuzz(func(t *testing.T, id string, reply []byte) {
		fields := hgetallReply(reply)
		r, err := ParseRoute(id, fields)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || r != nil {
				t.Fatalf("ParseRoute(%q, %q) = %v, %v: want a *FieldError alone", id, fields, r, err)
			}
			if _, again := ParseRoute(id, fields); again == nil || again.Error() != err.Error() {
				t.Fatalf("ParseRoute(%q, %q) failed with %q, then with %v", id, fields, err, again)
			}
			// The error reaches the client's 404 body and the log: it quotes
			// at most 64 bytes of input (up to 4 bytes each, escaped).
			if len(err.Error()) > 400 {
				t.Fatalf("error of %d bytes: %.400s", len(err.Error()), err)
			}
			if tok := fields[FieldTrafficAccessToken]; len(tok) >= 16 && !otherwiseNamed(id, fields, tok) && strings.Contains(err.Error(), tok) {
				t.Fatalf("error quotes the traffic token: %s", err)
			}
			return
		}

		if r.ID != id || !ValidID(id) {
			t.Fatalf("route for id %q has ID %q", id, r.ID)
		}
		// Addresses: exactly those the hash names (an IPv4-mapped one as
		// the IPv4 address Go dials for it), never one the proxy would
		// reach itself through (unspecified) or a zone.
		named := func(field string, got netip.Addr, required bool) {
			v := fields[field]
			if v == "" {
				if required || got.IsValid() {
					t.Fatalf("%s absent from %q, route has %v", field, fields, got)
				}
				return
			}
			want, perr := netip.ParseAddr(v)
			if perr != nil || got != want.Unmap() || got.Zone() != "" || got.IsUnspecified() {
				t.Fatalf("%s %q decoded as %v", field, v, got)
			}
		}
		named(FieldHostIP, r.HostIP, true)
		named(FieldSandboxIP, r.SandboxIP, false)

		// Ports: one entry per numeric field, both sides 1..65535 and the
		// numbers the hash wrote (leading zeros aside).
		numeric := 0
		for k, v := range fields {
			if k == "" || strings.Trim(k, "0123456789") != "" {
				continue
			}
			numeric++
			c, cerr := strconv.ParseUint(k, 10, 16)
			h, herr := strconv.ParseUint(v, 10, 16)
			if cerr != nil || herr != nil || c == 0 || h == 0 {
				t.Fatalf("port field %q: %q accepted", k, v)
			}
			if got, ok := r.HostPort(uint16(c)); !ok || uint64(got) != h {
				t.Fatalf("port field %q: %q decoded as %d %v", k, v, got, ok)
			}
		}
		if len(r.Ports) != numeric {
			t.Fatalf("%d port fields in %q, route has %v", numeric, fields, r.Ports)
		}

		// Auth: public only when the hash says so or says nothing.
		switch v, ok := fields[FieldAllowPublicTraffic]; {
		case !ok && !r.Public, ok && v == "true" && !r.Public, ok && v == "false" && r.Public:
			t.Fatalf("AllowPublicTraffic %q (present %v) decoded as public=%v", v, ok, r.Public)
		case ok && v != "true" && v != "false":
			t.Fatalf("AllowPublicTraffic %q accepted", v)
		}
		if r.TrafficToken != fields[FieldTrafficAccessToken] || r.TrafficToken != "" && !isHexToken(r.TrafficToken) {
			t.Fatalf("token %q decoded as %q", fields[FieldTrafficAccessToken], r.TrafficToken)
		}
		if r.MaskRequestHost != fields[FieldMaskRequestHost] || checkMaskHost(r.MaskRequestHost) != "" {
			t.Fatalf("MaskRequestHost %q decoded as %q", fields[FieldMaskRequestHost], r.MaskRequestHost)
		}
		if v := fields[FieldCreatedAt]; v != "" {
			if n, perr := strconv.ParseInt(v, 10, 64); perr != nil || n != r.CreatedAt || n < 0 {
				t.Fatalf("CreatedAt %q decoded as %d", v, r.CreatedAt)
			}
		} else if r.CreatedAt != 0 {
			t.Fatalf("no CreatedAt, route has %d", r.CreatedAt)
		}

		// Idempotence: the route's own hash decodes to the same route, and
		// decoding the input again does too.
		for name, in := range map[string]map[string]string{"own fields": r.Fields(), "same input": fields} {
			again, err := ParseRoute(id, in)
			if err != nil || !reflect.DeepEqual(r, again) {
				t.Fatalf("%s %q: %+v, %v; first decoded as %+v", name, in, again, err, r)
			}
		}
	})
}

// otherwiseNamed reports whether s also occurs in the id or in another
// field or value (an error may quote those).
func otherwiseNamed(id string, fields map[string]string, s string) bool {
	if strings.Contains(id, s) {
		return true
	}
	for k, v := range fields {
		if strings.Contains(k, s) || k != FieldTrafficAccessToken && strings.Contains(v, s) {
			return true
		}
	}
	return false
}
