package proxy

import (
	"bytes"
	"errors"
	"iter"
	"net/netip"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// Hop-by-hop headers (RFC 9110 §7.6.1, the set Go's httputil.ReverseProxy
// strips). They describe one connection, never the end-to-end message.
// Transfer-Encoding and Content-Length are framing that fasthttp derives from
// the body it writes, so they are not listed here.
var hopHeaders = [...]string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Upgrade",
}

// maxConnectionOptions bounds the options (header names) a message's
// Connection lines may list. Each option costs a pass over every header to
// delete the header it names, so a 16 KiB head of thousands of options and
// thousands of headers cost about 10 ms of CPU, 140 times a plain request:
// a client (or a sandbox's answers) could keep the proxy's cores busy at a
// trickle of bandwidth. Clients and servers list a few ("keep-alive",
// "Upgrade", "HTTP2-Settings", "TE").
const maxConnectionOptions = 32

// maxInvalidNames bounds the request header lines whose names hold a space
// that the proxy drops (dropInvalidNames); a head with more is refused.
// Each costs a walk over the head to delete it, so a 28 KB head of 2,400
// cost ≈ 4 ms of CPU, ten times the same head without them. No client
// sends such names on purpose, and nginx since 1.21.1 refuses a request
// with a single one.
const maxInvalidNames = 32

// maxHeaderLines bounds the header lines of a request's head; a head with
// more is refused (431), as nginx 1.22 refuses one of more than 1,000 (400,
// "Request Header Or Cookie Too Large"). fasthttp keeps a head's parsed
// lines, ≈ 100 bytes each however short, for the connection's next
// requests: a 32 KiB head of 6,400 "a:b" lines, under
// client.max_header_size, left ≈ 630 KiB (runtime count; ≈ 900 KiB of RSS)
// held by an idle keep-alive connection, four times what a head of long
// lines filling the limit leaves.
const maxHeaderLines = 1000

// tooManyConnectionOptions reports whether the Connection lines list more
// than maxConnectionOptions options; empty list elements do not count.
func tooManyConnectionOptions(lines [][]byte) bool {
	n := 0
	for _, v := range lines {
		for len(v) > 0 {
			var tok []byte
			if tok, v = nextToken(v); len(tok) > 0 {
				if n++; n > maxConnectionOptions {
					return true
				}
			}
		}
	}
	return false
}

// removeHopRequest strips hop-by-hop headers and every header named in
// Connection from a request about to be forwarded (serve refused one that
// names more than maxConnectionOptions). keepUpgrade keeps
// Connection: Upgrade and Upgrade for the WebSocket tunnel.
func removeHopRequest(h *fasthttp.RequestHeader, keepUpgrade bool) {
	// Headers named in Connection first, on every line of it (a client may
	// send "Connection: keep-alive" and "Connection: X-Hop" apart), while
	// Connection is still there. The deletions leave the lines' bytes be.
	for _, conn := range h.PeekAll("Connection") {
		forEachToken(conn, func(name []byte) {
			if keepUpgrade && bytes.EqualFold(name, []byte("upgrade")) || connectionProof(name) {
				return
			}
			h.DelBytes(name)
		})
	}
	for _, name := range hopHeaders {
		if keepUpgrade && name == "Upgrade" {
			continue
		}
		// Every line of it, unlooked: Peek sees only the first line, and
		// an empty one ("Upgrade:" before "Upgrade: websocket") would let
		// the rest through. A Del costs what the Peek did.
		h.Del(name)
	}
	if keepUpgrade {
		// Only the upgrade token may travel, on one line: "keep-alive,
		// Upgrade" becomes "Upgrade".
		h.Set("Connection", "Upgrade")
	}
}

// connectionOptions appends to dst the options of the Connection lines of
// raw, fasthttp's copy of a request head as received, which keeps them
// after removeHopRequest deleted the lines and what they named. A folded
// line's continuation lines are read as its own (fasthttp joins them with
// a space): a name split by the fold reads as two, where the head's
// deletion found none. The options are slices of raw.
func connectionOptions(dst [][]byte, raw []byte) [][]byte {
	in := false // in a Connection line, continuation lines included
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte{'\n'})
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			if !in {
				continue
			}
		} else {
			var name []byte
			var ok bool
			name, line, ok = bytes.Cut(line, []byte{':'})
			if in = ok && bytes.EqualFold(name, []byte("Connection")); !in {
				continue
			}
		}
		forEachToken(line, func(opt []byte) { dst = append(dst, opt) })
	}
	return dst
}

// connectionProof reports whether a Connection option names a field the
// request the proxy sends cannot do without, which no option removes: Host
// routes the request and is the sandbox's (and a masked route's
// X-Forwarded-Host), Content-Length frames the body (without it the
// request could not be written, and the client got 400 "malformed request
// body"), and X-Cube-Request-Id is the id the client and the access log
// get. Go's ReverseProxy keeps the first two, which are no header fields
// there; nginx ignores Connection options altogether.
func connectionProof(name []byte) bool {
	return bytes.EqualFold(name, []byte("Host")) || bytes.EqualFold(name, []byte("Content-Length")) ||
		bytes.EqualFold(name, []byte(HeaderRequestID))
}

