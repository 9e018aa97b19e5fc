package routing

import (
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
)

// Route is where one sandbox lives and how it may be reached. It is built
// from the same field names and string values the control plane writes into
// Redis, so the memory store, routes.yaml, the admin API and Redis share one
// format (see ParseRoute and Fields).
type Route struct {
	// ID is the sandbox id the route belongs to (lower-case).
	ID string
	// HostIP is the node that runs the sandbox (field HostIP, required).
	HostIP netip.Addr
	// SandboxIP is the sandbox's own address, reachable from its node
	// (field SandboxIP, optional; invalid when absent).
	SandboxIP netip.Addr
	// CreatedAt is the sandbox's creation time in unix nanoseconds (field
	// CreatedAt); it changes when a sandbox is recreated and keys upstream pools.
	CreatedAt int64
	// Public is false only when AllowPublicTraffic is "false".
	Public bool
	// TrafficToken is the proxy credential required when Public is false
	// (field TrafficAccessToken, 64 hex chars).
	TrafficToken string
	// MaskRequestHost is an optional upstream Host template containing ${PORT}.
	MaskRequestHost string
	// Ports maps a container port to the node's host port.
	Ports map[uint16]uint16
	// Key is the store key the route was read from (a legacy one,
	// perhaps), for log lines about its data, which the operator fixes
	// there; empty for the memory store.
	Key string

	// reported is set by the first FirstReport.
	reported atomic.Bool
}

// FirstReport reports true to its first caller only, so that a data error
// found in a route read whole (a restricted route without its token) is
// logged once per store read of it, for every sandbox that has one: the
// cache answers every request with this same route until it is read again.
func (r *Route) FirstReport() bool { return r.reported.CompareAndSwap(false, true) }

// Field names of the Redis hash (and of routes.yaml and the admin API).
const (
	FieldHostIP             = "HostIP"
	FieldSandboxIP          = "SandboxIP"
	FieldCreatedAt          = "CreatedAt"
	FieldAllowPublicTraffic = "AllowPublicTraffic"
	FieldTrafficAccessToken = "TrafficAccessToken"
	FieldMaskRequestHost    = "MaskRequestHost"
)

// ReasonTokenRequired is why a restricted route without a traffic token
// is refused.
const ReasonTokenRequired = "required when AllowPublicTraffic is \"false\""

// FieldError says which field of a route is invalid and why.
type FieldError struct {
	Field  string // route field name, e.g. "SandboxIP"
	Reason string // why its value is refused

	// reported is set by the first FirstReport.
	reported atomic.Bool
}

// FirstReport reports true to its first caller only, so that a refused
// route is logged once per store read: the cache answers every request
// that waited on the read, and then its negative entry's hits, with this
// same error.
func (e *FieldError) FirstReport() bool { return e.reported.CompareAndSwap(false, true) }

// Error names the field and the reason.
func (e *FieldError) Error() string { return "route field " + e.Field + ": " + e.Reason }

// ParseRoute builds a route from a Redis-style hash. Unknown non-numeric
// fields are ignored (the control plane may add fields); any invalid known
// field or port field is a *FieldError naming it.
func ParseRoute(id string, fields map[string]string) (*Route, error) {
	return parseRoute(id, fields, false)
}

// ParseRouteStrict is ParseRoute for input an operator typed (routes.yaml,
// admin API): it also rejects unknown fields and a restricted route without
// a traffic token.
func ParseRouteStrict(id string, fields map[string]string) (*Route, error) {
	return parseRoute(id, fields, true)
}

// Fields renders the route back into its hash form (inverse of ParseRoute).
// Absent optional fields are left out; AllowPublicTraffic is written only
// when it is "false" (absent means public).
func (r *Route) Fields() map[string]string {
	m := make(map[string]string, 6+len(r.Ports))
	if r.HostIP.IsValid() {
		m[FieldHostIP] = r.HostIP.String()
	}
	if r.SandboxIP.IsValid() {
		m[FieldSandboxIP] = r.SandboxIP.String()
	}
	if r.CreatedAt != 0 {
		m[FieldCreatedAt] = strconv.FormatInt(r.CreatedAt, 10)
	}
	if !r.Public {
		m[FieldAllowPublicTraffic] = "false"
	}
	if r.TrafficToken != "" {
		m[FieldTrafficAccessToken] = r.TrafficToken
	}
	if r.MaskRequestHost != "" {
		m[FieldMaskRequestHost] = r.MaskRequestHost
	}
	for c, h := range r.Ports {
		m[strconv.Itoa(int(c))] = strconv.Itoa(int(h))
	}
	return m
}

