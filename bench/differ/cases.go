package main

import (
	"fmt"
	"strings"
)

// caseEnv is what the corpus needs to know of the lab: the sandbox's host
// name (port and id, as a client writes it) and port.
type caseEnv struct {
	host string
	port int
}

// tcase is one exchange: raw bytes sent on a new connection ({case} becomes
// the X-Lab-Case line that ties the sandbox's records to the run), how many
// answers to read, and the differences expected with their reasons.
type tcase struct {
	name  string
	raw   string
	nresp int  // answers to read; 0 means 1
	v10   bool // an HTTP/1.0 exchange: Connection: keep-alive in answers counts
	// alone runs the case with no other case of its subject at once: its
	// answer leaves a pooled sandbox connection that turns readable 50 ms
	// later (a 408, strayWhenIdle). Another case's request sent on it just
	// as that 408 went out got the 408 for its answer, from either proxy
	// (nginx did, once, in CI), which is the race every upstream keep-alive
	// has, not what the case is about. Alone, the 408 is there long before
	// the next case reuses the connection, and is seen and dropped.
	alone  bool
	expect []exp
}

// exp is an expected difference: every difference whose text starts with
// prefix is explained by why.
type exp struct{ prefix, why string }

func (c tcase) explain(d string) string {
	for _, e := range c.expect {
		if strings.HasPrefix(d, e.prefix) {
			return e.why
		}
	}
	return ""
}

// rq builds a request: line, the lab's tag, the header lines, the empty line,
// then body.
func rq(line string, headers []string, body string) string {
	var b strings.Builder
	b.WriteString(line + "\r\n{case}")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n" + body)
	return b.String()
}

func hs(h ...string) []string { return h }

