package routing

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// MaxIDLen is the longest sandbox id accepted ([a-z0-9][a-z0-9_-]{0,127}).
const MaxIDLen = 128

// IDForm says what a sandbox id is ([a-z0-9][a-z0-9_-]{0,127}), for the
// messages that refuse one.
const IDForm = "lower-case letters, digits, - and _, at most 128, starting with a letter or digit"

const (
	// maxHostLen is the longest DNS name (RFC 1035) once port and trailing dot are gone.
	maxHostLen = 253
	// maxPortDigits bounds a port string so leading zeros are tolerated without
	// letting the number overflow.
	maxPortDigits = 10
	// maxEcho is how much of the client's input an error message repeats.
	maxEcho = 64
)

// Target error codes (TargetError.Code).
const (
	CodeInvalidHost          = "invalid_host"
	CodeInvalidPort          = "invalid_port"
	CodeInvalidSandboxID     = "invalid_sandbox_id"
	CodeMissingTargetHeaders = "missing_target_headers"
	CodeDomainNotAllowed     = "domain_not_allowed"
	CodeInvalidPath          = "invalid_sandbox_path"
)

// Override header names; *fasthttp.RequestHeader.Peek normalises case itself.
const (
	HeaderCubeSandboxID   = "X-Cube-Sandbox-Id"
	HeaderCubeSandboxPort = "X-Cube-Sandbox-Port"
	HeaderE2BSandboxID    = "E2b-Sandbox-Id"
	HeaderE2BSandboxPort  = "E2b-Sandbox-Port"
)

// Target is what a request addresses: one container port of one sandbox.
// It holds the id in a fixed array so parsing allocates nothing.
type Target struct {
	Port uint16 // container port
	// Shared is true when the target came from override headers on a shared host.
	Shared bool
	// PathPrefix is the length of the "/sandbox/<id>/<port>" prefix of
	// the request target when the target came from the path; 0 otherwise.
	PathPrefix int
	idLen      int
	idBuf      [MaxIDLen]byte
}

// ID returns the lower-case sandbox id; it aliases t and is valid until t changes.
func (t *Target) ID() []byte { return t.idBuf[:t.idLen] }

// HeaderPeeker reads request headers; *fasthttp.RequestHeader satisfies it.
type HeaderPeeker interface {
	// PeekAll returns the value of every line of the header key. The
	// result may be reused by the next call; the values themselves stay.
	PeekAll(key string) [][]byte
}

// TargetError is a request whose target cannot be parsed (400).
type TargetError struct {
	Code   string // machine-readable, e.g. "invalid_host", "invalid_port"
	Reason string // one sentence for the client, the refused value quoted
}

// Error is Reason alone: the proxy answers it to the client as is.
func (e *TargetError) Error() string { return e.Reason }

// ParserConfig selects which hosts are shared and which domains are allowed.
type ParserConfig struct {
	// Domains, when not empty, is the allow-list of domains under which
	// <port>-<id>.<domain> hosts are accepted.
	Domains []string
	// SharedHosts are hostnames (besides IP literals and localhost) on which
	// the X-Cube-Sandbox-Id/-Port (or E2b-Sandbox-Id/-Port) headers select the target.
	SharedHosts []string
}

// Parser turns a Host header (and, on shared hosts, override headers) into a Target.
type Parser struct {
	domains []string // lower-case, no leading or trailing dot
	shared  []string // lower-case, no trailing dot; includes "localhost"
}

// NewParser returns a parser for cfg. Domains and shared hosts are compared
// case-insensitively; a trailing dot (and, for domains, a leading "." or
// "*.") is ignored; empty entries are skipped.
func NewParser(cfg ParserConfig) *Parser {
	p := &Parser{shared: []string{"localhost"}}
	for _, d := range cfg.Domains {
		d = strings.TrimPrefix(normalizeName(d), "*.")
		d = strings.TrimPrefix(d, ".")
		if d != "" {
			p.domains = append(p.domains, d)
		}
	}
	for _, h := range cfg.SharedHosts {
		if h = normalizeName(h); h != "" {
			p.shared = append(p.shared, h)
		}
	}
	return p
}