// upgradeRequested reports whether a request asks to switch protocols: an
// Upgrade header, and the upgrade token in Connection on any of its lines
// (fasthttp's ConnectionUpgrade reads the first one only, and none beside
// close). A close token beside it still asks for the upgrade: it says the
// connection ends if the upgrade is declined (fasthttp keeps that, having
// read it before the handler ran), and nginx, Go's ReverseProxy and Node
// upgrade such a request. An HTTP/1.0 request, which fasthttp marks close
// too, is left to switchable. Upgrade is looked up first: most requests
// have none, so they cost the one lookup ConnectionUpgrade made.
func upgradeRequested(h *fasthttp.RequestHeader) bool {
	if len(h.Peek("Upgrade")) == 0 {
		return false
	}
	if h.ConnectionUpgrade() {
		return true
	}
	for _, v := range h.PeekAll("Connection") {
		for len(v) > 0 {
			var tok []byte
			if tok, v = nextToken(v); bytes.EqualFold(tok, []byte("upgrade")) {
				return true
			}
		}
	}
	return false
}

// removeHopResponse strips hop-by-hop headers from an upstream response.
// Deleting Connection also clears fasthttp's connection-close flag, so an
// upstream "Connection: close" does not close the client's keep-alive
// connection. It reports false, removing nothing, for a response whose
// Connection lines list more than maxConnectionOptions options: sandboxes
// run untrusted code, and deleting them all would cost what it costs for
// such a request. keepUpgrade, for a sandbox's 101, keeps Upgrade and says
// "Connection: Upgrade" on one line, which a 101 must carry (RFC 9110
// §7.6.1, §7.8), as nginx rebuilds it: Keep-Alive, TE, Trailer and what
// the sandbox's Connection lines name describe its connection to the
// proxy, not the client's. (fasthttp writes no Content-Length or
// Transfer-Encoding on a 1xx.) A 426 keeps its Upgrade too, without a
// Connection line: that field names the protocols the client must switch
// to (RFC 9110 §15.5.22), and nginx relays it so.
//
// It refuses (errInvalidHeaderName) an answer with a header name holding a
// space or a tab, which fasthttp reads as a name: no field name has one
// (RFC 9110 5.1), and nginx since 1.21.1 answers such a sandbox's
// response 502, where CubeProxy passed it on to clients that read it
// each their own way.
func removeHopResponse(h *fasthttp.ResponseHeader, keepUpgrade bool) error {
	// Most answers carry none, and one pass over the headers costs a sixth
	// of looking each name up (BenchmarkResponseHops: 23 vs 133 ns; the
	// name check added 15 ns to 27).
	hop, invalid := scanResponseNames(h.All())
	if invalid {
		return errInvalidHeaderName
	}
	if !keepUpgrade && !hop {
		return nil
	}
	order := lineOrders.Get().(*lineOrder)
	defer order.release()
	order.rememberResponse(h)
	// After the remembering: PeekAll's lines live in one buffer of the
	// header's, which each PeekAll refills, and the repeated fields'
	// lines looked up there took the Connection lines' place (the option
	// they named stayed).
	conns := h.PeekAll("Connection")
	if tooManyConnectionOptions(conns) {
		return errTooManyConnectionOptions
	}
	keepField := keepUpgrade || h.StatusCode() == fasthttp.StatusUpgradeRequired
	// Every Connection line, and every hop-by-hop header whatever its
	// first line holds, as for requests.
	for _, conn := range conns {
		forEachToken(conn, func(name []byte) {
			if !keepField || !bytes.EqualFold(name, []byte("upgrade")) {
				h.DelBytes(name)
			}
		})
	}
	for _, name := range hopHeaders {
		if !keepField || name != "Upgrade" {
			h.Del(name)
		}
	}
	order.restore(h)
	if keepUpgrade {
		h.Set("Connection", "Upgrade")
	}
	return nil
}

// delResponseField removes every line of name from an answer's head, the
// lines of the other fields kept in their order: fasthttp deletes a line by
// moving the head's last line into its place, which reordered a repeated
// field (a chunked answer's Transfer-Encoding, removed for an HTTP/1.0
// client, swapped its WWW-Authenticate challenges). Only a head that has
// the field pays for the order.
func delResponseField(h *fasthttp.ResponseHeader, name string) {
	if len(h.Peek(name)) == 0 {
		return
	}
	order := lineOrders.Get().(*lineOrder)
	order.rememberResponse(h)
	h.Del(name)
	order.restore(h)
	order.release()
}

// errInvalidHeaderName is an answer with a header name no field name can
// be (removeHopResponse).
var errInvalidHeaderName = errors.New("response header name holds a space or a tab")