// OnNode reports whether r's sandbox runs on node (its HostIP; node
// invalid: unknown, never). There the sandbox is dialed at SandboxIP and
// the container port itself, any port, mapped or not, as the platform's
// proxy does: the port fields are the host ports of the other nodes'
// way in, and the control plane writes only the exposed ones
// (exposed_port_list), or none.
func (r *Route) OnNode(node netip.Addr) bool { return node.IsValid() && r.HostIP == node }

// HostPort returns the node's host port mapped to a container port.
func (r *Route) HostPort(containerPort uint16) (uint16, bool) {
	p, ok := r.Ports[containerPort]
	return p, ok
}

// FieldSandboxID names the sandbox id in a FieldError about the id itself.
const FieldSandboxID = "sandbox_id"

// maxMaskHostLen bounds MaskRequestHost (a DNS name plus ":port").
const maxMaskHostLen = 261

// parseRoute is ParseRoute, and with strict ParseRouteStrict.
func parseRoute(id string, fields map[string]string, strict bool) (*Route, error) {
	if !ValidID(id) {
		return nil, &FieldError{Field: FieldSandboxID, Reason: "must match [a-z0-9][a-z0-9_-]{0,127}, got " + Echo(id)}
	}
	r := &Route{ID: id, Public: true, Ports: make(map[uint16]uint16)}
	// Map order is random; report the error of the smallest field name so the
	// same input always yields the same message. Names tie (a port and its
	// duplicate, long names cut alike): then the smallest reason.
	var first *FieldError
	fail := func(field, reason string) {
		if first == nil || field < first.Field || field == first.Field && reason < first.Reason {
			first = &FieldError{Field: field, Reason: reason}
		}
	}
	for k, v := range fields {
		switch k {
		case FieldHostIP:
			if v == "" {
				break // required: the check after the loop reports it
			}
			addr, reason := parseIP(v)
			if reason != "" {
				fail(k, reason)
			}
			r.HostIP = addr
		case FieldSandboxIP:
			if v == "" {
				break // optional: empty means absent
			}
			addr, reason := parseIP(v)
			if reason != "" {
				fail(k, reason)
			}
			r.SandboxIP = addr
		case FieldCreatedAt:
			if v == "" {
				break
			}
			// Held to int64's 19 digits (leading zeros aside) first:
			// ParseInt's error keeps a copy of all of its input, which
			// for megabytes of garbage was one per refusal.
			n, err := int64(-1), error(nil)
			if len(strings.TrimLeft(v, "0")) <= 19 {
				n, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil || v[0] < '0' || v[0] > '9' || n < 0 {
				fail(k, "must be a non-negative decimal integer (unix nanoseconds), got "+Echo(v))
				break
			}
			r.CreatedAt = n
		case FieldAllowPublicTraffic:
			// Fail closed: only the two exact spellings mean anything.
			switch v {
			case "true":
				r.Public = true
			case "false":
				r.Public = false
			default:
				fail(k, `must be "true" or "false", got `+Echo(v))
			}
		case FieldTrafficAccessToken:
			if v == "" {
				break
			}
			if !isHexToken(v) {
				fail(k, "must be 64 hex characters")
				break
			}
			r.TrafficToken = v
		case FieldMaskRequestHost:
			if v == "" {
				break
			}
			if reason := checkMaskHost(v); reason != "" {
				fail(k, reason)
				break
			}
			r.MaskRequestHost = v
		default:
			if !allDigits([]byte(k)) || k == "" {
				if strict {
					reason := "unknown field"
					if known := meantField(k); known != "" {
						reason += " (did you mean " + known + "?)"
					}
					fail(fieldName(k), reason)
				}
				break
			}
			container, ok := parsePort([]byte(k))
			if !ok {
				fail(fieldName(k), "container port must be 1..65535")
				break
			}
			host, ok := parsePort([]byte(v))
			if !ok {
				fail(fieldName(k), "host port must be 1..65535, got "+Echo(v))
				break
			}
			if _, dup := r.Ports[container]; dup {
				fail(strconv.Itoa(int(container)), "container port given twice (leading zeros)")
				break
			}
			r.Ports[container] = host
		}
	}
	// A required field missing because it was misspelled is reported
	// as the misspelling (above), not as missing: "HostIP" sorts before
	// "HostIp", and the file was refused naming only the field its
	// author saw written (TestMisspelledFieldIsNamed).
	if fields[FieldHostIP] == "" && !(strict && misspelt(fields, FieldHostIP)) { // absent or empty
		fail(FieldHostIP, "required")
	}
	if strict && !r.Public && r.TrafficToken == "" && !misspelt(fields, FieldTrafficAccessToken) {
		fail(FieldTrafficAccessToken, ReasonTokenRequired)
	}
	if first != nil {
		return nil, first
	}
	return r, nil
}

// knownFields are the route's named fields (the port fields aside).
var knownFields = [...]string{FieldHostIP, FieldSandboxIP, FieldCreatedAt, FieldAllowPublicTraffic,
	FieldTrafficAccessToken, FieldMaskRequestHost}

// meantField returns the known field that k, an unknown one, spells in
// another case or with '_' or '-' between words (HostIp, host_ip), or "".
func meantField(k string) string {
	if len(k) > 2*len(FieldTrafficAccessToken) {
		return "" // no known field, however it is spelled
	}
	squeezed := strings.NewReplacer("_", "", "-", "").Replace(k)
	for _, f := range knownFields {
		if strings.EqualFold(squeezed, f) {
			return f
		}
	}
	return ""
}

// misspelt reports whether fields hold field under another spelling
// (meantField) and not under its own.
func misspelt(fields map[string]string, field string) bool {
	for k := range fields {
		if k != field && meantField(k) == field {
			return true
		}
	}
	return false
}

// fieldName names a field of the input in a FieldError: the name is
// repeated in the 404 body and the log line of every request for the
// sandbox, so a long one is cut to maxEcho bytes.
func fieldName(k string) string {
	if len(k) <= maxEcho {
		return k
	}
	return k[:maxEcho] + "..."
}

// parseIP accepts a unicast-usable address: no zone, not unspecified
// (0.0.0.0 or :: would make the proxy dial itself), and one a TCP
// connection can reach: not multicast, not the IPv4 broadcast address, not
// IPv6 link-local (which needs the zone a route may not carry). Taken,
// those failed every request with a 502 that blamed the sandbox. An
// IPv4-mapped address ("::ffff:10.0.0.5", as a dual-stack socket reports
// an IPv4 peer) is the IPv4 address it maps: Go dials it as one, so
// "::ffff:0.0.0.0" is unspecified too, and it must equal node_ip for the
// same-node choice.
func parseIP(s string) (netip.Addr, string) {
	addr, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return netip.Addr{}, "not an IP address: " + Echo(s)
	case addr.Zone() != "":
		return netip.Addr{}, "IPv6 zones are not allowed"
	}
	addr = addr.Unmap() // after the zone check: Unmap drops a zone
	switch {
	case addr.IsUnspecified():
		return netip.Addr{}, "unspecified address"
	case addr.IsMulticast():
		return netip.Addr{}, "multicast address: no TCP connection reaches it"
	case addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return netip.Addr{}, "broadcast address: no TCP connection reaches it"
	case addr.Is6() && addr.IsLinkLocalUnicast():
		return netip.Addr{}, "IPv6 link-local address: it needs a zone, which routes may not carry"
	}
	return addr, ""
}

func isHexToken(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// checkMaskHost accepts a host[:port] template: printable ASCII without
// spaces or '/', so it can only ever become a Host header value.
func checkMaskHost(s string) string {
	if len(s) > maxMaskHostLen {
		return "longer than 261 bytes"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '/' {
			return "must be a host[:port] template of printable ASCII without spaces or '/'"
		}
	}
	return ""
}