func normalizeName(s string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
}

// Parse fills t from host and, on shared hosts, from h.
// It returns a *TargetError for bad input and allocates nothing on success.
func (p *Parser) Parse(t *Target, host []byte, h HeaderPeeker) error {
	t.reset()
	name, isIP, err := splitHost(host)
	if err != nil {
		return err
	}
	if isIP || p.isShared(name) {
		return parseHeaders(t, h)
	}
	return p.parseSandboxHost(t, name)
}

// ParseRequest is Parse for a request whose request target is target. An
// absolute-form target ("GET http://host/p", RFC 9112 3.2.2) names a host of
// its own, which the RFC tells servers and proxies to go by instead of Host,
// as nginx (so the platform's proxy) and a front proxy that follows the RFC
// do. Routing takes Host, so such a target must name the same sandbox and
// port, or the request is refused: otherwise a request a front proxy checked
// as one sandbox's would reach another. Other targets are not looked at, so
// the origin form ("/p") costs one byte compare.
//
// A target under PathRoot ("/sandbox/<id>/<port>/rest") on a host that
// names no sandbox port (an IP, a shared host, any other name) is routed
// by its path, as the platform's proxy routes it: see parsePath. In
// absolute form ("http://<node>/sandbox/..."), both Host and the target's
// own host must be such hosts, else Host routes as for any other target;
// PathPrefix counts from the target's start, so the prefix cut off leaves
// the sandbox its origin-form path.
// Slashes before "sandbox" count as one ("//sandbox/x/80/", from a client
// that joined a base URL ending in '/' and a path), as nginx's
// merge_slashes has them. Within the prefix an empty segment is refused:
// "/sandbox//80/" is a template's missing id far more often than a
// spelling, and its error names the id (nginx merges those too).
// A sandbox host name keeps its own routing for every path, so that an app
// that serves pages under /sandbox/ is still reached by its own name.
func (p *Parser) ParseRequest(t *Target, host, target []byte, h HeaderPeeker) error {
	if under, ok := underPathRoot(TargetPath(target)); ok {
		byPath, err := p.routesByPath(host)
		if err == nil && byPath && target[0] != '/' {
			// Absolute form ("GET http://<node>/sandbox/<id>/<port>/p",
			// from a client that has the node as its HTTP proxy): nginx
			// routes it by its path too. Its own host must serve paths as
			// well; one that does not (a sandbox's, a malformed one) is
			// routed by Host below, which refuses it for naming no sandbox
			// Host does.
			authority, _ := TargetAuthority(target)
			if byAuthority, aerr := p.routesByPath(authority); aerr != nil || !byAuthority {
				byPath = false
			}
		}
		if err != nil {
			t.reset()
			return err
		}
		if byPath {
			return parsePath(t, target, under)
		}
	}
	if err := p.Parse(t, host, h); err != nil {
		return err
	}
	authority, ok := TargetAuthority(target)
	if !ok {
		return nil
	}
	var other Target
	if err := p.Parse(&other, authority, h); err != nil || other.Port != t.Port || !bytes.Equal(other.ID(), t.ID()) {
		t.reset()
		return targetErr(CodeInvalidHost, "request target names another host than Host", authority)
	}
	return nil
}

// PathRoot begins a request target routed by its path:
// "/sandbox/<id>/<port>" followed by the sandbox's own path.
const PathRoot = "/sandbox/"