// scanResponseNames reports whether any header in all is hop-by-hop, and
// whether any name holds a space or a tab.
func scanResponseNames(all iter.Seq2[[]byte, []byte]) (hop, invalid bool) {
	for k := range all {
		// A loop rather than two IndexByte calls: names are short, and
		// the calls' set-up doubled the scan's cost.
		for _, c := range k {
			if c == ' ' || c == '\t' {
				return hop, true
			}
		}
		if hop {
			continue
		}
		for _, name := range hopHeaders {
			if len(k) == len(name) && strings.EqualFold(b2s(k), name) {
				hop = true
				break
			}
		}
	}
	return hop, false
}

// forEachToken calls fn for each comma-separated token of a header value.
func forEachToken(v []byte, fn func([]byte)) {
	for len(v) > 0 {
		var tok []byte
		tok, v = nextToken(v)
		if len(tok) > 0 {
			fn(tok)
		}
	}
}

// nextToken splits the first comma-separated token, trimmed (maybe empty),
// off a header value.
func nextToken(v []byte) (tok, rest []byte) {
	if i := bytes.IndexByte(v, ','); i >= 0 {
		tok, rest = v[:i], v[i+1:]
	} else {
		tok = v
	}
	return bytes.TrimSpace(tok), rest
}

// appendForwardedFor appends ip to the client's X-Forwarded-For lines,
// joined with ", " (empty lines skipped), as nginx's
// $proxy_add_x_forwarded_for does.
func appendForwardedFor(dst []byte, prior [][]byte, ip netip.Addr) []byte {
	dst = appendJoinedLines(dst[:0], prior)
	if len(dst) > 0 {
		dst = append(dst, ", "...)
	}
	return ip.AppendTo(dst)
}

// appendJoinedLines appends the non-empty lines joined with ", ": the
// client's X-Forwarded-For lines as the sandbox gets them
// (appendForwardedFor) and the access log writes them (fwdHeaders).
func appendJoinedLines(dst []byte, lines [][]byte) []byte {
	sep := false
	for _, v := range lines {
		if len(v) == 0 {
			continue
		}
		if sep {
			dst = append(dst, ", "...)
		}
		dst = append(dst, v...)
		sep = true
	}
	return dst
}

// appendForwarded appends the proxy's element for the client at ip
// ("for=192.0.2.1", `for="[2001:db8::1]"`: RFC 7239 quotes and brackets an
// IPv6 node, and "for=::1" would be no token) to the client's Forwarded
// lines, joined with ", " (empty lines skipped) as X-Forwarded-For's are.
// The client's elements are its own claims; only the last one is the
// proxy's. A client value that ends inside a quoted string would take the
// proxy's element into its quotes, so it is dropped.
func appendForwarded(dst []byte, prior [][]byte, ip netip.Addr) []byte {
	dst = dst[:0]
	for _, v := range prior {
		if len(bytes.TrimSpace(v)) == 0 {
			continue
		}
		dst = append(append(dst, v...), ", "...)
	}
	if openQuote(dst) {
		dst = dst[:0]
	}
	switch {
	case !ip.IsValid():
		return append(dst, "for=unknown"...)
	case ip.Is6():
		dst = ip.AppendTo(append(dst, `for="[`...))
		return append(dst, `]"`...)
	default:
		return ip.AppendTo(append(dst, "for="...))
	}
}

// openQuote reports whether v ends inside a quoted string (RFC 9110 5.6.4:
// a backslash quotes the byte after it).
func openQuote(v []byte) bool {
	in := false
	for i := 0; i < len(v); i++ {
		switch {
		case in && v[i] == '\\':
			i++
		case v[i] == '"':
			in = !in
		}
	}
	return in
}

// The headers prepareRequest sets on every request, in the form fasthttp
// normalizes their names to (what it sends: "X-Real-Ip"). Set and
// SetBytesV copy and normalize a name on every call, ≈ 15 % of
// BenchmarkHeaderRewrite's small GET for these four; SetCanonical takes
// them as they are. TestForwardingKeysCanonical keeps them canonical.
var (
	keyRealIP         = []byte("X-Real-Ip")
	keyForwardedFor   = []byte("X-Forwarded-For")
	keyForwardedProto = []byte("X-Forwarded-Proto")
	keyForwardedHost  = []byte("X-Forwarded-Host")
	keyForwarded      = []byte("Forwarded")

	protoHTTP  = []byte("http")
	protoHTTPS = []byte("https")
)

