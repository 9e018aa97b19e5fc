package routing

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

const testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789ABCDEF"

func TestParseRoute(t *testing.T) {
	fields := map[string]string{
		FieldHostIP:             "10.0.0.7",
		FieldSandboxIP:          "192.168.0.2",
		FieldCreatedAt:          "1764460000000000000",
		FieldAllowPublicTraffic: "false",
		FieldTrafficAccessToken: testToken,
		FieldMaskRequestHost:    "${PORT}-box.internal:8080",
		"50005":                 "30001",
		"049983":                "30002", // leading zero normalised
		"SomethingNew":          "ignored by the lenient parser",
	}
	want := &Route{
		ID:              "box-1",
		HostIP:          netip.MustParseAddr("10.0.0.7"),
		SandboxIP:       netip.MustParseAddr("192.168.0.2"),
		CreatedAt:       1764460000000000000,
		Public:          false,
		TrafficToken:    testToken,
		MaskRequestHost: "${PORT}-box.internal:8080",
		Ports:           map[uint16]uint16{50005: 30001, 49983: 30002},
	}
	got, err := ParseRoute("box-1", fields)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseRoute =\n%+v\nwant\n%+v", got, want)
	}
	if p, ok := got.HostPort(49983); !ok || p != 30002 {
		t.Fatalf("HostPort(49983) = %d %v", p, ok)
	}
	// The strict parser rejects the unknown field, and only that.
	_, err = ParseRouteStrict("box-1", fields)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "SomethingNew" {
		t.Fatalf("ParseRouteStrict error = %v, want unknown field SomethingNew", err)
	}
	delete(fields, "SomethingNew")
	if got, err := ParseRouteStrict("box-1", fields); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseRouteStrict = %+v, %v", got, err)
	}
}