// routesByPath reports whether a request to host with a target under
// PathRoot is routed by its path: host is well formed and names no sandbox
// port. A malformed host is refused as for any other target: one that is
// no host name at all ("\"x", "a..b") would reach the sandbox as its Host,
// which its server refuses (Go's net/http answers 400 itself) or takes for
// whatever it makes of it; a sandbox host name never had such bytes.
func (p *Parser) routesByPath(host []byte) (bool, error) {
	name, isIP, err := splitHost(host)
	if err != nil {
		return false, err
	}
	if isIP || p.isShared(name) {
		return true, nil
	}
	if !validDomain(name) {
		return false, targetErr(CodeInvalidHost, "invalid host name", name)
	}
	var named Target
	if p.readSandboxHost(&named, name).code == "" {
		return false, nil
	}
	// A name under a sandbox's host ("x.8080-a.<domain>", which wildcard DNS
	// resolves) names no sandbox, and serves no path either: there, any
	// sandbox's page would be same-site with that sandbox's host, and its
	// script could set cookies for it (document.cookie with its Domain),
	// which a Public Suffix List entry for the domain stops everywhere
	// else. It is refused as on host routing (domain_not_allowed).
	return !p.underSandboxHost(name), nil
}

// underSandboxHost reports whether name is below a sandbox's host name
// under one of the configured domains: some label of it is followed by
// <port>-<id>.<domain>. With no domains configured every name may be a
// sandbox's, and a shared host named "proxy.1-east.example" must keep
// routing by path, so nothing counts.
func (p *Parser) underSandboxHost(name []byte) bool {
	if len(p.domains) == 0 {
		return false
	}
	var named Target
	for dot := bytes.IndexByte(name, '.'); dot >= 0; dot = bytes.IndexByte(name, '.') {
		name = name[dot+1:]
		if p.readSandboxHost(&named, name).code == "" {
			return true
		}
	}
	return false
}

// TargetPath is the path and query of a request target: the target
// itself in origin form, what follows the authority of an absolute-form
// one ("http://h/p?q" gives "/p?q"; "http://h?q" gives nothing), and
// nothing for other forms ("*", "host:443"). It is a suffix of target, so
// offsets from its end are offsets from target's.
func TargetPath(target []byte) []byte {
	if len(target) > 0 && target[0] == '/' {
		return target
	}
	i := bytes.Index(target, []byte(schemeSep))
	if i < 0 {
		return nil
	}
	rest := target[i+len(schemeSep):]
	if end := bytes.IndexAny(rest, "/?#"); end >= 0 && rest[end] == '/' {
		return rest[end:]
	}
	return nil
}

// underPathRoot reports whether target begins with PathRoot, its leading
// slashes counted as one, and returns what follows it.
func underPathRoot(target []byte) ([]byte, bool) {
	rest := target
	for len(rest) > 0 && rest[0] == '/' {
		rest = rest[1:]
	}
	if len(rest) == len(target) || !bytes.HasPrefix(rest, []byte(PathRoot[1:])) {
		return nil, false
	}
	return rest[len(PathRoot)-1:], true
}

// parsePath reads the target "/sandbox/<id>/<port>[/rest][?query]", of
// which under is what follows "/sandbox/". Only the canonical spelling of
// the id and the port is taken, a lower-case id and a port without
// leading zeros, so that the prefix the proxy writes back into the
// sandbox's Location and cookie paths (AppendPathPrefix) names the
// sandbox as the client did. The platform's proxy took other spellings
// and then found no route for them.
func parsePath(t *Target, target, under []byte) error {
	t.reset()
	// The id ends at the first '/' of the path, not of the query: a '/'
	// only after '?' ("/sandbox/abc?next=/home") leaves the port segment
	// missing, which blaming the id ("abc?next=") hid.
	idEnd := bytes.IndexAny(under, "/?")
	if idEnd < 0 || under[idEnd] != '/' {
		return targetErr(CodeInvalidPath, "path must begin /sandbox/<sandbox id>/<port>", target)
	}
	id, rest := under[:idEnd], under[idEnd+1:]
	if err := t.setID(id).err(); err != nil {
		return err
	}
	if !bytes.Equal(id, t.ID()) {
		t.reset()
		return targetErr(CodeInvalidSandboxID, "sandbox id in the path must be lower case", id)
	}
	end := bytes.IndexByte(rest, '/')
	if q := bytes.IndexByte(rest, '?'); q >= 0 && (end < 0 || q < end) {
		end = q
	}
	if end < 0 {
		end = len(rest)
	}
	port, ok := parsePort(rest[:end])
	if !ok || rest[0] == '0' {
		t.reset()
		return targetErr(CodeInvalidPort, "port in the path must be a number from 1 to 65535 without leading zeros", rest[:end])
	}
	t.Port = port
	t.PathPrefix = len(target) - len(rest) + end
	return nil
}