// headSeen is what one pass over a request's head found among the headers
// prepareRequest removes or rewrites. A lookup by name normalizes the name
// first (≈ 30 ns each), and most requests carry none of these, so
// prepareRequest looks up only what the pass saw (BenchmarkHeaderRewrite,
// small GET with parsing: 577 → 335 ns).
type headSeen struct {
	hop            bool // a hop-by-hop header, or Connection (which may name more)
	credentials    bool // a traffic- or admin-token header, or a Cookie line
	forwardedProto bool
	underscore     bool // a name with '_' or '.': maybe an X_Real_IP-style alias
	// Lines whose name holds a space (no field name: RFC 9110 5.1 names
	// are tokens, but fasthttp takes it), saturating past maxInvalidNames.
	spaceNames uint8
	// Header lines, saturating past maxHeaderLines.
	lines uint16
	// A Transfer-Encoding line: fasthttp keeps chunked (ContentLength -1)
	// and drops identity, the only other coding it accepts.
	transferEncoding bool
	expect           bool // an Expect line: maybe the 100-continue fasthttp answered

	// Lines of each (saturating at 2: only "any" and "more than one"
	// matter).
	forwardedFor, forwarded, requestID uint8
}

// seeAll is the answer when the head was not parsed from the wire (no raw
// copy to scan): look everything up.
var seeAll = headSeen{hop: true, credentials: true, underscore: true, spaceNames: 1, expect: true, forwardedFor: 2, forwarded: 2, requestID: 2}

// headName is a name scanHead looks for, and what seeing it means.
type headName struct {
	name string
	kind uint8
}

const (
	seenHop = iota
	seenCredentials
	seenForwardedProto
	seenForwardedFor
	seenForwarded
	seenTransferEncoding
	seenExpect
	seenRequestID
)

var headNames = [...]headName{
	{"Connection", seenHop}, {"Proxy-Connection", seenHop}, {"Keep-Alive", seenHop},
	{"Proxy-Authenticate", seenHop}, {"Proxy-Authorization", seenHop}, {"Te", seenHop},
	{"Trailer", seenHop}, {"Upgrade", seenHop},
	{"Cookie", seenCredentials}, {auth.HeaderE2BTrafficToken, seenCredentials}, {auth.HeaderCubeTrafficToken, seenCredentials},
	{auth.HeaderAdminToken, seenCredentials},
	{"X-Forwarded-Proto", seenForwardedProto},
	{"X-Forwarded-For", seenForwardedFor}, {"Forwarded", seenForwarded},
	{"Transfer-Encoding", seenTransferEncoding}, {"Expect", seenExpect},
	{"X-Cube-Request-Id", seenRequestID},
}

// headNamesByLen is headNames indexed by name length: a header line is
// compared only with the names as long as its own (none for most lines, at
// most two), not with all eighteen. Built once, never written.
var headNamesByLen = func() [][]headName {
	var byLen [][]headName
	for _, n := range headNames {
		for len(byLen) <= len(n.name) {
			byLen = append(byLen, nil)
		}
		byLen[len(n.name)] = append(byLen[len(n.name)], n)
	}
	return byLen
}()

// headerLines yields the name and the value, untrimmed, of each header
// line of a raw head (fasthttp's copy as received: one "Name: value" line
// each, obs-fold continuation lines beginning with a blank and naming
// nothing).
func headerLines(raw []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func([]byte, []byte) bool) {
		for len(raw) > 0 {
			var line []byte
			line, raw, _ = bytes.Cut(raw, []byte{'\n'})
			i := bytes.IndexByte(line, ':')
			if i <= 0 || line[0] == ' ' || line[0] == '\t' {
				continue
			}
			if !yield(line[:i], line[i+1:]) {
				return
			}
		}
	}
}

// scanHead finds the names serve and prepareRequest care about in
// fasthttp's copy of the head as received. A name is compared only with the
// table's names of its length (headNamesByLen), which keeps it at a few
// nanoseconds a header.
func scanHead(h *fasthttp.RequestHeader) headSeen {
	raw := h.RawHeaders()
	if len(raw) == 0 {
		return seeAll
	}
	var s headSeen
	for nb := range headerLines(raw) {
		if s.lines <= maxHeaderLines {
			s.lines++
		}
		name := b2s(nb)
		if strings.IndexByte(name, ' ') >= 0 {
			if s.spaceNames <= maxInvalidNames {
				s.spaceNames++
			}
			continue
		}
		if strings.IndexByte(name, '_') >= 0 || strings.IndexByte(name, '.') >= 0 {
			s.underscore = true
			continue
		}
		if len(name) >= len(headNamesByLen) {
			continue
		}
		for _, n := range headNamesByLen[len(name)] {
			if !strings.EqualFold(n.name, name) {
				continue
			}
			switch n.kind {
			case seenHop:
				s.hop = true
			case seenCredentials:
				s.credentials = true
			case seenForwardedProto:
				s.forwardedProto = true
			case seenForwardedFor:
				s.forwardedFor = min(s.forwardedFor+1, 2)
			case seenForwarded:
				s.forwarded = min(s.forwarded+1, 2)
			case seenTransferEncoding:
				s.transferEncoding = true
			case seenExpect:
				s.expect = true
			case seenRequestID:
				s.requestID = min(s.requestID+1, 2)
			}
			break
		}
	}
	return s
}