// Reasons, each naming where the behaviour is written down.
const (
	whyTrace       = "TRACE is forwarded, nginx answers 405 (README: Decisions, Like nginx, not relayed)"
	whyChunkedBuf  = "nginx-platform.conf leaves proxy_request_buffering on: nginx reads a chunked body whole and sends it with Content-Length; CubeProxy streams it chunked (README: Forwarding behaviour; artefact of the nginx config)"
	whyReqTrailer  = "the trailer fields of a chunked request body reach the sandbox; nginx drops them (README: Decisions, Like nginx, not relayed)"
	whyHopByHop    = "a request's Connection options (and Keep-Alive, Proxy-Connection, TE, Trailer) are removed, nginx ignores Connection options and passes them (README: Forwarding behaviour, Headers)"
	whyH2c         = "Upgrade: h2c is removed, the request is forwarded plain (README: Forwarding behaviour, WebSocket)"
	whyForwarded   = "a client's Forwarded gets the proxy's element appended, nginx passes it untouched (README: Forwarding behaviour, Headers)"
	whyTokens      = "the proxy's own credentials (traffic tokens, X-Cube-Admin-Token) never reach a sandbox (DESIGN: Auth; README: Decisions)"
	whyTE          = "Transfer-Encoding other than chunked: 400 and close, nginx 501 (README: Decisions, Transfer codings)"
	whyHeadLimit   = "request heads up to 32 KiB in all, in lines of any length (client.max_header_size: README Decisions, Header limits); nginx's default large_client_header_buffers 4 8k also bounds each line to 8 KiB"
	whyOverLimit   = "a head over client.max_header_size is 431 request_header_too_large, nginx 400/414 (README: Errors; Decisions, Left to fasthttp's parser)"
	whyRoute       = "nginx-platform.conf routes every id to the port's upstream and knows no ports but its upstream blocks; CubeProxy looks the route up (artefact of the nginx model, not of the platform's Redis-backed proxy)"
	whyGzip        = "nginx-platform.conf has gzip on for text, JSON and event streams (the platform's setting): nginx gzips for a client that accepts it, chunked, with a weak ETag and no Accept-Ranges, also a HEAD's head; CubeProxy never re-encodes a sandbox's body (README: Decisions, No compression)"
	whyUpstreamHdr = "nginx replaces a sandbox's Server with its own; CubeProxy passes it (README: Forwarding behaviour, Headers)"
	whyCtypeDup    = "two different Content-Type lines are a 400 (README: Decisions, Left to fasthttp's parser)"
	whyLenient     = "valid HTTP (or repaired as RFC 9112 lets a proxy) that nginx 1.22 refuses with 400, forwarded (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyStricter    = "refused by CubeProxy where nginx 1.22 serves or relays it (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyCL0         = "fasthttp's writer adds Content-Length: 0 to a bodiless request whose method is not GET or HEAD; nginx sends none (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyUnderscore  = "a header name with _ passes, nginx drops it (underscores_in_headers off) (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whySpaceName   = "a header line whose name holds a space is dropped and the request served; nginx 1.22 answers 400 (README: Forwarding behaviour, Headers)"
	whyKeptOpen    = "both refuse; nginx closes the connection after its 400, CubeProxy keeps a well-framed request's connection"
	whyConnect     = "CONNECT is a 405 method_not_allowed (README: Errors); nginx 1.22 answers 400 and closes"
	whyInterim     = "a sandbox's interim 1xx is not relayed (README: Decisions, Like nginx, not relayed); nginx 1.22 reads the 1xx as the final head and the client gets nothing"
	whyTrailerHdr  = "the Trailer field that names a chunked answer's trailer is removed with the trailer fields, which are not relayed (README: Decisions, Like nginx, not relayed); nginx drops the fields and keeps the Trailer field"
	whyHopAnswer   = "hop-by-hop fields of an answer (and those its Connection names) are removed, nginx relays Proxy-Connection, TE, Upgrade and Connection-named ones (README: Forwarding behaviour, Headers)"
	whyRespCLTE    = "an answer with Content-Length and Transfer-Encoding: chunked is a 502 (README: Forwarding behaviour); Debian 12's nginx 1.22.1 decodes it, and relays it on a HEAD's or 304's head, which frames no body (RFC 9112 6.3 rule 1), where nginx 1.23's upstream header handlers refuse the pair on any answer"
	whyUnasked101  = "a 101 to a request that asked for no upgrade is a 502 upstream_bad_response (README: Forwarding behaviour, WebSocket); nginx relays any 101"
	whySSEClose    = "a GET answered with an event stream is detached from fasthttp and its head says Connection: close (README: Forwarding behaviour, SSE); nginx keeps the connection"
	whyVersion     = "a version other than HTTP/1.0 or HTTP/1.1 is a 505 (README: Errors); nginx serves HTTP/1.2 as HTTP/1.1"
	whyBadChunk    = "both answer 400; a chunked body streams, so the sandbox may get the head before the broken chunk is read (as the timing falls) and then a closed connection, where nginx reads the whole body first (README: Forwarding behaviour)"
	whyStrictParse = "refused by fasthttp's parser where nginx 1.22 is lenient (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyAccel       = "nginx reads X-Accel-* fields of an answer as its own instructions and removes them (X-Accel-Redirect: it fetches that path from the sandbox again, here in a loop to its 500); CubeProxy has no such fields and relays them (README: Decisions, No nginx X-Accel-* instructions)"
	whyRetry       = "nginx re-sent the GET on a new connection when its kept-alive one closed without an answer; CubeProxy re-sends only then too, so the count depends on whether the connection was reused (README: Forwarding behaviour, upstream pools)"
	whyHTTP09      = "both refuse HTTP/0.9: nginx answers in HTTP/0.9 (a bare body), CubeProxy with an HTTP/1.1 400"
	whyHeadTotal   = "a head over client.max_header_size (32 KiB, nginx's total) is a 431; nginx answers 400 (README: Decisions, Header limits)"
	whyBadHost     = "a Host whose value is not a host[:port] (a port of letters, a %) is a 400 from fasthttp's parser (RFC 9112 3.2); nginx routes by its leading <port>-<id> and passes it on (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyAbsHost     = "an absolute-form target must name the sandbox and port its Host names, else 400 invalid_host; nginx routes by the target alone (README: Target parsing)"
	whyAbsNoHost   = "an HTTP/1.0 request in absolute form without Host reaches the sandbox with the target's host as Host; nginx sends its HTTP/1.1 request with none, which an HTTP/1.1 server may refuse (README: Target parsing)"
	whyEmptyXFF    = "an empty X-Forwarded-For line counts as none: the sandbox gets the client's address alone, where nginx's $proxy_add_x_forwarded_for makes it \", 127.0.0.1\" (an empty first element) (README: Forwarding behaviour, Headers)"
	whyUpgradeOnly = "an Upgrade that Connection does not list asks for no upgrade (RFC 9110 7.8) and is removed as hop-by-hop; nginx-platform.conf's map sends any Upgrade on with Connection: upgrade (README: Forwarding behaviour, Headers)"
	whyCRLFFill    = "a head after 32 KiB (client.max_header_size) of empty lines: fasthttp reads a buffer of nothing but CRLFs as the end of input and closes without an answer (a reset, as the rest is unread); nginx skips any number of them (README: Decisions, Left to fasthttp's parser)"
	whyNoLine      = "bytes no request line can begin with (NUL), without a line end: nginx answers 400 at once, CubeProxy waits for the line and answers 408 after client.read_timeout, as fasthttp parses only whole lines (README: Decisions, Left to fasthttp's parser)"
	whyRespTE      = "an HTTP/1.1 answer with a transfer coding other than chunked is a 502 upstream_bad_response; nginx 1.22 drops the coding's name and relays the coded bytes, undecodable by the client but for identity, which RFC 7230 removed (README: Forwarding behaviour)"
	whyRespBadCL   = "an answer whose Content-Length is not digits (+5, -1, a list 5, 5) or past 2^63 is a 502 upstream_bad_response, as RFC 9112 6.3 has a proxy answer it; nginx 1.22 relays it (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyCookieDom   = "a Set-Cookie Domain is removed, so the cookie stays with the host that set it: another site's or the parent domain every sandbox shares would reach other sandboxes, and the host's own every name under it, where other sandboxes' pages may be served by their path; nginx relays it (README: Forwarding behaviour, Headers; Proxy auth)"
	whyRespHTTP09  = "an answer whose status line is not HTTP/1.x (http/1.1 in lower case) is a 502 upstream_bad_response; nginx 1.22 takes it for HTTP/0.9 and relays its bytes, head included, as the answer (README: Decisions, Where nginx refuses a request and the proxy does not)"
)

// Reasons for answers nginx 1.22 relays and the proxy refuses with a 502.
const (
	whyRespCtl       = "an answer with a control character other than a tab in a field value (RFC 9110 5.5), or a field name with a character that is no token character (@), is a 502 upstream_bad_response (fasthttp's parser; RFC 9110 lets a recipient reject it, and Go's and Node's clients refuse such a head too); nginx 1.22 relays it (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyRespChunkExt  = "a chunk-size line over 4 KiB (an extension that long) is a 502 upstream_bad_response, as nothing has gone out yet (proxy/chunked.go, maxChunkLine: a sandbox cannot make the proxy skip an endless line); nginx skips any extension (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyRespBadStatus = "an answer whose status code is not three digits is a 502 upstream_bad_response; nginx 1.22 takes the line for HTTP/0.9 and relays the sandbox's bytes, head and all, as a body (README: Decisions, Where nginx refuses a request and the proxy does not)"
	whyRespChunkBad  = "a chunk size no 64-bit integer holds, in the bytes that came with the head, is a 502 upstream_bad_response (README: Forwarding behaviour: framing broken before the first data byte); nginx 1.22 closes the client's connection without an answer"
	whyEarly         = "a sandbox that refuses a request from its head and closes with the body unread: the proxy relays its answer at once (README: Forwarding behaviour, a sandbox that answers before it has the whole body); it stops sending the body and closes the client's connection after the answer (Connection: close) when the answer came before the body was sent, as the timing falls; nginx sends the whole buffered body first and, as the timing falls, meets the sandbox's reset and answers 502 instead, at times with no request of its recorded by the sandbox (a CI run on 2026-12-05)"
	whyRespChunkLF   = "chunk lines of an answer ended by a bare LF are a 502 upstream_bad_response when broken in the bytes that came with the head (README: Forwarding behaviour: a bare-LF head is accepted, chunk framing must still use CRLF, as net/http's); nginx 1.22 decodes them"
	whyRespTEDup     = "an answer whose Transfer-Encoding names chunked twice (on one line or two) or is empty is a 502 upstream_bad_response (fasthttp's parser; RFC 9112 7.1: chunked is applied once; Go's net/http client refuses both too, and nginx 1.23's upstream header handlers refuse a second Transfer-Encoding line); nginx 1.22 decodes the first as chunked and frames the empty one by its Content-Length (README: Decisions, Where nginx refuses a request and the proxy does not)"
)

// oneRefuses is the expected differences of a case one side refuses (its
// own answer, the connection closed or kept) and the other serves.
func oneRefuses(why string) []exp {
	return []exp{{"client[0].status", why}, {"client[0].from", why}, {"client.conn", why}, {"sandbox.requests", why}}
}

func corpus(env caseEnv) []tcase {
	H := "Host: " + env.host
	get := func(target string, extra ...string) string {
		return rq("GET "+target+" HTTP/1.1", append([]string{H}, extra...), "")
	}
	ans := func(variant string, extra ...string) string {
		return get("/", append([]string{"X-Lab-Answer: " + variant}, extra...)...)
	}
	c := []tcase{
		// Methods.
		{name: "method.get", raw: get("/")},
		{name: "method.post", raw: rq("POST /p HTTP/1.1", hs(H, "Content-Type: text/plain", "Content-Length: 5"), "hello")},
		{name: "method.put", raw: rq("PUT /p HTTP/1.1", hs(H, "Content-Length: 5"), "hello")},
		{name: "method.patch", raw: rq("PATCH /p HTTP/1.1", hs(H, "Content-Length: 2"), "{}")},
		{name: "method.delete", raw: rq("DELETE /p HTTP/1.1", hs(H), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
		{name: "method.options", raw: rq("OPTIONS /p HTTP/1.1", hs(H), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
		{name: "method.options-star", raw: rq("OPTIONS * HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "method.head", raw: rq("HEAD / HTTP/1.1", hs(H), "")},
		{name: "method.trace", raw: rq("TRACE / HTTP/1.1", hs(H), ""), expect: []exp{
			{"client[0].status", whyTrace}, {"client[0].from", whyTrace}, {"client.conn", whyTrace}, {"sandbox.requests", whyTrace}}},
		{name: "method.connect", raw: rq("CONNECT "+env.host+":443 HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyConnect}, {"client.conn", whyConnect}}},
		{name: "method.connect-other", raw: rq("CONNECT other.example:443 HTTP/1.1", hs("Host: other.example:443"), ""), expect: []exp{{"client[0].status", whyConnect}, {"client.conn", whyConnect}}},
		{name: "method.trace-max-forwards", raw: rq("TRACE / HTTP/1.1", hs(H, "Max-Forwards: 0"), ""), expect: oneRefuses(whyTrace)},
		{name: "method.unknown", raw: rq("FROBNICATE / HTTP/1.1", hs(H), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
		{name: "method.webdav", raw: rq("PROPFIND / HTTP/1.1", hs(H, "Depth: 1"), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
		{name: "method.lowercase", raw: rq("get / HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "method.lowercase-head", raw: rq("head / HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "method.post-no-body", raw: rq("POST /p HTTP/1.1", hs(H), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
		{name: "method.odd-token", raw: rq("GET! / HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},

		// Targets.
		{name: "target.absolute", raw: rq("GET http://"+env.host+"/abs?q=1 HTTP/1.1", hs(H), "")},
		{name: "target.absolute-other", raw: rq("GET http://other.example/abs HTTP/1.1", hs(H), ""), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct2F", raw: get("/a%2Fb/%2e%2e/c")},
		{name: "target.dots", raw: get("/a/./b/../c")},
		{name: "target.dotdot-above-root", raw: get("/../etc/passwd"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.dotdot-above-root-deep", raw: get("/a/../../etc/passwd"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.dotdot-encoded", raw: get("/%2e%2e/etc/passwd"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.dotdot-encoded-mixed", raw: get("/a/.%2E/%2e./x"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.dotdot-query", raw: get("/p?x=/../../etc")},
		{name: "target.backslash", raw: get("/a\\..\\..\\x")},
		{name: "target.double-slash", raw: get("//a//b")},
		{name: "target.query-empty", raw: get("/p?")},
		{name: "target.query-odd", raw: get("/p?a=1&a=2&b=%20&c=?/#")},
		{name: "target.fragment", raw: get("/p#frag")},
		{name: "target.non-ascii", raw: get("/caf\xc3\xa9?q=\xe2\x82\xac")},
		{name: "target.pct-invalid", raw: get("/%zz%"), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "target.long-7k", raw: get("/" + strings.Repeat("a", 7000))},
		{name: "target.long-10k", raw: get("/" + strings.Repeat("a", 10000)), expect: []exp{{"client[0].status", whyHeadLimit}, {"client[0].from", whyHeadLimit}, {"client.conn", whyHeadLimit}, {"sandbox.requests", whyHeadLimit}}},
		{name: "target.no-slash", raw: get("foo")},
		{name: "target.space", raw: get("/a b")},
		{name: "target.pct00", raw: get("/a%00b"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct00-query", raw: get("/p?a=%00")},
		{name: "target.pct00-absolute", raw: rq("GET http://"+env.host+"/a%00b HTTP/1.1", hs(H), ""), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct00-absolute-query", raw: rq("GET http://"+env.host+"?%00 HTTP/1.1", hs(H), "")},
		{name: "target.pct00-fragment", raw: get("/p#a?%00")},
		{name: "target.pct00-after-escaped-qmark", raw: get("/a%3F%00"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct00-pct25", raw: get("/a%2500")},
		{name: "target.pct-unfinished", raw: get("/a%2"), expect: oneRefuses(whyLenient)},
		{name: "target.pct-unfinished-mid", raw: get("/a%2/b"), expect: oneRefuses(whyLenient)},
		{name: "target.pct-alone", raw: get("/a%"), expect: oneRefuses(whyLenient)},
		{name: "target.pct25", raw: get("/%252e%252e/x")},
		{name: "target.pct-upper-dotdot", raw: get("/a/%2E%2E/%2E%2E/x"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct-slash-dotdot", raw: get("/a/..%2f..%2fetc"), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.pct-backslash-dotdot", raw: get("/a/..%5c..%5cetc")},
		{name: "target.pct-overlong-dot", raw: get("/%c0%ae%c0%ae/x")},
		{name: "target.dot-semicolon", raw: get("/..;/x")},
		{name: "target.dotdot-to-root", raw: get("/a/b/../..")},
		{name: "target.dotdot-end", raw: get("/a/..")},
		{name: "target.dotdot-bare", raw: get("/.."), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "target.raw-ctl", raw: get("/a\x01b")},
		{name: "target.raw-del", raw: get("/a\x7fb")},
		{name: "target.raw-nul", raw: get("/a\x00b")},
		{name: "target.query-raw-punct", raw: get("/p?a=\"<>{}|\\^`'")},
		{name: "target.query-pct-bad", raw: get("/p?a=%zz&b=%2")},
		{name: "target.query-ctl", raw: get("/p?a=\x01")},
		{name: "target.query-only-question", raw: get("/?")},
		{name: "target.query-slashes", raw: get("/p?//x/../y")},
		{name: "target.absolute-sandbox-other-host", raw: rq("GET http://"+env.host+"/abs HTTP/1.1", hs("Host: other.example"), ""), expect: oneRefuses(whyAbsHost)},
		{name: "target.absolute-https", raw: rq("GET https://"+env.host+"/abs HTTP/1.1", hs(H), "")},
		{name: "target.absolute-upper-scheme", raw: rq("GET HTTP://"+env.host+"/abs HTTP/1.1", hs(H), "")},
		{name: "target.absolute-userinfo", raw: rq("GET http://u:p@"+env.host+"/abs HTTP/1.1", hs(H), "")},
		{name: "target.absolute-no-path", raw: rq("GET http://"+env.host+" HTTP/1.1", hs(H), "")},
		{name: "target.absolute-port", raw: rq("GET http://"+env.host+":8080/abs HTTP/1.1", hs(H), "")},
		{name: "target.absolute-other-scheme", raw: rq("GET ftp://"+env.host+"/abs HTTP/1.1", hs(H), "")},
		{name: "target.authority-form-get", raw: rq("GET "+env.host+":80 HTTP/1.1", hs(H), "")},

		// Host.
		{name: "host.port", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":80"), "")},
		{name: "host.trailing-dot", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+"."), "")},
		{name: "host.upper-case", raw: rq("GET / HTTP/1.1", hs("Host: "+strings.ToUpper(env.host)), "")},
		{name: "host.duplicate", raw: rq("GET / HTTP/1.1", hs(H, H), "")},
		{name: "host.missing", raw: rq("GET / HTTP/1.1", nil, "")},
		{name: "host.empty", raw: rq("GET / HTTP/1.1", hs("Host:"), "")},
		{name: "host.http10-none", raw: rq("GET / HTTP/1.0", nil, ""), v10: true},
		{name: "host.http10", raw: rq("GET / HTTP/1.0", hs(H), ""), v10: true},
		{name: "host.userinfo", raw: rq("GET / HTTP/1.1", hs("Host: user@"+env.host), "")},
		{name: "host.port-8080", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":8080"), "")},
		{name: "host.port-empty", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":"), "")},
		{name: "host.port-alpha", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":abc"), ""), expect: oneRefuses(whyBadHost)},
		{name: "host.port-huge", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":99999"), "")},
		{name: "host.whitespace", raw: rq("GET / HTTP/1.1", hs("Host:   "+env.host+"   "), "")},
		{name: "host.two-different", raw: rq("GET / HTTP/1.1", hs(H, "Host: other.example"), "")},
		{name: "host.comma-list", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+", other.example"), "")},
		{name: "host.ip", raw: rq("GET / HTTP/1.1", hs("Host: 127.0.0.1"), ""), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "host.pct", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+"%00"), ""), expect: oneRefuses(whyBadHost)},
		{name: "host.http10-absolute", raw: rq("GET http://"+env.host+"/abs HTTP/1.0", nil, ""), v10: true, expect: []exp{{"sandbox[0].headers", whyAbsNoHost}}},
		{name: "host.leading-zero-port", raw: rq("GET / HTTP/1.1", hs("Host: 0"+env.host), ""), expect: []exp{
			{"client[0]", "ports with leading zeros are normalised (DESIGN: Request pipeline 1); nginx-platform.conf's regex takes at most 5 digits (artefact of the nginx model)"},
			{"sandbox.requests", "as client[0]"}, {"client.conn", "as client[0]"}}},
		{name: "host.unmapped-port", raw: rq("GET / HTTP/1.1", hs("Host: 1-lab.cube.test"), ""), expect: []exp{{"client[0].status", whyRoute}}},
		{name: "host.unknown-sandbox", raw: rq("GET / HTTP/1.1", hs(fmt.Sprintf("Host: %d-nosuch.cube.test", env.port)), ""), expect: []exp{
			{"client[0]", whyRoute}, {"sandbox.requests", whyRoute}}},

		// Header fields.
		{name: "hdr.duplicates", raw: get("/", "X-Dup: 1", "X-Other: x", "X-Dup: 2")},
		{name: "hdr.empty-value", raw: get("/", "X-Empty:", "X-Blank:   ")},
		{name: "hdr.obs-fold", raw: get("/", "X-Fold: a", " b"), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"client.conn", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "hdr.space-before-colon", raw: get("/", "X-Sp : v")},
		{name: "hdr.underscore", raw: get("/", "X_Custom: v", "X_Real_IP: 6.6.6.6"), expect: []exp{{"sandbox[0].headers", whyUnderscore}}},
		{name: "hdr.name-with-space", raw: get("/", "X Real IP: 6.6.6.6"), expect: []exp{{"client[0].status", whySpaceName}, {"client[0].from", whySpaceName}, {"client.conn", whySpaceName}, {"sandbox.requests", whySpaceName}}},
		{name: "hdr.huge-12k", raw: get("/", "X-Huge: "+strings.Repeat("h", 12000)), expect: []exp{{"client[0].status", whyHeadLimit}, {"client[0].from", whyHeadLimit}, {"client.conn", whyHeadLimit}, {"sandbox.requests", whyHeadLimit}}},
		{name: "hdr.huge-20k", raw: get("/", "X-Huge: "+strings.Repeat("h", 20000)), expect: []exp{{"client[0].status", whyHeadLimit}, {"client[0].from", whyHeadLimit}, {"client.conn", whyHeadLimit}, {"sandbox.requests", whyHeadLimit}}},
		{name: "hdr.huge-40k", raw: get("/", "X-Huge: "+strings.Repeat("h", 40000)), expect: []exp{{"client[0].status", whyOverLimit}}},
		{name: "hdr.many", raw: get("/", manyHeaders(150)...)},
		{name: "hdr.connection-lists", raw: get("/", "Connection: X-Secret, keep-alive", "X-Secret: v"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.te-trailers", raw: get("/", "TE: trailers")},
		{name: "hdr.trailer", raw: get("/", "Trailer: X-T"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.proxy-connection", raw: get("/", "Proxy-Connection: keep-alive"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.keep-alive", raw: get("/", "Keep-Alive: timeout=5")},
		{name: "hdr.upgrade-h2c", raw: get("/", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), expect: []exp{{"sandbox[0].headers", whyH2c}}},
		{name: "hdr.upgrade-ws-refused", raw: get("/", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13")},
		{name: "hdr.xff", raw: get("/", "X-Forwarded-For: 1.2.3.4")},
		{name: "hdr.xff-two-lines", raw: get("/", "X-Forwarded-For: 1.2.3.4", "X-Forwarded-For: 5.6.7.8")},
		{name: "hdr.x-real-ip", raw: get("/", "X-Real-IP: 6.6.6.6")},
		{name: "hdr.x-forwarded-proto", raw: get("/", "X-Forwarded-Proto: https", "X-Forwarded-Host: a.example")},
		{name: "hdr.forwarded", raw: get("/", "Forwarded: for=1.2.3.4"), expect: []exp{{"sandbox[0].headers", whyForwarded}}},
		{name: "hdr.tokens", raw: get("/", "E2b-Traffic-Access-Token: t", "Cube-Traffic-Access-Token: t", "X-Cube-Admin-Token: a", "Authorization: Bearer b", "X-Access-Token: x"), expect: []exp{{"sandbox[0].headers", whyTokens}}},
		{name: "hdr.cookies", raw: get("/", "Cookie: a=1", "Cookie: b=2")},
		{name: "hdr.content-type-dup", raw: rq("POST / HTTP/1.1", hs(H, "Content-Type: text/plain", "Content-Type: application/json", "Content-Length: 2"), "{}"), expect: []exp{{"client[0].status", whyCtypeDup}, {"client[0].from", whyCtypeDup}, {"client.conn", whyCtypeDup}, {"sandbox.requests", whyCtypeDup}}},
		{name: "hdr.via-max-forwards", raw: get("/", "Via: 1.1 upstream", "Max-Forwards: 3")},

		{name: "hdr.value-utf8", raw: get("/", "X-Name: caf\xc3\xa9")},
		{name: "hdr.value-ctl", raw: get("/", "X-Ctl: a\x01b"), expect: []exp{{"client[0].status", whyStrictParse}, {"client[0].from", whyStrictParse}, {"client.conn", whyStrictParse}, {"sandbox.requests", whyStrictParse}}},
		{name: "hdr.value-nul", raw: get("/", "X-Nul: a\x00b")},
		{name: "hdr.value-tab", raw: get("/", "X-Tab: a\tb")},
		{name: "hdr.name-long", raw: get("/", "X-"+strings.Repeat("n", 1000)+": v")},
		{name: "hdr.accel", raw: get("/", "X-Accel-Redirect: /internal")},
		{name: "hdr.xff-list", raw: get("/", "X-Forwarded-For: 1.1.1.1, 2.2.2.2")},
		{name: "hdr.xff-garbage", raw: get("/", "X-Forwarded-For: not-an-ip, <script>")},
		{name: "hdr.xff-empty", raw: get("/", "X-Forwarded-For:"), expect: []exp{{"sandbox[0].headers", whyEmptyXFF}}},
		{name: "hdr.x-real-ip-two", raw: get("/", "X-Real-IP: 1.1.1.1", "X-Real-IP: 2.2.2.2")},
		{name: "hdr.x-forwarded-misc", raw: get("/", "X-Forwarded-Host: a.example", "X-Forwarded-Host: b.example", "X-Forwarded-Port: 8443", "X-Forwarded-Prefix: /api", "X-Forwarded-Proto: http")},
		{name: "hdr.connection-names-xff", raw: get("/", "Connection: X-Forwarded-For, X-Real-IP", "X-Forwarded-For: 1.2.3.4", "X-Real-IP: 6.6.6.6"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.connection-names-host", raw: get("/", "Connection: Host")},
		{name: "hdr.connection-names-cl", raw: rq("POST / HTTP/1.1", hs(H, "Connection: Content-Length", "Content-Length: 5"), "hello")},
		{name: "hdr.connection-names-te", raw: rq("POST / HTTP/1.1", hs(H, "Connection: Transfer-Encoding", "Transfer-Encoding: chunked"), "5\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "hdr.connection-names-cookie", raw: get("/", "Connection: Cookie, Authorization", "Cookie: a=1", "Authorization: Basic dTpw"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.connection-close-names", raw: get("/", "Connection: close, X-Secret", "X-Secret: v"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.connection-two-lines", raw: get("/", "Connection: keep-alive", "Connection: X-Secret", "X-Secret: v"), expect: []exp{{"sandbox[0].headers", whyHopByHop}}},
		{name: "hdr.connection-upgrade-alone", raw: get("/", "Connection: Upgrade")},
		{name: "hdr.upgrade-alone", raw: get("/", "Upgrade: websocket"), expect: []exp{{"sandbox[0].headers", whyUpgradeOnly}}},
		{name: "hdr.line-8000", raw: get("/", "X-Long: "+strings.Repeat("l", 8000))},
		{name: "hdr.line-8300", raw: get("/", "X-Long: "+strings.Repeat("l", 8300)), expect: oneRefuses(whyHeadLimit)},
		{name: "hdr.total-15k", raw: get("/", "X-A: "+strings.Repeat("a", 5000), "X-B: "+strings.Repeat("b", 5000), "X-C: "+strings.Repeat("c", 5000))},
		{name: "hdr.total-17k", raw: get("/", "X-A: "+strings.Repeat("a", 5000), "X-B: "+strings.Repeat("b", 5000), "X-C: "+strings.Repeat("c", 5000), "X-D: "+strings.Repeat("d", 2000))},
		{name: "hdr.total-30k", raw: get("/", repeatedLong(15, 2000)...)},
		{name: "hdr.total-40k", raw: get("/", repeatedLong(20, 2000)...), expect: []exp{{"client[0].status", whyHeadTotal}}},
		{name: "hdr.cookie-7k", raw: get("/", "Cookie: big="+strings.Repeat("c", 7000))},
		{name: "hdr.repeated-50", raw: get("/", repeated("X-Rep", 50)...)},
		{name: "hdr.cl-leading-zero", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 005"), "hello")},
		{name: "hdr.authorization-basic", raw: get("/", "Authorization: Basic dTpw")},
		{name: "hdr.if-none-match", raw: get("/", "If-None-Match: \"v1\"", "If-Modified-Since: Tue, 01 Jan 2030 00:00:00 GMT", "Range: bytes=0-3")},
		{name: "line.double-space", raw: rq("GET  / HTTP/1.1", hs(H), ""), expect: []exp{{"client[0].status", whyStrictParse}, {"client[0].from", whyStrictParse}, {"client.conn", whyStrictParse}, {"sandbox.requests", whyStrictParse}}},
		{name: "line.trailing-space", raw: rq("GET / HTTP/1.1 ", hs(H), ""), expect: []exp{{"client[0].status", whyStrictParse}, {"client[0].from", whyStrictParse}, {"client.conn", whyStrictParse}, {"sandbox.requests", whyStrictParse}}},
		{name: "line.tab", raw: rq("GET\t/\tHTTP/1.1", hs(H), "")},
		{name: "line.lower-version", raw: rq("GET / http/1.1", hs(H), "")},
		{name: "host.ipv6-literal", raw: rq("GET / HTTP/1.1", hs("Host: [::1]:80"), ""), expect: []exp{{"client.conn", whyKeptOpen}}},
		{name: "host.bad-char", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+"/x"), "")},
		{name: "body.cl-zero-get", raw: rq("GET / HTTP/1.1", hs(H, "Content-Length: 0"), "")},
		{name: "body.chunked-get", raw: rq("GET / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.chunked-lf-only", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5\nhello\n0\n\n"), expect: []exp{{"sandbox[0].", whyBadChunk}, {"client[0].status", whyStrictParse}, {"client[0].from", whyStrictParse}, {"client.conn", whyStrictParse}, {"sandbox.requests", whyStrictParse}}},

		// Expect.
		{name: "expect.100-wait", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Expect: 100-continue"), "") + waitMarker + "hello"},
		{name: "expect.100-nowait", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Expect: 100-continue"), "hello")},
		{name: "expect.100-chunked", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked", "Expect: 100-continue"), "") + waitMarker + "5\r\nhello\r\n0\r\n\r\n", expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "expect.100-no-body", raw: get("/", "Expect: 100-continue")},
		{name: "expect.100-case", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Expect: 100-Continue"), "") + waitMarker + "hello"},
		{name: "expect.unknown", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Expect: something-else"), "hello")},
		{name: "expect.http10", raw: rq("POST / HTTP/1.0", hs(H, "Content-Length: 5", "Expect: 100-continue"), "") + waitMarker + "hello", v10: true},

		// Request bodies.
		{name: "body.chunked", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.chunk-extensions", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5;name=value\r\nhello\r\n0;last\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.chunked-trailer", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked", "Trailer: X-Sum"), "5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}, {"sandbox[0].trailers", whyReqTrailer}}},
		{name: "body.chunked-empty", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "0\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.chunked-bad-size", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "zz\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].", whyBadChunk}, {"sandbox.requests", whyBadChunk}}},
		{name: "body.cl-and-chunked", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 3", "Transfer-Encoding: chunked"), "5\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}, {"sandbox.requests", whyLenient}}},
		{name: "body.two-cl-same", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Content-Length: 5"), "hello")},
		{name: "body.two-cl-differ", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5", "Content-Length: 6"), "hello!")},
		{name: "body.cl-list", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5, 5"), "hello")},
		{name: "body.cl-plus", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: +5"), "hello")},
		{name: "body.cl-negative", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: -1"), "")},
		{name: "body.te-identity", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: identity", "Content-Length: 5"), "hello"), expect: []exp{{"client[0].status", whyTE}}},
		{name: "body.te-gzip-chunked", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: gzip, chunked"), "5\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"client[0].status", whyTE}}},
		{name: "body.te-chunked-http10", raw: rq("POST / HTTP/1.0", hs(H, "Transfer-Encoding: chunked"), "5\r\nhello\r\n0\r\n\r\n"), v10: true},
		{name: "body.on-get", raw: rq("GET / HTTP/1.1", hs(H, "Content-Length: 5"), "hello")},
		{name: "body.on-head", raw: rq("HEAD / HTTP/1.1", hs(H, "Content-Length: 5"), "hello")},
		{name: "body.100k", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 100000"), strings.Repeat("x", 100000))},
		{name: "body.chunk-size-overflow", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "fffffffffffffffff1\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].", whyBadChunk}, {"sandbox.requests", whyBadChunk}}},
		{name: "body.chunk-size-0x", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "0x5\r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].", whyBadChunk}, {"sandbox.requests", whyBadChunk}}},
		{name: "body.chunk-size-space", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5 \r\nhello\r\n0\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.chunk-leading-zeros", raw: rq("POST / HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "0005\r\nhello\r\n000\r\n\r\n"), expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "body.cl-exponent", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length: 5e0"), "hello")},
		{name: "body.cl-leading-space", raw: rq("POST / HTTP/1.1", hs(H, "Content-Length:    5   "), "hello")},

		// Answers from the sandbox.
		{name: "ans.close-delimited", raw: ans("close")},
		{name: "ans.http10-unsized", raw: ans("http10")},
		{name: "ans.chunked-trailer", raw: ans("chunked"), expect: []exp{{"client[0].headers", whyTrailerHdr}}},
		{name: "ans.204", raw: ans("204")},
		{name: "ans.204-with-body", raw: ans("204body")},
		{name: "ans.304-with-body", raw: ans("304body")},
		{name: "ans.head", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: plain"), "")},
		{name: "ans.103", raw: ans("103"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.unsolicited-100", raw: ans("100"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		// An HTTP/1.0 client must never see a 1xx (RFC 9110 15.2): the
		// final answer alone, closing the connection.
		{name: "ans.103-http10", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: 103"), ""), v10: true, expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.100-http10-keepalive", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: 100", "Connection: keep-alive"), ""), v10: true, expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.102-http10", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: 102"), ""), v10: true, expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.set-cookies", raw: ans("cookies")},
		{name: "ans.location-internal", raw: ans("location")},
		{name: "ans.location-host", raw: ans("location-host")},
		{name: "ans.dup-cl-same", raw: ans("dupcl-same"), expect: []exp{{"client[0].status", whyStricter}, {"client[0].from", whyStricter}}},
		{name: "ans.dup-cl-differ", raw: ans("dupcl-diff"), expect: []exp{{"client[0].status", whyStricter}, {"client[0].from", whyStricter}}},
		{name: "ans.cl-and-te", raw: ans("cl-and-te"), expect: []exp{{"client[0].status", whyRespCLTE}, {"client[0].from", whyRespCLTE}}},
		{name: "ans.gzip-accepted", raw: ans("gzip-plain", "Accept-Encoding: gzip"), expect: []exp{{"client[0].headers", whyGzip}, {"client[0].body", whyGzip}, {"client[0].framing", whyGzip}}},
		{name: "ans.gzip-not-accepted", raw: ans("gzip-plain")},
		{name: "ans.gzipped-by-sandbox", raw: ans("gzipped", "Accept-Encoding: gzip")},
		{name: "ans.hop-by-hop", raw: ans("hopbyhop"), expect: []exp{{"client[0].headers", whyHopAnswer}}},
		{name: "ans.status-custom", raw: ans("status-custom")},
		{name: "ans.status-no-reason", raw: ans("status-noreason")},
		{name: "ans.status-404", raw: ans("status-404")},
		{name: "ans.status-500", raw: ans("status-500")},
		{name: "ans.status-502", raw: ans("status-502")},
		{name: "ans.name-with-space", raw: ans("space-name")},
		{name: "ans.obs-fold", raw: ans("obs-fold"), expect: []exp{{"client[0].status", whyLenient}, {"client[0].from", whyLenient}}},
		{name: "ans.bare-lf", raw: ans("bare-lf")},
		{name: "ans.empty-and-dup", raw: ans("empty-value")},
		{name: "ans.header-20k", raw: ans("big-header")},
		{name: "ans.101-unasked", raw: ans("upgrade-101-unasked"), expect: []exp{{"client[0].status", whyUnasked101}, {"client[0].from", whyUnasked101}, {"client.conn", whyUnasked101}}},
		{name: "ans.server-date", raw: ans("server-date"), expect: []exp{{"client[0].headers", whyUpstreamHdr}}},
		{name: "ans.sse-sized", raw: ans("sse", "Accept: text/event-stream")},
		{name: "ans.short-body", raw: ans("cl-short"), expect: []exp{{"client[0].status", whyStricter}, {"client[0].from", whyStricter}, {"client.conn", whyStricter}}},
		{name: "ans.closed-no-answer", raw: ans("close-early"), expect: []exp{{"sandbox.requests", whyRetry}}},

		{name: "ans.websocket", raw: get("/", "X-Lab-Answer: ws-accept", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13")},
		// A request pipelined behind the upgrade belongs to the tunnel
		// once the 101 comes: never answered as a request of its own.
		{name: "ans.websocket-pipelined", raw: get("/", "X-Lab-Answer: ws-accept", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13") + get("/after")},
		{name: "ans.sse-stream", raw: get("/", "X-Lab-Answer: sse-stream", "Accept: text/event-stream"), expect: []exp{{"client[0].headers", whySSEClose}, {"client.conn", whySSEClose}}},
		{name: "ans.sse-stream-post", raw: rq("POST /mcp HTTP/1.1", hs(H, "X-Lab-Answer: sse-stream", "Accept: application/json, text/event-stream", "Content-Length: 2"), "{}")},
		{name: "ans.sized-close", raw: ans("sized-close")},
		{name: "ans.http10-keepalive", raw: ans("http10-keepalive")},
		{name: "ans.head-chunked", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: head-chunked"), "")},
		{name: "ans.x-accel", raw: ans("x-accel"), expect: []exp{{"client[0].headers", whyAccel}}},
		{name: "ans.large-sized", raw: ans("large-sized")},
		{name: "ans.large-chunked", raw: ans("large-chunked")},
		{name: "ans.www-authenticate", raw: ans("401")},
		{name: "ans.content-type-none", raw: ans("no-ctype")},
		{name: "ans.100-then-close", raw: ans("100-then-close"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.cookie-domain", raw: ans("cookie-domain"), expect: []exp{{"client[0].headers", whyCookieDom}}},
		{name: "ans.chunk-ext-size", raw: ans("chunk-ext-size")},
		{name: "ans.head-with-body", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: head-with-body"), "")},
		{name: "ans.head-with-body-then-get", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: head-with-body"), "") + get("/after"), nresp: 2},
		{name: "ans.304-cl", raw: ans("304-cl")},
		{name: "ans.304-cl-then-get", raw: ans("304-cl") + get("/after"), nresp: 2},
		{name: "ans.204-cl0", raw: ans("204-cl0")},
		{name: "ans.204-chunked", raw: ans("204-chunked") + get("/after"), nresp: 2},
		{name: "ans.205", raw: ans("205")},
		{name: "ans.102", raw: ans("102"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.te-identity", raw: ans("te-identity"), expect: []exp{{"client[0].status", whyRespTE}, {"client[0].from", whyRespTE}}},
		{name: "ans.te-gzip", raw: ans("te-gzip"), expect: []exp{{"client[0].status", whyRespTE}, {"client[0].from", whyRespTE}}},
		{name: "ans.te-gzip-chunked", raw: ans("te-gzip-chunked"), expect: []exp{{"client[0].status", whyRespTE}, {"client[0].from", whyRespTE}}},
		{name: "ans.te-chunked-upper", raw: ans("te-chunked-upper")},
		{name: "ans.chunked-cut", raw: ans("chunked-cut")},
		{name: "ans.large-cut", raw: ans("large-cut")},
		{name: "ans.cl-long", raw: ans("cl-long")},
		{name: "ans.cl-leading-zero", raw: ans("cl-leading-zero")},
		{name: "ans.cl-plus", raw: ans("cl-plus"), expect: []exp{{"client[0].status", whyRespBadCL}, {"client[0].from", whyRespBadCL}}},
		{name: "ans.chunked-close", raw: ans("chunked-close")},
		{name: "ans.sized-close-then-get", raw: ans("sized-close") + get("/after"), nresp: 2},
		{name: "ans.conn-names-cl", raw: ans("conn-names-cl")},
		{name: "ans.conn-names-ctype", raw: ans("conn-names-ctype"), expect: []exp{{"client[0].headers", whyHopAnswer}}},
		{name: "ans.many-cookies", raw: ans("many-cookies")},
		{name: "ans.status-600", raw: ans("status-600")},
		{name: "ans.status-lower-proto", raw: ans("status-lower-proto"), expect: []exp{{"client[0].status", whyRespHTTP09}, {"client[0].from", whyRespHTTP09}}},
		{name: "ans.http10-chunked", raw: ans("http10-chunked")},
		{name: "ans.ctype-dup", raw: ans("ctype-dup")},
		{name: "ans.repeated-fields", raw: ans("www-many-vary")},

		// Stray bytes a sandbox sends on a connection it keeps open: the next
		// request (pipelined, or after a pause on an idle connection) must get
		// its own answer, not the stray bytes.
		{name: "stray.cl-long-then-get", raw: ans("cl-long-keep") + get("/after"), nresp: 2},
		{name: "stray.cl-long-pause-get", raw: ans("cl-long-keep") + pauseMarker + get("/after"), nresp: 2},
		{name: "stray.chunked-extra-then-get", raw: ans("chunked-extra-keep") + get("/after"), nresp: 2},
		{name: "stray.chunked-extra-pause-get", raw: ans("chunked-extra-keep") + pauseMarker + get("/after"), nresp: 2},
		{name: "stray.sse-extra-post-then-get", raw: rq("POST /mcp HTTP/1.1", hs(H, "X-Lab-Answer: sse-extra-keep", "Accept: application/json, text/event-stream", "Content-Length: 2"), "{}") + get("/after"), nresp: 2},
		{name: "stray.sse-extra-get", raw: get("/", "X-Lab-Answer: sse-extra-keep", "Accept: text/event-stream"), expect: []exp{{"client[0].headers", whySSEClose}, {"client.conn", whySSEClose}}},
		{name: "stray.head-body-then-get", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: body-keep"), "") + get("/after"), nresp: 2},
		{name: "stray.head-body-pause-get", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: body-keep"), "") + pauseMarker + get("/after"), nresp: 2},
		{name: "stray.204-body-then-get", raw: ans("body-keep") + get("/after"), nresp: 2},
		{name: "stray.304-body-then-get", raw: ans("304body-keep") + get("/after"), nresp: 2},
		{name: "stray.408-on-idle", raw: ans("stray-later") + longPauseMarker + get("/after"), nresp: 2, alone: true},
		{name: "stray.408-on-idle-post", raw: ans("stray-later") + longPauseMarker + rq("POST /after HTTP/1.1", hs(H, "Content-Length: 5"), "hello"), nresp: 2, alone: true},
		{name: "stray.large-cl-long-then-get", raw: ans("large-cl-long-keep") + get("/after"), nresp: 2},
		{name: "stray.large-chunked-extra-then-get", raw: ans("large-chunked-extra-keep") + get("/after"), nresp: 2},
		{name: "stray.head-chunk-end-then-get", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: bodiless-chunk-end-keep"), "") + get("/after"), nresp: 2},
		{name: "stray.204-chunk-end-then-get", raw: ans("bodiless-chunk-end-keep") + get("/after"), nresp: 2},
		{name: "stray.304-chunk-end-then-get", raw: rq("PUT / HTTP/1.1", hs(H, "X-Lab-Answer: bodiless-chunk-end-keep", "Content-Length: 2"), "{}") + get("/after"), nresp: 2},
		{name: "stray.head-chunked-body-then-get", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: head-chunked-body-keep"), "") + get("/after"), nresp: 2},

		// Framing and heads of a sandbox's answers.
		{name: "ans.close-no-connection-field", raw: ans("close-noconn")},
		{name: "ans.close-no-connection-field-then-get", raw: ans("close-noconn") + get("/after"), nresp: 2},
		{name: "ans.http10-sized-then-get", raw: ans("http10-sized") + get("/after"), nresp: 2},
		{name: "ans.http10-keepalive-then-get", raw: ans("http10-keepalive") + get("/after"), nresp: 2},
		{name: "ans.http10-coded-keepalive-then-get", raw: ans("http10-coded-keepalive") + get("/after"), nresp: 2},
		{name: "ans.status-199", raw: ans("status-199"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.status-999", raw: ans("status-999")},
		{name: "ans.location-relative", raw: ans("location-relative")},
		{name: "ans.location-scheme-relative", raw: ans("location-scheme-relative")},
		{name: "ans.cookies-200", raw: ans("cookies-200")},
		{name: "ans.header-60k", raw: ans("header-60k")},
		{name: "ans.no-value", raw: ans("no-value")},
		{name: "ans.many-headers", raw: ans("many-headers")},
		{name: "ans.utf8-value", raw: ans("utf8-value")},
		{name: "ans.ctl-value", raw: ans("ctl-value"), expect: []exp{{"client[0].status", whyRespCtl}, {"client[0].from", whyRespCtl}}},
		{name: "ans.del-value", raw: ans("del-value"), expect: []exp{{"client[0].status", whyRespCtl}, {"client[0].from", whyRespCtl}}},
		{name: "ans.tchar-name", raw: ans("tchar-name")},
		{name: "ans.dot-name", raw: ans("dot-name")},
		{name: "ans.at-name", raw: ans("at-name"), expect: []exp{{"client[0].status", whyRespCtl}, {"client[0].from", whyRespCtl}}},
		{name: "ans.empty-name", raw: ans("empty-name")},
		{name: "ans.big-trailer", raw: ans("big-trailer")},
		{name: "ans.long-chunk-ext", raw: ans("long-chunk-ext"), expect: []exp{{"client[0].status", whyRespChunkExt}, {"client[0].from", whyRespChunkExt}}},
		{name: "ans.status-spaces", raw: ans("status-spaces")},
		{name: "ans.status-2digit", raw: ans("status-2digit"), expect: []exp{{"client[0].status", whyRespBadStatus}, {"client[0].from", whyRespBadStatus}}},
		{name: "ans.status-long-reason", raw: ans("status-http10-101-like")},
		{name: "ans.head-big-cl", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: big-cl-no-body"), "") + get("/after"), nresp: 2},
		{name: "ans.304-big-cl", raw: ans("big-cl-no-body") + get("/after"), nresp: 2},
		{name: "sse.empty-get", raw: get("/", "X-Lab-Answer: sse-empty", "Accept: text/event-stream") + get("/after"), nresp: 2},
		{name: "sse.head", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: sse-head", "Accept: text/event-stream"), "") + get("/after"), nresp: 2},
		{name: "sse.close-delimited-get", raw: get("/", "X-Lab-Answer: sse-close-delimited", "Accept: text/event-stream"), expect: []exp{{"client[0].headers", whySSEClose}, {"client.conn", whySSEClose}}},
		{name: "sse.close-delimited-post", raw: rq("POST /mcp HTTP/1.1", hs(H, "X-Lab-Answer: sse-close-delimited", "Accept: application/json, text/event-stream", "Content-Length: 2"), "{}")},
		{name: "sse.http10-get", raw: get("/", "X-Lab-Answer: sse-http10", "Accept: text/event-stream"), expect: []exp{{"client[0].headers", whySSEClose}, {"client.conn", whySSEClose}}},
		{name: "sse.204-get", raw: get("/", "X-Lab-Answer: sse-204", "Accept: text/event-stream") + get("/after"), nresp: 2},
		{name: "ans.te-twice", raw: ans("te-twice") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespTEDup}, {"client[0].from", whyRespTEDup}}},
		{name: "ans.te-chunked-chunked", raw: ans("te-chunked-chunked") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespTEDup}, {"client[0].from", whyRespTEDup}}},
		{name: "ans.te-empty-cl", raw: ans("te-empty-cl") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespTEDup}, {"client[0].from", whyRespTEDup}}},
		{name: "ans.te-space-chunked", raw: ans("te-space-chunked") + get("/after"), nresp: 2},
		{name: "ans.cl-space", raw: ans("cl-space") + get("/after"), nresp: 2},
		{name: "ans.cl-list", raw: ans("cl-list") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespBadCL}, {"client[0].from", whyRespBadCL}}},
		{name: "ans.reason-utf8", raw: ans("reason-utf8")},
		{name: "ans.reason-empty", raw: ans("reason-empty")},
		{name: "ans.reason-long", raw: ans("reason-long")},
		{name: "ans.many-103", raw: ans("many-103"), expect: []exp{{"client.err", whyInterim}, {"client.responses", whyInterim}, {"client.conn", whyInterim}}},
		{name: "ans.close-kept-open-then-get", raw: ans("sized-close-open") + get("/after"), nresp: 2},
		{name: "ans.close-kept-open-pause-get", raw: ans("sized-close-open") + pauseMarker + get("/after"), nresp: 2},
		{name: "ans.http10-sized-pause-get", raw: ans("http10-sized") + pauseMarker + get("/after"), nresp: 2},
		{name: "ans.head-cl-te", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: bodiless-cl-te"), "") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespCLTE}, {"client[0].from", whyRespCLTE}}},
		{name: "ans.304-cl-te", raw: ans("bodiless-cl-te") + get("/after"), nresp: 2, expect: []exp{{"client[0].status", whyRespCLTE}, {"client[0].from", whyRespCLTE}}},
		{name: "ans.cl-huge", raw: ans("cl-huge"), expect: []exp{{"client[0].status", whyRespBadCL}, {"client[0].from", whyRespBadCL}}},
		{name: "ans.cl-negative", raw: ans("cl-negative"), expect: []exp{{"client[0].status", whyRespBadCL}, {"client[0].from", whyRespBadCL}}},
		{name: "ans.chunk-overflow", raw: ans("chunk-overflow"), expect: []exp{{"client.err", whyRespChunkBad}, {"client.responses", whyRespChunkBad}, {"client.conn", whyRespChunkBad}}},
		{name: "ans.chunk-upper-hex", raw: ans("chunk-upper-hex")},
		{name: "ans.cookie-own-domain", raw: ans("cookie-own-domain"), expect: []exp{{"client[0].headers", whyCookieDom}}},
		{name: "ans.cookie-own-domain-host-port", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+":8080", "X-Lab-Answer: cookie-own-domain"), ""), expect: []exp{{"client[0].headers", whyCookieDom}}},
		{name: "ans.cookie-own-domain-host-upper", raw: rq("GET / HTTP/1.1", hs("Host: "+strings.ToUpper(env.host), "X-Lab-Answer: cookie-own-domain"), ""), expect: []exp{{"client[0].headers", whyCookieDom}}},
		{name: "ans.cookie-own-domain-host-dot", raw: rq("GET / HTTP/1.1", hs("Host: "+env.host+".", "X-Lab-Answer: cookie-own-domain"), ""), expect: []exp{{"client[0].headers", whyCookieDom}}},
		{name: "ans.x-accel-redirect", raw: ans("x-accel-redirect"), expect: []exp{{"client[0].", whyAccel}, {"client.conn", whyAccel}, {"sandbox.requests", whyAccel}}},
		{name: "ans.header-15k", raw: ans("header-15k")},
		{name: "ans.cookies-15k", raw: ans("cookies-15k")},
		{name: "sse.sized-large-get", raw: get("/", "X-Lab-Answer: sse-sized-large", "Accept: text/event-stream") + get("/after"), nresp: 2},
		{name: "sse.sized-large-http10", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: sse-sized-large", "Accept: text/event-stream"), ""), v10: true},
		{name: "sse.chunked-http10-client", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: sse-stream", "Accept: text/event-stream"), ""), v10: true},
		{name: "early.413-small", raw: rq("POST /up HTTP/1.1", hs(H, "X-Lab-Answer: early-413", "Content-Length: 5"), "hello"), expect: []exp{{"client[0].status", whyEarly}, {"client[0].from", whyEarly}, {"client.conn", whyEarly}, {"client[0].headers", whyEarly}}},
		// The client holds the body's last 200 KB back (a pause): sent
		// at once, the whole body could reach the sockets' buffers before
		// the sandbox's answer came, and CubeProxy kept the connection
		// open in some runs and closed it in others.
		{name: "early.413-large", raw: rq("POST /up HTTP/1.1", hs(H, "X-Lab-Answer: early-413", "Content-Length: 300000"), strings.Repeat("u", 100000)+pauseMarker+strings.Repeat("u", 200000)), expect: []exp{{"client[0].status", whyEarly}, {"client[0].from", whyEarly}, {"client.conn", whyEarly}, {"client[0].headers", whyEarly}}},
		{name: "early.413-chunked", raw: rq("POST /up HTTP/1.1", hs(H, "X-Lab-Answer: early-413", "Transfer-Encoding: chunked"), strings.Repeat("1000\r\n"+strings.Repeat("u", 4096)+"\r\n", 60)+"0\r\n\r\n"), expect: []exp{{"client[0].status", whyEarly}, {"client[0].from", whyEarly}, {"client.conn", whyEarly}, {"client[0].headers", whyEarly}, {"sandbox.requests", whyEarly}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "ans.407", raw: ans("407"), expect: []exp{{"client[0].headers", whyHopAnswer}}},
		{name: "ans.chunk-size-bws", raw: ans("chunk-size-bws")},
		{name: "ans.chunk-lf-only", raw: ans("chunk-lf-only"), expect: []exp{{"client[0].status", whyRespChunkLF}, {"client[0].from", whyRespChunkLF}}},

		// Conditional and range requests, gzip: the sandbox answers them.
		{name: "cond.if-none-match", raw: ans("etag", `If-None-Match: "v1"`)},
		{name: "cond.if-none-match-star", raw: ans("etag", `If-None-Match: *`)},
		{name: "cond.if-modified-since", raw: ans("etag", "If-Modified-Since: Tue, 01 Jan 2030 00:00:00 GMT")},
		{name: "cond.if-match-fails", raw: ans("etag", `If-Match: "v2"`)},
		{name: "cond.range", raw: ans("etag", "Range: bytes=0-4")},
		{name: "cond.range-multi", raw: ans("etag", "Range: bytes=0-1,3-4")},
		{name: "cond.range-unsatisfiable", raw: ans("etag", "Range: bytes=100-")},
		{name: "cond.range-206-by-sandbox", raw: ans("206", "Range: bytes=0-4")},
		{name: "gzip.json", raw: ans("json", "Accept-Encoding: gzip"), expect: []exp{{"client[0].headers", whyGzip}, {"client[0].body", whyGzip}, {"client[0].framing", whyGzip}}},
		{name: "gzip.json-not-accepted", raw: ans("json")},
		{name: "gzip.etag-text", raw: ans("etag", "Accept-Encoding: gzip, deflate, br"), expect: []exp{{"client[0].headers", whyGzip}, {"client[0].body", whyGzip}, {"client[0].framing", whyGzip}}},
		{name: "gzip.sse-get", raw: get("/", "X-Lab-Answer: sse-gzip-stream", "Accept: text/event-stream", "Accept-Encoding: gzip"), expect: []exp{{"client[0].headers", whyGzip + "; " + whySSEClose}, {"client[0].body", whyGzip}, {"client.conn", whySSEClose}}},
		{name: "gzip.sse-post", raw: rq("POST /mcp HTTP/1.1", hs(H, "X-Lab-Answer: sse-gzip-stream", "Accept: application/json, text/event-stream", "Accept-Encoding: gzip", "Content-Length: 2"), "{}"), expect: []exp{{"client[0].headers", whyGzip}, {"client[0].body", whyGzip}, {"client[0].framing", whyGzip}}},
		{name: "gzip.head", raw: rq("HEAD / HTTP/1.1", hs(H, "X-Lab-Answer: gzip-plain", "Accept-Encoding: gzip"), ""), expect: []exp{{"client[0].headers", whyGzip}}},
		{name: "gzip.http10", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: gzip-plain", "Accept-Encoding: gzip"), ""), v10: true},
		{name: "ans.http10-client-chunked", raw: rq("GET / HTTP/1.0", hs(H, "X-Lab-Answer: large-chunked"), ""), v10: true},

		// Connections.
		{name: "conn.pipelined-gets", raw: get("/one") + get("/two") + get("/three"), nresp: 3},
		{name: "conn.pipelined-mixed", raw: rq("POST /a HTTP/1.1", hs(H, "Content-Length: 5"), "hello") + rq("HEAD /b HTTP/1.1", hs(H), "") + get("/c"), nresp: 3},
		{name: "conn.pipelined-after-close", raw: get("/one", "Connection: close") + get("/two"), nresp: 2},
		{name: "conn.close", raw: get("/", "Connection: close")},
		{name: "conn.http10-close", raw: rq("GET / HTTP/1.0", hs(H), ""), v10: true},
		{name: "conn.http10-keepalive", raw: rq("GET / HTTP/1.0", hs(H, "Connection: keep-alive"), ""), v10: true},
		{name: "conn.http10-keepalive-unsized", raw: rq("GET / HTTP/1.0", hs(H, "Connection: keep-alive", "X-Lab-Answer: chunked"), ""), v10: true, expect: []exp{{"client[0].headers", whyTrailerHdr}}},
		{name: "conn.http10-keepalive-twice", raw: rq("GET /a HTTP/1.0", hs(H, "Connection: keep-alive"), "") + rq("GET /b HTTP/1.0", hs(H, "Connection: keep-alive"), ""), nresp: 2, v10: true},
		{name: "conn.http09", raw: "GET /\r\n", expect: []exp{{"client.err", whyHTTP09}, {"client.responses", whyHTTP09}, {"client.conn", whyHTTP09}}},
		{name: "conn.http2-version", raw: rq("GET / HTTP/2.0", hs(H), "")},
		{name: "conn.http12-version", raw: rq("GET / HTTP/1.2", hs(H), ""), expect: []exp{{"client[0].status", whyVersion}, {"client[0].from", whyVersion}, {"client.conn", whyVersion}, {"sandbox.requests", whyVersion}}},
		{name: "conn.leading-crlf", raw: "\r\n" + get("/")},
		{name: "conn.leading-crlf-many", raw: strings.Repeat("\r\n", 1000) + "\n\n" + get("/")},
		{name: "conn.leading-crlf-32k", raw: strings.Repeat("\r\n", 16500) + get("/"), expect: []exp{{"client.err", whyCRLFFill}, {"client.responses", whyCRLFFill}, {"client.conn", whyCRLFFill}, {"sandbox.requests", whyCRLFFill}}},
		// A bare CR is no empty line (RFC 9112 2.2: invalid); nginx skips it.
		{name: "conn.leading-bare-cr", raw: "\r\r\n" + get("/"), expect: []exp{{"client[0].status", whyStrictParse}, {"client[0].from", whyStrictParse}, {"client.conn", whyStrictParse}, {"sandbox.requests", whyStrictParse}}},
		{name: "conn.binary-greeting", raw: "\x00\x00\x00\x00", expect: []exp{{"client.err", whyNoLine}, {"client.responses", whyNoLine}, {"client.conn", whyNoLine}}},
		{name: "conn.crlf-between-requests", raw: get("/a") + "\r\n\r\n" + get("/b"), nresp: 2},
		{name: "conn.pipelined-close-delimited", raw: ans("close") + get("/two"), nresp: 2},
		{name: "conn.pipelined-error-first", raw: get("/../x") + get("/two"), nresp: 2, expect: []exp{{"client.err", whyKeptOpen}, {"client.responses", whyKeptOpen}, {"client.conn", whyKeptOpen}, {"sandbox.requests", whyKeptOpen}}},
		{name: "conn.pipelined-chunked-post", raw: rq("POST /a HTTP/1.1", hs(H, "Transfer-Encoding: chunked"), "5\r\nhello\r\n0\r\n\r\n") + get("/b"), nresp: 2, expect: []exp{{"sandbox[0].framing", whyChunkedBuf}, {"sandbox[0].headers", whyChunkedBuf}}},
		{name: "conn.pipelined-404-route", raw: rq("GET / HTTP/1.1", hs("Host: 1-lab.cube.test"), "") + get("/b"), nresp: 2, expect: []exp{{"client[0].status", whyRoute}}},
		{name: "conn.pipelined-many", raw: strings.Repeat(get("/p"), 20), nresp: 20},
		{name: "conn.http10-keepalive-post", raw: rq("POST /a HTTP/1.0", hs(H, "Connection: keep-alive", "Content-Length: 5"), "hello") + rq("GET /b HTTP/1.0", hs(H, "Connection: keep-alive"), ""), nresp: 2, v10: true},
		{name: "conn.http10-keepalive-head", raw: rq("HEAD /a HTTP/1.0", hs(H, "Connection: keep-alive"), "") + rq("GET /b HTTP/1.0", hs(H), ""), nresp: 2, v10: true},
		{name: "conn.http10-keepalive-close-delimited", raw: rq("GET /a HTTP/1.0", hs(H, "Connection: keep-alive", "X-Lab-Answer: close"), "") + rq("GET /b HTTP/1.0", hs(H), ""), nresp: 2, v10: true},
		{name: "conn.http10-keepalive-204", raw: rq("GET /a HTTP/1.0", hs(H, "Connection: keep-alive", "X-Lab-Answer: 204"), "") + rq("GET /b HTTP/1.0", hs(H), ""), nresp: 2, v10: true},
		{name: "conn.http11-then-http10", raw: get("/a") + rq("GET /b HTTP/1.0", hs(H), ""), nresp: 2},
		{name: "conn.keep-alive-upper", raw: rq("GET / HTTP/1.0", hs(H, "Connection: Keep-Alive"), ""), v10: true},
		{name: "conn.keep-alive-and-close", raw: get("/", "Connection: keep-alive, close") + get("/two"), nresp: 2},
		{name: "conn.pipelined-garbage", raw: rq("POST /a HTTP/1.1", hs(H, "Content-Length: 5"), "hello") + "garbage\r\n\r\n", nresp: 2},
		{name: "conn.method-long", raw: rq(strings.Repeat("M", 300)+" / HTTP/1.1", hs(H), ""), expect: []exp{{"sandbox[0].headers", whyCL0}, {"sandbox[0].framing", whyCL0}}},
	}
	return c
}

// repeated is n lines of one field name, each with its own value.
func repeated(name string, n int) []string {
	h := make([]string, n)
	for i := range h {
		h[i] = fmt.Sprintf("%s: %d", name, i)
	}
	return h
}

func manyHeaders(n int) []string {
	h := make([]string, n)
	for i := range h {
		h[i] = fmt.Sprintf("X-Many-%03d: %d", i, i)
	}
	return h
}

// repeatedLong is n header lines of size bytes each (X-L0: lll...).
func repeatedLong(n, size int) []string {
	h := make([]string, n)
	for i := range h {
		name := fmt.Sprintf("X-L%d: ", i)
		h[i] = name + strings.Repeat("l", size-len(name))
	}
	return h
}