// AppendPathPrefix appends "/sandbox/<id>/<port>" for t: for a target
// parsed from the path, the prefix the client sent.
func AppendPathPrefix(dst []byte, t *Target) []byte {
	dst = append(append(dst, PathRoot...), t.ID()...)
	return strconv.AppendUint(append(dst, '/'), uint64(t.Port), 10)
}

// reset empties t.
func (t *Target) reset() {
	t.Port, t.Shared, t.PathPrefix, t.idLen = 0, false, 0, 0
}

// TargetAuthority returns the host (and port) of an absolute-form request
// target ("http://user@host:port/p?q" gives "host:port"), and false for
// any other form ("/p", "*").
func TargetAuthority(target []byte) ([]byte, bool) {
	if len(target) == 0 || target[0] == '/' {
		return nil, false
	}
	i := bytes.Index(target, []byte(schemeSep))
	if i < 0 {
		return nil, false
	}
	authority := target[i+len(schemeSep):]
	if end := bytes.IndexAny(authority, "/?#"); end >= 0 {
		authority = authority[:end]
	}
	if at := bytes.LastIndexByte(authority, '@'); at >= 0 {
		authority = authority[at+1:] // userinfo names no host
	}
	return authority, true
}

// schemeSep ends the scheme of an absolute-form target.
const schemeSep = "://"

// splitHost strips the port and one trailing dot from host. It reports IP
// literals separately because they carry no sandbox name.
func splitHost(host []byte) (name []byte, isIP bool, err error) {
	if len(host) == 0 {
		return nil, false, targetErr(CodeInvalidHost, "empty host", nil)
	}
	if host[0] == '[' {
		end := bytes.IndexByte(host, ']')
		if end < 0 {
			return nil, false, targetErr(CodeInvalidHost, "unterminated IPv6 literal", host)
		}
		if rest := host[end+1:]; len(rest) > 0 && (rest[0] != ':' || !validHostPort(rest[1:])) {
			return nil, false, targetErr(CodeInvalidHost, "invalid port in host", host)
		}
		if !isIPv6(host[1:end]) {
			return nil, false, targetErr(CodeInvalidHost, "invalid IPv6 literal", host)
		}
		return nil, true, nil
	}
	if colon := bytes.IndexByte(host, ':'); colon >= 0 {
		if bytes.IndexByte(host[colon+1:], ':') >= 0 {
			// More than one colon: only an unbracketed IPv6 address fits.
			if !isIPv6(host) {
				return nil, false, targetErr(CodeInvalidHost, "invalid host", host)
			}
			return nil, true, nil
		}
		if !validHostPort(host[colon+1:]) {
			return nil, false, targetErr(CodeInvalidHost, "invalid port in host", host)
		}
		host = host[:colon]
	}
	if n := len(host); n > 0 && host[n-1] == '.' {
		host = host[:n-1]
	}
	if len(host) == 0 {
		return nil, false, targetErr(CodeInvalidHost, "empty host name", nil)
	}
	if len(host) > maxHostLen {
		return nil, false, targetErr(CodeInvalidHost, "host name longer than 253 bytes", host)
	}
	if digitsAndDots(host) {
		// No DNS name is all digits and dots (TLDs are not numeric), so this
		// is an IPv4 literal or nonsense.
		addr, err := netip.ParseAddr(bytesString(host))
		if err != nil || !addr.Is4() {
			return nil, false, targetErr(CodeInvalidHost, "invalid IPv4 literal", host)
		}
		return nil, true, nil
	}
	return host, false, nil
}