// maskedHost expands a MaskRequestHost template, replacing ${PORT} with the
// container port.
func maskedHost(dst []byte, tmpl string, port uint16) []byte {
	const placeholder = "${PORT}"
	dst = dst[:0]
	for {
		i := strings.Index(tmpl, placeholder)
		if i < 0 {
			return append(dst, tmpl...)
		}
		dst = append(dst, tmpl[:i]...)
		dst = appendUint(dst, uint64(port))
		tmpl = tmpl[i+len(placeholder):]
	}
}

func appendUint(dst []byte, v uint64) []byte {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

// dropForwardingAliases removes the client's header lines whose names read
// as a header the proxy vouches for or strips once '_' is taken for '-'
// (X_Real_IP, X-Forwarded_For, X_Forwarded_Host when masked is set,
// X_Forwarded_Prefix when prefixed is set (a request routed by its path),
// X_Cube_Request_Id, whose value the sandbox would file over the id the
// client, the access log and the sandbox's answer carry, and the proxy's
// credential headers: X_Cube_Admin_Token,
// E2b_Traffic_Access_Token, Cube_Traffic_Access_Token; '.' is taken for
// '-' as well: X.Real.IP, X.Cube.Admin.Token). CGI, WSGI and PHP servers file
// both spellings under one variable (HTTP_X_REAL_IP) and join or overwrite
// them, so such a line would forge the client address, or hand the
// sandbox's code a token the proxy never lets through; PHP's built-in
// server (php -S) files a '.' in a name under '_' as well. nginx drops
// names with '_' by default (underscores_in_headers off), and with '.'
// (ignore_invalid_headers on). prepareRequest calls it only when scanHead
// saw a name with '_' or '.'.
func dropForwardingAliases(h *fasthttp.RequestHeader, masked, prefixed bool) {
	for name := range headerLines(h.RawHeaders()) {
		if bytes.IndexByte(name, '_') < 0 && bytes.IndexByte(name, '.') < 0 {
			continue
		}
		if droppedAlias(name, masked, prefixed) {
			h.DelBytes(name)
		}
	}
}

// droppedAlias reports whether name, which holds '_' or '.', reads as one
// of the headers the proxy sets or strips once those are taken for '-':
// X-Real-IP, X-Forwarded-For, X-Cube-Request-Id, the proxy's credentials,
// X-Forwarded-Host with forwardedHost set, and X-Forwarded-Prefix with
// forwardedPrefix set. The head (dropForwardingAliases) and a chunked
// body's trailer (droppedTrailerName) lose the same names.
func droppedAlias(name []byte, forwardedHost, forwardedPrefix bool) bool {
	return underscoreAlias(name, "x-real-ip") || underscoreAlias(name, "x-forwarded-for") ||
		(forwardedHost && underscoreAlias(name, "x-forwarded-host")) || underscoreAlias(name, "x-cube-request-id") ||
		(forwardedPrefix && underscoreAlias(name, "x-forwarded-prefix")) || credentialAlias(name)
}

// credentialAlias reports whether name is one of proxyTokenHeaders with
// '_' and '.' read as '-': a token must reach the sandbox under no name
// its server may file as the real header.
func credentialAlias(name []byte) bool {
	for _, want := range proxyTokenHeaders {
		if underscoreAlias(name, want) {
			return true
		}
	}
	return false
}

// dropInvalidNames removes the client's header lines whose names hold a
// space ("X Real IP: 1.2.3.4"), which fasthttp accepts. They are no field
// names: Go's and Node's servers answer such a request 400 (the sandbox's
// error, not the proxy's JSON one), and a server that reads the space as
// '-' or '_' (as CGI reads '-') would take the line for a header the proxy
// vouches for. nginx drops them too (ignore_invalid_headers, on by
// default). prepareRequest calls it only when scanHead saw one.
func dropInvalidNames(h *fasthttp.RequestHeader) {
	if raw := h.RawHeaders(); len(raw) > 0 {
		// The raw copy is apart from the parsed headers, so deleting
		// while walking it is safe, as in dropForwardingAliases.
		for name := range headerLines(raw) {
			if bytes.IndexByte(name, ' ') >= 0 {
				h.DelBytes(name)
			}
		}
		return
	}
	// A head built in code has no raw copy (seeAll): walk the parsed
	// headers, and delete after the walk, which deleting would disturb.
	var bad [][]byte
	for name := range h.All() {
		if bytes.IndexByte(name, ' ') >= 0 {
			bad = append(bad, bytes.Clone(name))
		}
	}
	for _, name := range bad {
		h.DelBytes(name)
	}
}

// underscoreAlias reports whether name equals the header name want, in
// any case, with '_' and '.' read as '-' (CGI, WSGI and PHP servers file
// '_' under one variable with '-'; PHP's built-in server files '.' there
// too).
func underscoreAlias(name []byte, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i, c := range name {
		if c == '_' || c == '.' {
			c = '-'
		}
		if lower(c) != lower(want[i]) {
			return false
		}
	}
	return true
}

// lower is c in lower case, for ASCII letters.
func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// scopeSetCookies keeps every cookie a sandbox sets on the host the
// client addressed, and on that host alone. All sandbox hosts share one
// parent domain, so a cookie with Domain=<that domain> would go to every
// other sandbox's host too: a sandbox could plant cookies in its siblings'
// apps (a session of the attacker's, a CSRF token it chose) and fill their
// Cookie headers past client.max_header_size, so that every sandbox
// answers the visitor's browser 431 until the cookies expire (a cookie
// bomb). Browsers refuse such a cookie once the domain is on the Public
// Suffix List; the proxy does not wait for that entry. A Domain naming
// the host itself widens the cookie too, to every name under it: those
// ("x.8080-box.<domain>", which wildcard DNS resolves) name no sandbox and
// serve any sandbox's pages by their path, so another sandbox's server got
// the cookie there. Every cookie with a Domain therefore loses its Domain
// attributes and is host-only: the sandbox's own app keeps it, on its own
// host, as a browser keeps it for that host either way.
// With a prefix (a request routed by its path), a cookie's Path that
// begins with '/' is put under it, as nginx's proxy_cookie_path
// "/ <prefix>/" does: "Path=/" becomes "Path=<prefix>/"; one under it
// already stays (pathroute.go). Nothing is copied
// unless a cookie has a Domain to remove or a Path to prefix.
func scopeSetCookies(h *fasthttp.ResponseHeader, prefix []byte) {
	change := false
	for _, v := range h.Cookies() {
		if change = hasCookieDomain(v) || prefix != nil && rootCookiePath(v, prefix); change {
			break
		}
	}
	if !change {
		return
	}
	// Rare: rebuilt in order, each cookie on its own Set-Cookie line.
	var kept [][]byte
	for _, v := range h.Cookies() {
		kept = append(kept, appendScopedCookie(nil, v, hasCookieDomain(v), prefix))
	}
	h.DelAllCookies()
	for _, v := range kept {
		h.AddBytesV(fasthttp.HeaderSetCookie, v)
	}
}

// cookieAttrs yields the name and value of each attribute of a Set-Cookie
// value, whitespace trimmed, as browsers split them (RFC 6265 5.2): at
// every ';', the first piece being the cookie itself.
func cookieAttrs(v []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func([]byte, []byte) bool) {
		_, rest, more := bytes.Cut(v, []byte{';'})
		for more {
			var attr []byte
			attr, rest, more = bytes.Cut(rest, []byte{';'})
			name, val, _ := bytes.Cut(attr, []byte{'='})
			if !yield(bytes.Trim(name, " \t"), bytes.Trim(val, " \t")) {
				return
			}
		}
	}
}

