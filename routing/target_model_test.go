package routing

import (
	"net/netip"
	"strconv"
	"strings"
)

// modelParser is the target rules of the README written out plainly, to
// hold Parser to in FuzzParse: a parser that reads another sandbox or port
// out of a host than these rules name (a misroute) disagrees with it.
type modelParser struct {
	domains []string // lower-case; empty = any domain
	shared  []string // lower-case, localhost included
}

// modelTarget is what modelParser reads from a Host and a target header pair.
type modelTarget struct {
	port   int
	id     string
	shared bool
}

// parse returns the target host (and, on a shared host, the id and port
// headers) name, or false when the request is to be refused.
func (m modelParser) parse(host, hdrID, hdrPort string) (modelTarget, bool) {
	if host == "" {
		return modelTarget{}, false
	}
	name := host
	switch {
	case host[0] == '[':
		end := strings.IndexByte(host, ']')
		if end < 0 || !modelIPv6(host[1:end]) {
			return modelTarget{}, false
		}
		if rest := host[end+1:]; rest != "" && (rest[0] != ':' || !modelHostPort(rest[1:])) {
			return modelTarget{}, false
		}
		return modelHeaders(hdrID, hdrPort)
	case strings.Count(host, ":") > 1:
		if !modelIPv6(host) {
			return modelTarget{}, false
		}
		return modelHeaders(hdrID, hdrPort)
	case strings.Contains(host, ":"):
		var port string
		name, port, _ = strings.Cut(host, ":")
		if !modelHostPort(port) {
			return modelTarget{}, false
		}
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return modelTarget{}, false
	}
	if strings.Trim(name, "0123456789.") == "" {
		a, err := netip.ParseAddr(name)
		if err != nil || !a.Is4() {
			return modelTarget{}, false
		}
		return modelHeaders(hdrID, hdrPort)
	}
	name = asciiLower(name)
	for _, s := range m.shared {
		if name == s {
			return modelHeaders(hdrID, hdrPort)
		}
	}
	label, domain, hasDomain := strings.Cut(name, ".")
	if len(m.domains) > 0 {
		found := false
		for _, d := range m.domains {
			found = found || hasDomain && domain == d
		}
		if !found {
			return modelTarget{}, false
		}
	} else if hasDomain {
		for l := range strings.SplitSeq(domain, ".") {
			if l == "" || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
				return modelTarget{}, false
			}
		}
	}
	port, id, ok := strings.Cut(label, "-")
	if !ok {
		return modelTarget{}, false
	}
	return modelPair(id, port, false)
}

// modelHeaders reads the target of a shared host from its header pair.
func modelHeaders(id, port string) (modelTarget, bool) {
	if id == "" || port == "" {
		return modelTarget{}, false
	}
	return modelPair(asciiLower(id), port, true)
}

// modelPair checks a lower-case id and a port spelled in decimal.
func modelPair(id, port string, shared bool) (modelTarget, bool) {
	if len(port) > 10 || strings.Trim(port, "0123456789") != "" {
		return modelTarget{}, false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || !idRegexp.MatchString(id) {
		return modelTarget{}, false
	}
	return modelTarget{port: n, id: id, shared: shared}, true
}

// modelHostPort: the port of a Host is up to 5 digits, or empty.
func modelHostPort(p string) bool {
	return len(p) <= 5 && strings.Trim(p, "0123456789") == ""
}

func modelIPv6(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && a.Zone() == ""
}

// asciiLower lower-cases ASCII letters only: strings.ToLower would turn
// the Kelvin sign into a 'k'.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