// isIPv6 reports whether b is an IPv6 address without zone. It allocates
// only when b is not an address.
func isIPv6(b []byte) bool {
	addr, err := netip.ParseAddr(bytesString(b))
	return err == nil && addr.Is6() && addr.Zone() == ""
}

// validHostPort accepts the port of a Host header: empty or up to 5 digits.
// Its value does not matter; the target port comes from the name or headers.
func validHostPort(b []byte) bool {
	return len(b) <= 5 && allDigits(b)
}

func (p *Parser) isShared(name []byte) bool {
	for _, s := range p.shared {
		if equalFoldLower(name, s) {
			return true
		}
	}
	return false
}

func (p *Parser) domainAllowed(domain []byte) bool {
	for _, d := range p.domains {
		if equalFoldLower(domain, d) {
			return true
		}
	}
	return false
}

// parseSandboxHost reads <port>-<id>[.<domain>] from a host name without port.
func (p *Parser) parseSandboxHost(t *Target, name []byte) error {
	return p.readSandboxHost(t, name).err()
}

// readSandboxHost is parseSandboxHost without building the error, which
// routesByPath asks of every path-routed request's host.
func (p *Parser) readSandboxHost(t *Target, name []byte) fault {
	label, domain, hasDomain := name, []byte(nil), false
	if dot := bytes.IndexByte(name, '.'); dot >= 0 {
		label, domain, hasDomain = name[:dot], name[dot+1:], true
	}
	if len(p.domains) > 0 {
		if !hasDomain || !p.domainAllowed(domain) {
			return fault{CodeDomainNotAllowed, "domain not served here", name}
		}
	} else if hasDomain && !validDomain(domain) {
		return fault{CodeInvalidHost, "invalid host name", name}
	}
	dash := bytes.IndexByte(label, '-')
	if dash < 0 {
		return fault{CodeInvalidHost, "host must start with <port>-<sandbox id>", name}
	}
	port, ok := parsePort(label[:dash])
	if !ok {
		return fault{CodeInvalidPort, "port must be a number from 1 to 65535", label[:dash]}
	}
	if f := t.setID(label[dash+1:]); f.code != "" {
		return f
	}
	t.Port = port
	return fault{}
}

// fault is why input is refused, before it is made a *TargetError; the
// zero fault is none.
type fault struct {
	code, reason string
	input        []byte
}

// err is f as a *TargetError, or nil for none.
func (f fault) err() error {
	if f.code == "" {
		return nil
	}
	return targetErr(f.code, f.reason, f.input)
}

// parseHeaders selects the target from the override headers of a shared host.
// The X-Cube pair wins over the E2B pair; an incomplete pair does not count.
func parseHeaders(t *Target, h HeaderPeeker) error {
	if h == nil {
		return targetErr(CodeMissingTargetHeaders, missingHeadersReason, nil)
	}
	id, port, err := headerPair(h, HeaderCubeSandboxID, HeaderCubeSandboxPort)
	if err == nil && (len(id) == 0 || len(port) == 0) {
		id, port, err = headerPair(h, HeaderE2BSandboxID, HeaderE2BSandboxPort)
	}
	if err != nil {
		return err
	}
	if len(id) == 0 || len(port) == 0 {
		return targetErr(CodeMissingTargetHeaders, missingHeadersReason, nil)
	}
	p, ok := parsePort(port)
	if !ok {
		return targetErr(CodeInvalidPort, "sandbox port header must be a number from 1 to 65535", port)
	}
	if err := t.setID(id).err(); err != nil {
		return err
	}
	t.Port, t.Shared = p, true
	return nil
}