// hasCookieDomain reports whether a Set-Cookie value has a non-empty
// Domain attribute (a browser takes an empty one for none).
func hasCookieDomain(v []byte) bool {
	for name, val := range cookieAttrs(v) {
		if bytes.EqualFold(name, []byte("domain")) && len(val) > 0 {
			return true
		}
	}
	return false
}

// rootCookiePath reports whether a Set-Cookie value has a Path attribute
// that begins with '/' and is not under prefix already.
func rootCookiePath(v, prefix []byte) bool {
	for name, val := range cookieAttrs(v) {
		if bytes.EqualFold(name, []byte("path")) && len(val) > 0 && val[0] == '/' && !underPrefix(val, prefix) {
			return true
		}
	}
	return false
}

// appendScopedCookie appends the Set-Cookie value v to dst, without its
// Domain attributes when dropDomain, and with prefix before every Path
// value that begins with '/' and is not under it already; the other bytes
// are kept as sent.
func appendScopedCookie(dst, v []byte, dropDomain bool, prefix []byte) []byte {
	first, rest, more := bytes.Cut(v, []byte{';'})
	dst = append(dst, first...)
	for more {
		var attr []byte
		attr, rest, more = bytes.Cut(rest, []byte{';'})
		name, val, _ := bytes.Cut(attr, []byte{'='})
		name = bytes.Trim(name, " \t")
		switch {
		case dropDomain && bytes.EqualFold(name, []byte("domain")):
			continue
		case prefix != nil && bytes.EqualFold(name, []byte("path")):
			if at := len(attr) - len(bytes.TrimLeft(val, " \t")); at < len(attr) && attr[at] == '/' && !underPrefix(bytes.TrimRight(attr[at:], " \t"), prefix) {
				dst = append(append(append(append(dst, ';'), attr[:at]...), prefix...), attr[at:]...)
				continue
			}
		}
		dst = append(append(dst, ';'), attr...)
	}
	return dst
}

// masksHost reports whether requests to port of route r go to the sandbox
// with the route's MaskRequestHost as Host (never on envd's port).
func masksHost(r *routing.Route, port uint16) bool {
	return r.MaskRequestHost != "" && port != envdPort
}

