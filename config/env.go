package config

import (
	"net"
	"net/netip"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// UnknownVar is a CUBEPROXY_* environment variable that names no setting.
type UnknownVar struct {
	Name    string // as set in the environment
	Nearest string // the variable it most likely meant; "" when none is close
}

// UnknownEnv lists the CUBEPROXY_* variables in environ (os.Environ's
// NAME=value entries) that LoadCommand does not read, sorted by name.
// LoadCommand only asks for the names it knows, so a misspelled one
// (CUBEPROXY_ROUTE for CUBEPROXY_ROUTES) would otherwise be ignored
// without a word.
//
// Kubernetes' service links are left out: a Service named cubeproxy puts
// CUBEPROXY_SERVICE_HOST, CUBEPROXY_PORT_8081_TCP and the like into every
// pod of its namespace, and one named cubeproxy-redis-master
// CUBEPROXY_REDIS_MASTER_SERVICE_HOST and so on (serviceLink).
func UnknownEnv(environ []string) []UnknownVar {
	known := map[string]bool{EnvPrefix + "CONFIG": true}
	var names []string // in declaration order, for a stable nearest pick
	for _, s := range collect(reflect.ValueOf(Default()).Elem()) {
		known[s.envName()] = true
		names = append(names, s.envName())
	}
	var out []UnknownVar
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || known[name] || serviceLink(name, value) {
			continue
		}
		out = append(out, UnknownVar{Name: name, Nearest: nearest(name, names)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// serviceLink reports whether name=value is a variable Kubernetes sets
// for a Service named cubeproxy or cubeproxy-<anything> (a Helm release
// named cubeproxy puts its Redis subchart's cubeproxy-redis-master there):
// its name ends in one of the link suffixes and its value has that
// suffix's shape, an address, a port number or a proto://address:port
// URL. The value is looked at so that a misspelled setting of a link's
// shape (CUBEPROXY_REDIS_PORT=6379) is still warned about.
func serviceLink(name, value string) bool {
	rest := "_" + strings.TrimPrefix(name, EnvPrefix) // "_" ends the empty name of Service cubeproxy
	for i := range len(rest) {
		if rest[i] == '_' && linkSuffix(rest[i+1:], value) {
			return true
		}
	}
	return false
}

// linkSuffix reports whether s is the part of a service link's name after
// the Service's (SERVICE_HOST, PORT_8081_TCP_ADDR…) and value its value.
func linkSuffix(s, value string) bool {
	switch {
	case s == "SERVICE_HOST":
		return isIP(value)
	case s == "SERVICE_PORT", strings.HasPrefix(s, "SERVICE_PORT_"):
		return isPortNumber(value)
	case s == "PORT":
		return isLinkURL(value)
	}
	rest, ok := strings.CutPrefix(s, "PORT_") // PORT_<number>_<PROTO>[_PROTO|_PORT|_ADDR]
	if !ok {
		return false
	}
	parts := strings.Split(rest, "_")
	if len(parts) < 2 || len(parts) > 3 || !isPortNumber(parts[0]) {
		return false
	}
	switch parts[1] {
	case "TCP", "UDP", "SCTP":
	default:
		return false
	}
	if len(parts) == 2 {
		return isLinkURL(value)
	}
	switch parts[2] {
	case "PROTO":
		return value == strings.ToLower(parts[1])
	case "PORT":
		return value == parts[0]
	case "ADDR":
		return isIP(value)
	}
	return false
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

func isPortNumber(s string) bool {
	n, err := strconv.ParseUint(s, 10, 16)
	return err == nil && n > 0
}

// isLinkURL reports whether s is a service link's proto://address:port.
func isLinkURL(s string) bool {
	proto, addr, ok := strings.Cut(s, "://")
	if !ok || proto != "tcp" && proto != "udp" && proto != "sctp" {
		return false
	}
	host, port, err := net.SplitHostPort(addr)
	return err == nil && isIP(host) && isPortNumber(port)
}

// nearest picks the known variable name most likely meant: the only one
// that ends in name's path (the section left out, as CONNECT_TIMEOUT for
// UPSTREAM_CONNECT_TIMEOUT), else the closest within a few typos.
func nearest(name string, known []string) string {
	want := strings.ToUpper(strings.TrimPrefix(name, EnvPrefix))
	var suffixed []string
	for _, k := range known {
		if strings.HasSuffix(k, "_"+want) {
			suffixed = append(suffixed, k)
		}
	}
	if len(suffixed) == 1 {
		return suffixed[0]
	}
	best, bestDist := "", max(2, len(want)/4)+1
	for _, k := range known {
		if d := editDistance(want, strings.TrimPrefix(k, EnvPrefix)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// FileOnlySetting is the setting that the CUBEPROXY_* variable name
// spells (or a part of which it spells: CUBEPROXY_TLS_FILES_0_CERT_FILE)
// when that setting exists only in the YAML file, a list of sections or a
// map with no variable or flag; "" otherwise. An operator who sets one
// is told where the setting goes rather than only that it is none.
func FileOnlySetting(name string) string {
	var found string
	var walk func(t reflect.Type, path []string)
	walk = func(t reflect.Type, path []string) {
		for i := 0; i < t.NumField() && found == ""; i++ {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			p := append(path[:len(path):len(path)], key)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, p)
				continue
			}
			if supported(reflect.New(f.Type).Elem()) {
				continue
			}
			env := EnvPrefix + strings.ToUpper(strings.Join(p, "_"))
			if name == env || strings.HasPrefix(name, env+"_") {
				found = strings.Join(p, ".")
			}
		}
	}
	walk(reflect.TypeOf(Config{}), nil)
	return found
}