// headerPair reads one id and one port header. A header given on several
// lines with different values is an error: a gateway in front that appends
// its own line behind the client's (Envoy's default) would otherwise be
// overruled by the client's, which comes first.
func headerPair(h HeaderPeeker, idKey, portKey string) (id, port []byte, err error) {
	id, ok := headerValue(h, idKey)
	if !ok {
		return nil, nil, targetErr(CodeInvalidSandboxID, idKey+" given more than once with different values", nil)
	}
	port, ok = headerValue(h, portKey)
	if !ok {
		return nil, nil, targetErr(CodeInvalidPort, portKey+" given more than once with different values", nil)
	}
	return id, port, nil
}

// headerValue returns the value of header key, and false when its lines
// disagree (ids compare case-insensitively, as they are lower-cased).
func headerValue(h HeaderPeeker, key string) ([]byte, bool) {
	all := h.PeekAll(key)
	if len(all) == 0 {
		return nil, true
	}
	for _, v := range all[1:] {
		if !equalFoldASCII(v, all[0]) {
			return nil, false
		}
	}
	return all[0], true
}

const missingHeadersReason = "shared host needs X-Cube-Sandbox-Id and X-Cube-Sandbox-Port (or E2b-Sandbox-Id and E2b-Sandbox-Port) headers"

// parsePort reads a decimal port 1..65535; leading zeros are fine.
func parsePort(b []byte) (uint16, bool) {
	if len(b) == 0 || len(b) > maxPortDigits || !allDigits(b) {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		n = n*10 + uint64(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// setID validates src as a sandbox id and stores it lower-cased in t.
func (t *Target) setID(src []byte) fault {
	if len(src) == 0 {
		return fault{CodeInvalidSandboxID, "sandbox id is empty", nil}
	}
	if len(src) > MaxIDLen {
		return fault{CodeInvalidSandboxID, "sandbox id longer than 128 characters", src}
	}
	for i, c := range src {
		c = lower(c)
		if !idChar(c, i == 0) {
			return fault{CodeInvalidSandboxID, "sandbox id must match [a-z0-9][a-z0-9_-]*", src}
		}
		t.idBuf[i] = c
	}
	t.idLen = len(src)
	return fault{}
}

// ValidID reports whether id is a canonical (lower-case) sandbox id.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !idChar(id[i], i == 0) {
			return false
		}
	}
	return true
}

func idChar(c byte, first bool) bool {
	switch {
	case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		return true
	case c == '-' || c == '_':
		return !first
	}
	return false
}

// validDomain checks the part of a host after the first label: dot-separated,
// non-empty labels of letters, digits, '-' and '_'.
func validDomain(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	prevDot := true
	for _, c := range b {
		switch {
		case c == '.':
			if prevDot {
				return false
			}
			prevDot = true
			continue
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		prevDot = false
	}
	return !prevDot
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// equalFoldLower compares b, in any ASCII case, with the lower-case s.
func equalFoldLower(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		if lower(b[i]) != s[i] {
			return false
		}
	}
	return true
}

// equalFoldASCII compares a and b ignoring ASCII case only (bytes.EqualFold
// would take the Kelvin sign for a 'k').
func equalFoldASCII(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func digitsAndDots(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return true
}

// bytesString views b as a string without copying; the result must not outlive b.
func bytesString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// targetErr builds a TargetError whose reason quotes at most maxEcho bytes of input.
func targetErr(code, reason string, input []byte) error {
	if input != nil {
		reason += ": " + Echo(input)
	}
	return &TargetError{Code: code, Reason: reason}
}

// Echo quotes at most 64 bytes of client input for an error message, cut
// at a character boundary so the quote holds no half of one. It takes a
// string as it is: a caller's []byte(v) copied all of a value of megabytes
// only for its first bytes to be kept.
func Echo[T string | []byte](b T) string {
	if len(b) > maxEcho {
		n := maxEcho
		for n > 0 && !utf8.RuneStart(b[n]) {
			n--
		}
		return strconv.Quote(string(b[:n])) + "..."
	}
	return strconv.Quote(string(b))
}