// settleHost makes h's Host the host a request is routed by, before
// anything reads it. Only a target that is not origin-form (an
// absolute-form "GET http://3000-x.cube.app/p", as a client set up for a
// forward proxy sends it) needs this:
//
//   - fasthttp (since v1.79) replaces Host with the target's authority
//     before the handler runs, as RFC 9112 3.2.2 has an origin server do.
//     The proxy routes by the Host line the client sent and refuses a
//     target naming another sandbox (routing.ParseRequest), so that a
//     request a front proxy checked as one sandbox's never reaches
//     another; that check, the redirect listener, the access log and the
//     sandbox's Host all need the client's own line, which is put back.
//     An empty one stays empty (400): it contradicts a target that names
//     a host, and nginx refuses it.
//   - An HTTP/1.0 request without a Host line goes by its target's host,
//     userinfo dropped, as nginx routes it ($host): written into Host, it
//     is the one host every later reader sees, as if the client had sent
//     it. HTTP/1.1 must send Host (RFC 9112 3.2): without one it gets an
//     empty Host, refused 400 like a missing one.
//
// An origin-form request costs one byte compare.
func settleHost(h *fasthttp.RequestHeader) {
	target := h.RequestURI()
	if len(target) > 0 && target[0] == '/' {
		return
	}
	if host, ok := rawHost(h.RawHeaders()); ok {
		h.SetHostBytes(host)
		return
	}
	authority, ok := routing.TargetAuthority(target)
	if !ok || h.IsHTTP11() || string(h.Protocol()) != "HTTP/1.0" {
		authority = nil
	}
	h.SetHostBytes(authority)
}

// rawHost returns the value of the Host line of a raw head (fasthttp's
// copy as received), trimmed as fasthttp trims it, and whether there is
// one: fasthttp reads an empty line as no Host, and refuses a second.
// Continuation lines (obs-fold) are part of it, each fold a space, as
// fasthttp joins them for an origin-form request (RFC 9112 5.2): read
// alone, the first line of "Host: <sandbox>" folded onto " x" routed the
// request by the sandbox's name, which the whole line is not.
func rawHost(raw []byte) ([]byte, bool) {
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte{'\n'})
		name, value, ok := bytes.Cut(line, []byte{':'})
		if !ok || len(name) == 0 || name[0] == ' ' || name[0] == '\t' || !strings.EqualFold(b2s(name), "host") {
			continue
		}
		value = bytes.Trim(value, " \t\r")
		if len(raw) == 0 || raw[0] != ' ' && raw[0] != '\t' {
			return value, true
		}
		// Folded: rare, and only an absolute-form target gets here, so
		// the copy costs no ordinary request anything.
		joined := bytes.Clone(value)
		for len(raw) > 0 && (raw[0] == ' ' || raw[0] == '\t') {
			line, raw, _ = bytes.Cut(raw, []byte{'\n'})
			joined = append(append(joined, ' '), bytes.Trim(line, " \t\r")...)
		}
		return bytes.TrimLeft(joined, " \t"), true
	}
	return nil, false
}

// lineOrder keeps the order of a field's lines across the deletes that
// strip a head of hop-by-hop and proxy headers. fasthttp deletes a line by
// moving the head's last line into its place, so a field sent on several
// lines (Accept, Link, WWW-Authenticate, Cache-Control) came out
// reordered, which a proxy must not do (RFC 9110 §5.3; nginx does not).
// Only lines of a repeated name can be hurt, and only heads that lose a
// line pay: before the deletes it copies those lines, after them it puts
// each such name's surviving lines back in their first order. It holds
// spans into its own bytes rather than slices, so that a pooled one keeps
// no pointer into an old head.
type lineOrder struct {
	space [512]byte
	used  int
	names [8]lineSpan
	count [8]uint8
	n     int
	vals  [32]lineSpan
	nv    int
}

// lineSpan is a piece of lineOrder.space.
type lineSpan struct{ off, end uint16 }

// remember copies name and its lines vals, when it has more than one and
// they fit. A head with more repeated names, lines or bytes than that
// keeps fasthttp's order for the rest.
func (o *lineOrder) remember(name []byte, vals [][]byte) {
	if len(vals) < 2 || o.n == len(o.names) || o.nv+len(vals) > len(o.vals) {
		return
	}
	for i := range o.n {
		if bytes.EqualFold(o.bytes(o.names[i]), name) {
			return
		}
	}
	size := len(name)
	for _, v := range vals {
		size += len(v)
	}
	if o.used+size > len(o.space) {
		return
	}
	// Copies: the deletes and adds reuse fasthttp's line buffers.
	o.names[o.n] = o.put(name)
	for j, v := range vals {
		o.vals[o.nv+j] = o.put(v)
	}
	o.count[o.n] = uint8(len(vals))
	o.nv += len(vals)
	o.n++
}