func TestParseRouteMinimal(t *testing.T) {
	r, err := ParseRouteStrict("a", map[string]string{FieldHostIP: "::1"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Public || r.SandboxIP.IsValid() || r.CreatedAt != 0 || r.Ports == nil || len(r.Ports) != 0 {
		t.Fatalf("minimal route = %+v", r)
	}
	// Empty optional values count as absent (the control plane may write "").
	r2, err := ParseRoute("a", map[string]string{FieldHostIP: "::1", FieldSandboxIP: "", FieldCreatedAt: "", FieldTrafficAccessToken: "", FieldMaskRequestHost: ""})
	if err != nil || !reflect.DeepEqual(r, r2) {
		t.Fatalf("empty optionals: %+v, %v", r2, err)
	}
}

// AllowPublicTraffic "true", as the control plane writes it for a public
// sandbox, is a public route, as its absence is: read as restricted, every
// request without a traffic token was refused.
func TestParseRouteExplicitlyPublic(t *testing.T) {
	for _, parse := range []func(string, map[string]string) (*Route, error){ParseRoute, ParseRouteStrict} {
		r, err := parse("a", map[string]string{FieldHostIP: "10.0.0.1", FieldAllowPublicTraffic: "true"})
		if err != nil || !r.Public {
			t.Fatalf("AllowPublicTraffic true: %+v, %v; want a public route", r, err)
		}
	}
}

// An IPv4-mapped address (what a dual-stack socket reports for an IPv4
// peer, and so what a control plane may store) is the IPv4 address: it
// must equal node_ip for the same-node choice, as Go dials it as IPv4.
func TestParseRouteIPv4Mapped(t *testing.T) {
	r, err := ParseRoute("box", map[string]string{FieldHostIP: "::ffff:10.0.0.7", FieldSandboxIP: "::FFFF:192.168.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.HostIP != netip.MustParseAddr("10.0.0.7") || r.SandboxIP != netip.MustParseAddr("192.168.0.2") {
		t.Fatalf("HostIP %v, SandboxIP %v; want the IPv4 addresses they map", r.HostIP, r.SandboxIP)
	}
}

func TestRouteRoundTrip(t *testing.T) {
	routes := []*Route{
		{ID: "a", HostIP: netip.MustParseAddr("127.0.0.1"), Public: true, Ports: map[uint16]uint16{}},
		{ID: "b_2", HostIP: netip.MustParseAddr("2001:db8::7"), SandboxIP: netip.MustParseAddr("fd00::2"), CreatedAt: 1, Public: true,
			Ports: map[uint16]uint16{1: 65535, 65535: 1, 50005: 50005}},
		{ID: strings.Repeat("z", 128), HostIP: netip.MustParseAddr("10.1.2.3"), SandboxIP: netip.MustParseAddr("10.9.9.9"),
			CreatedAt: 1764460000000000000, Public: false, TrafficToken: testToken, MaskRequestHost: "${PORT}.example:1",
			Ports: map[uint16]uint16{8080: 31000}},
		{ID: "pub-with-token", HostIP: netip.MustParseAddr("10.1.2.3"), Public: true, TrafficToken: testToken, Ports: map[uint16]uint16{}},
		// The longest MaskRequestHost taken, as its refusal says (261 bytes).
		{ID: "long-mask", HostIP: netip.MustParseAddr("10.1.2.3"), Public: true, MaskRequestHost: strings.Repeat("a", 261), Ports: map[uint16]uint16{}},
	}
	for _, want := range routes {
		for name, parse := range map[string]func(string, map[string]string) (*Route, error){"lenient": ParseRoute, "strict": ParseRouteStrict} {
			got, err := parse(want.ID, want.Fields())
			if err != nil {
				t.Fatalf("%s %s: %v", name, want.ID, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s round trip of %s:\n got %+v\nwant %+v", name, want.ID, got, want)
			}
		}
	}
}

func TestParseRouteErrors(t *testing.T) {
	base := func(kv ...string) map[string]string {
		m := map[string]string{FieldHostIP: "10.0.0.1", "50005": "30000"}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<delete>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	cases := []struct {
		name       string
		id         string
		fields     map[string]string
		field      string // expected FieldError.Field
		strictOnly bool
	}{
		{name: "bad id", id: "Bad.ID", fields: base(), field: FieldSandboxID},
		{name: "empty id", id: "", fields: base(), field: FieldSandboxID},
		{name: "no HostIP", fields: base(FieldHostIP, "<delete>"), field: FieldHostIP},
		{name: "empty HostIP", fields: base(FieldHostIP, ""), field: FieldHostIP},
		{name: "HostIP hostname", fields: base(FieldHostIP, "node-1.internal"), field: FieldHostIP},
		{name: "HostIP with port", fields: base(FieldHostIP, "10.0.0.1:80"), field: FieldHostIP},
		{name: "HostIP unspecified", fields: base(FieldHostIP, "0.0.0.0"), field: FieldHostIP},
		{name: "HostIP unspecified, IPv4-mapped", fields: base(FieldHostIP, "::ffff:0.0.0.0"), field: FieldHostIP},
		{name: "SandboxIP unspecified, IPv4-mapped", fields: base(FieldSandboxIP, "::ffff:0.0.0.0"), field: FieldSandboxIP},
		{name: "HostIP zone", fields: base(FieldHostIP, "fe80::1%eth0"), field: FieldHostIP},
		{name: "HostIP IPv4-mapped with zone", fields: base(FieldHostIP, "::ffff:10.0.0.1%eth0"), field: FieldHostIP},
		// No TCP connection reaches these: a route naming one was taken,
		// and each request to it failed with a misleading 502.
		{name: "HostIP multicast", fields: base(FieldHostIP, "224.0.0.1"), field: FieldHostIP},
		{name: "HostIP multicast, IPv4-mapped", fields: base(FieldHostIP, "::ffff:239.1.2.3"), field: FieldHostIP},
		{name: "HostIP IPv6 multicast", fields: base(FieldHostIP, "ff02::1"), field: FieldHostIP},
		{name: "HostIP broadcast", fields: base(FieldHostIP, "255.255.255.255"), field: FieldHostIP},
		{name: "HostIP IPv6 link-local, which needs a zone", fields: base(FieldHostIP, "fe80::1"), field: FieldHostIP},
		{name: "SandboxIP multicast", fields: base(FieldSandboxIP, "ff05::2"), field: FieldSandboxIP},
		{name: "SandboxIP IPv6 link-local", fields: base(FieldSandboxIP, "fe80::a:b"), field: FieldSandboxIP},
		{name: "SandboxIP bad", fields: base(FieldSandboxIP, "10.0.0"), field: FieldSandboxIP},
		{name: "CreatedAt text", fields: base(FieldCreatedAt, "yesterday"), field: FieldCreatedAt},
		{name: "CreatedAt negative", fields: base(FieldCreatedAt, "-1"), field: FieldCreatedAt},
		{name: "CreatedAt plus", fields: base(FieldCreatedAt, "+1"), field: FieldCreatedAt},
		{name: "CreatedAt overflow", fields: base(FieldCreatedAt, "9223372036854775808"), field: FieldCreatedAt},
		{name: "AllowPublicTraffic empty", fields: base(FieldAllowPublicTraffic, ""), field: FieldAllowPublicTraffic},
		{name: "AllowPublicTraffic FALSE", fields: base(FieldAllowPublicTraffic, "FALSE"), field: FieldAllowPublicTraffic},
		{name: "AllowPublicTraffic 0", fields: base(FieldAllowPublicTraffic, "0"), field: FieldAllowPublicTraffic},
		{name: "token short", fields: base(FieldTrafficAccessToken, "abc"), field: FieldTrafficAccessToken},
		{name: "token not hex", fields: base(FieldTrafficAccessToken, strings.Repeat("g", 64)), field: FieldTrafficAccessToken},
		{name: "token too long", fields: base(FieldTrafficAccessToken, testToken+"0"), field: FieldTrafficAccessToken},
		{name: "mask with space", fields: base(FieldMaskRequestHost, "a b"), field: FieldMaskRequestHost},
		{name: "mask with slash", fields: base(FieldMaskRequestHost, "host/path"), field: FieldMaskRequestHost},
		{name: "mask with newline", fields: base(FieldMaskRequestHost, "host\r\nX-Evil: 1"), field: FieldMaskRequestHost},
		{name: "mask non-ascii", fields: base(FieldMaskRequestHost, "hôst"), field: FieldMaskRequestHost},
		{name: "mask too long", fields: base(FieldMaskRequestHost, strings.Repeat("a", 300)), field: FieldMaskRequestHost},
		{name: "mask one byte too long", fields: base(FieldMaskRequestHost, strings.Repeat("a", 262)), field: FieldMaskRequestHost},
		{name: "mask with DEL", fields: base(FieldMaskRequestHost, "host\x7f"), field: FieldMaskRequestHost},
		{name: "container port zero", fields: base("0", "1"), field: "0"},
		{name: "container port too big", fields: base("65536", "1"), field: "65536"},
		{name: "host port zero", fields: base("8080", "0"), field: "8080"},
		{name: "host port text", fields: base("8080", "http"), field: "8080"},
		{name: "host port too big", fields: base("8080", "70000"), field: "8080"},
		{name: "host port empty", fields: base("8080", ""), field: "8080"},
		{name: "duplicate after normalising", fields: base("050005", "30000"), field: "50005"},
		{name: "port key too long is cut in the error", fields: base(strings.Repeat("0", 1000)+"1", "2"), field: strings.Repeat("0", 64) + "..."},
		{name: "port key of 64 bytes is named whole", fields: base(strings.Repeat("0", 63)+"1", "2"), field: strings.Repeat("0", 63) + "1"},
		{name: "restricted without token", fields: base(FieldAllowPublicTraffic, "false"), field: FieldTrafficAccessToken, strictOnly: true},
		{name: "unknown field", fields: base("hostip", "10.0.0.1"), field: "hostip", strictOnly: true},
		{name: "negative-looking port key", fields: base("-1", "2"), field: "-1", strictOnly: true},
		// An empty name is no port (the control plane may write one): a
		// Redis route with it stays served.
		{name: "empty field name", fields: base("", "2"), field: "", strictOnly: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.id
			if id == "" && tc.field != FieldSandboxID {
				id = "box"
			}
			r, err := ParseRouteStrict(id, tc.fields)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("ParseRouteStrict = %+v, %v; want FieldError on %q", r, err, tc.field)
			}
			if len(fe.Error()) > 300 {
				t.Fatalf("error too long: %s", fe.Error())
			}
			r, err = ParseRoute(id, tc.fields)
			if tc.strictOnly {
				if err != nil {
					t.Fatalf("lenient ParseRoute = %v, want success", err)
				}
				return
			}
			if !errors.As(err, &fe) || fe.Field != tc.field || r != nil {
				t.Fatalf("ParseRoute = %+v, %v; want FieldError on %q", r, err, tc.field)
			}
		})
	}
}

// With several bad fields the reported one must not depend on map order.
func TestParseRouteErrorDeterministic(t *testing.T) {
	fields := map[string]string{FieldHostIP: "x", FieldSandboxIP: "y", FieldCreatedAt: "z", "1": "0", "2": "0", "3": "0"}
	for range 50 {
		_, err := ParseRoute("box", fields)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "1" {
			t.Fatalf("got %v, want the error of field \"1\"", err)
		}
	}
}

// Fields named alike in errors (a port field and the duplicate of another;
// two long names cut to the same text, a zero-padded port and an unknown
// field) still give one message: the 404 body and the log line of a
// broken route, or the admin API's 400, must not change between reads.
func TestParseRouteErrorDeterministicOnTies(t *testing.T) {
	pad := strings.Repeat("0", maxEcho)
	for _, tc := range []struct {
		strict bool
		fields map[string]string
	}{
		{false, map[string]string{FieldHostIP: "10.0.0.1", "50005": "x", "050005": "1", "0050005": "1"}},
		{true, map[string]string{FieldHostIP: "10.0.0.1", FieldAllowPublicTraffic: "true", pad + "1": "1", pad + "x": "1"}},
	} {
		_, first := parseRoute("box", tc.fields, tc.strict)
		for range 100 {
			if _, err := parseRoute("box", tc.fields, tc.strict); err == nil || first == nil || err.Error() != first.Error() {
				t.Fatalf("%q: %v, then %v", tc.fields, first, err)
			}
		}
	}
}

// FuzzParseRoute feeds arbitrary hash fields to the route parser: it must
// answer every input with a route or a *FieldError, never panic, and a
// route it accepts must survive Fields and a second parse unchanged (the
// memory store, routes.yaml and the admin API all go through that). And
// ParseRouteStrict is ParseRoute with exactly the two refusals more that
// its doc comment names: it accepts what ParseRoute accepts, as the same
// route, unless a field is neither known nor a port, or the route is
// restricted without a traffic token; it accepts nothing ParseRoute
// refuses. (FuzzRedisHash holds the lenient parser's route to the hash.)
func FuzzParseRoute(f *testing.F) {
	f.Add("sb1", FieldHostIP, "10.0.0.7", "50005", "31000", FieldCreatedAt, "1764460000000000000")
	f.Add("sb2", FieldHostIP, "::ffff:10.0.0.7", FieldAllowPublicTraffic, "false", FieldTrafficAccessToken, testToken)
	f.Add("sb3", FieldSandboxIP, "fe80::1%eth0", "080", "8080", "80", "8080")
	f.Add("sb4", FieldHostIP, "1.2.3.4", FieldMaskRequestHost, "${PORT}-box.internal:8080", "0", "1")
	f.Add("Bad/Id", FieldHostIP, "0.0.0.0", FieldCreatedAt, "-1", "99999", "-1")
	f.Add("sb5", FieldHostIP, "10.0.0.7", FieldAllowPublicTraffic, "false", "Extra", "x")
	f.Add("sb6", FieldHostIP, "10.0.0.7", "hostip", "10.0.0.8", "", "")
	f.Add("sb7", FieldHostIP, "10.0.0.7", FieldTrafficAccessToken, "", FieldAllowPublicTraffic, "false")
	f.Fuzz(func(t *testing.T, id, k1, v1, k2, v2, k3, v3 string) {
		fields := map[string]string{k1: v1, k2: v2, k3: v3}
		var routes [2]*Route
		for i, strict := range []bool{false, true} {
			r, err := parseRoute(id, fields, strict)
			if err != nil {
				var fe *FieldError
				if !errors.As(err, &fe) || r != nil {
					t.Fatalf("parseRoute(%q, %q, %v) = %v, %v: want a *FieldError alone", id, fields, strict, r, err)
				}
				continue
			}
			routes[i] = r
			if !r.HostIP.IsValid() || r.ID != id {
				t.Fatalf("accepted route without HostIP or with another id: %+v", r)
			}
			again, err := ParseRoute(id, r.Fields())
			if err != nil {
				t.Fatalf("route %+v from %q: its own fields %q do not parse: %v", r, fields, r.Fields(), err)
			}
			if !reflect.DeepEqual(r, again) {
				t.Fatalf("route %+v from %q came back as %+v", r, fields, again)
			}
		}
		lenient, strict := routes[0], routes[1]
		if lenient == nil {
			if strict != nil {
				t.Fatalf("%q: ParseRoute refuses it, ParseRouteStrict takes %+v", fields, strict)
			}
			return
		}
		unknown := false
		for k := range fields {
			switch k {
			case FieldHostIP, FieldSandboxIP, FieldCreatedAt, FieldAllowPublicTraffic, FieldTrafficAccessToken, FieldMaskRequestHost:
			default:
				unknown = unknown || k == "" || strings.Trim(k, "0123456789") != ""
			}
		}
		wantRefused := unknown || !lenient.Public && lenient.TrafficToken == ""
		switch {
		case wantRefused && strict != nil:
			t.Fatalf("%q: ParseRouteStrict takes %+v (unknown field %v, restricted without a token %v)", fields, strict, unknown, !lenient.Public && lenient.TrafficToken == "")
		case !wantRefused && strict == nil:
			_, err := ParseRouteStrict(id, fields)
			t.Fatalf("%q: ParseRoute takes it, ParseRouteStrict refuses: %v", fields, err)
		case strict != nil && !reflect.DeepEqual(lenient, strict):
			t.Fatalf("%q: ParseRoute reads %+v, ParseRouteStrict %+v", fields, lenient, strict)
		}
	})
}