func (o *lineOrder) put(b []byte) lineSpan {
	sp := lineSpan{uint16(o.used), uint16(o.used + len(b))}
	o.used += copy(o.space[o.used:], b)
	return sp
}

func (o *lineOrder) bytes(sp lineSpan) []byte { return o.space[sp.off:sp.end] }

// special reports whether fasthttp keeps a field apart from the head's
// lines (so its deletes move no line of it), or the proxy sets the field
// whole after the deletes.
func special(name []byte) bool {
	for _, s := range [...]string{"Host", "Content-Length", "Content-Type", "User-Agent", "Cookie",
		"Set-Cookie", "Transfer-Encoding", "Connection", "Trailer", "Server", "Content-Encoding", "Date",
		"X-Forwarded-For", "Forwarded", HeaderRequestID} {
		if len(name) == len(s) && strings.EqualFold(b2s(name), s) {
			return true
		}
	}
	return false
}

// nameLines counts the lines of up to 32 header names, case aside.
type nameLines struct {
	names [32][]byte
	lines [32]uint8
	n     int
}

// second reports whether this line of name is its second one: the line at
// which its lines are remembered, once. PeekAll walks the whole head, so
// looking them up at every line of a name sent thousands of times made a
// 28 KB head cost ≈ 60 ms of CPU, quadratic in its lines.
func (c *nameLines) second(name []byte) bool {
	for i, s := range c.names[:c.n] {
		if len(s) == len(name) && bytes.EqualFold(s, name) {
			if c.lines[i] < 2 {
				c.lines[i]++
				return c.lines[i] == 2
			}
			return false
		}
	}
	if c.n < len(c.names) {
		c.names[c.n], c.lines[c.n] = name, 1
		c.n++
	}
	return false
}

// rememberRequest remembers the repeated fields of a request's head, read
// from its raw bytes: RequestHeader.All would parse its cookies.
func (o *lineOrder) rememberRequest(h *fasthttp.RequestHeader) {
	var seen nameLines
	for name := range headerLines(h.RawHeaders()) {
		if seen.second(name) && !special(name) {
			o.remember(name, h.PeekAll(b2s(name)))
		}
	}
}

// rememberResponse remembers the repeated fields of a response's head.
func (o *lineOrder) rememberResponse(h *fasthttp.ResponseHeader) {
	var seen nameLines
	for name := range h.All() {
		if seen.second(name) && !special(name) {
			o.remember(name, h.PeekAll(b2s(name)))
		}
	}
}

// rememberTrailer remembers the repeated fields of a request body's
// trailer. restore puts them back there: fasthttp adds a field the
// trailer announced or carried to the trailer. A name the head has too
// counts its lines there, and is not put back. Only the trailer's first
// names are looked at, as nameLines bounds a head's: each PeekAllTrailer
// walks the whole trailer, and a 64 KiB one of 8,000 names, each looked
// up, cost ≈ 0.2 s of CPU.
func (o *lineOrder) rememberTrailer(h *fasthttp.RequestHeader) {
	keys := h.PeekTrailerKeys()
	for _, name := range keys[:min(len(keys), len(nameLines{}.names))] {
		if o.n == len(o.names) {
			return
		}
		if !special(name) {
			o.remember(name, h.PeekAllTrailer(b2s(name)))
		}
	}
}

// lineHeader is what restore needs of a request's or a response's header.
type lineHeader interface {
	PeekAll(key string) [][]byte
	Del(key string)
	AddBytesV(key string, value []byte)
}

// restore puts each remembered field's lines back in their first order,
// unless the deletes took the field away. Every such field is taken out
// before any is put back: a delete fills its holes with the head's last
// lines, which, once a field is back, are that field's (with two repeated
// fields, the first put back was reordered by the second's delete).
func (o *lineOrder) restore(h lineHeader) {
	var back uint8 // the fields taken out, by index (len(o.names) is 8)
	for i := range o.n {
		name := b2s(o.bytes(o.names[i]))
		if len(h.PeekAll(name)) == int(o.count[i]) { // else deleted
			h.Del(name)
			back |= 1 << i
		}
	}
	v := 0
	for i := range o.n {
		vals := o.vals[v : v+int(o.count[i])]
		v += int(o.count[i])
		if back&(1<<i) == 0 {
			continue
		}
		name := b2s(o.bytes(o.names[i]))
		for _, sp := range vals {
			h.AddBytesV(name, o.bytes(sp))
		}
	}
}

// lineOrders holds *lineOrder for heads that lose a line: most lose none,
// and should not zero its 512 bytes (nor take it on their stack).
var lineOrders = sync.Pool{New: func() any { return new(lineOrder) }}

// release forgets what o remembered and gives it back; the bytes are
// overwritten, not zeroed.
func (o *lineOrder) release() {
	o.used, o.n, o.nv = 0, 0, 0
	lineOrders.Put(o)
}
