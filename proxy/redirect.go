package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
	"github.com/valyala/fasthttp"
)

// maxRedirectBody is the largest request body the redirect listener reads
// before redirecting: as much as fasthttp reads of one on the traffic
// listeners before the handler runs.
const maxRedirectBody = fasthttpPreRead

// redirectServer is the fasthttp server of the plain-HTTP listener when it
// redirects to HTTPS. Its Handler is set by ServeRedirect, which knows the
// HTTPS port; until then it has none.
func (s *Server) redirectServer(log fasthttpLogger) *fasthttp.Server {
	p, cfg := s.p, s.cfg
	return &fasthttp.Server{
		ExpectHandler: s.redirectExpect,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			// No Host: fasthttp resets the whole request when a chunked
			// body runs over, and there is no head left to build the
			// redirect from. Such an upload is a 413 (a client cannot
			// replay a streamed body to follow a redirect anyway), not
			// the 400 for an empty Host it was answered.
			if errors.Is(err, fasthttp.ErrBodyTooLarge) && s.redirect.Handler != nil && len(ctx.Request.Header.Host()) > 0 {
				// Only this listener's buffer is too small for the body:
				// HTTPS streams it, so the client is sent there like any
				// other, not told its upload is too large. The body is
				// left unread, hence the close. Under a write deadline of
				// its own, as requestFailed's answers: fasthttp writes it
				// under the one the previous answer left, passed for a
				// client back after client.write_timeout.
				renewWriteDeadline(ctx, p.clientWriteTimeout)
				s.answerRedirect(ctx, true)
				ctx.SetConnectionClose()
				p.lingerRefused(ctx, err)
				return
			}
			// Counted and logged as on the traffic listener: a browser
			// whose cookies outgrow the head limit must show up here too.
			p.requestFailed(ctx, err, &s.redirectConns)
		},
		// The body is only discarded, as the other listeners take one
		// whatever its Content-Type: pre-parsed as a form, a
		// multipart/form-data body that was not one was answered with an
		// error in place of the redirect.
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		// The heads HTTPS takes: cookies for the domain come along.
		ReadBufferSize: cfg.MaxRequestHeaderSize,
		// The body is not needed, and fasthttp allocates a declared
		// Content-Length whole once the head is in (its default allows
		// 4 MiB): ~70-byte heads from any client held 4 MB each for the
		// read timeout. Above this, the ErrorHandler's redirect, unread.
		MaxRequestBodySize:    maxRedirectBody,
		Concurrency:           unlimitedConcurrency,
		ReadTimeout:           cfg.ClientReadTimeout,
		WriteTimeout:          cfg.ClientWriteTimeout,
		IdleTimeout:           cfg.ClientIdleTimeout,
		CloseOnShutdown:       true,
		Logger:                log,
		SecureErrorLogMessage: true,
		// Counted against client.max_conns like the traffic listeners'
		// (admitted by retryListener), and so in the open connections
		// gauge, which shows how close the proxy runs to that limit. Only
		// redirectExpect hijacks, and counts its connection's close.
		// Its connections are held (heldConns) until fasthttp lets go.
		// With the access log on, each request's first byte is recorded,
		// as on the traffic listeners: without it a first request whose
		// body stalled or was cut looked like a connection that sent
		// nothing, and went unlogged, and request_time started at the
		// handler. Off, no lock is taken for it.
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			logged := p.cfg.AccessLog != nil
			switch st {
			case fasthttp.StateNew:
				p.held.add(c)
				if logged {
					s.redirectConns.add(c)
				}
				p.metrics.ConnOpened()
				if p.waiting != nil {
					p.waiting.push(c)
				}
			case fasthttp.StateActive:
				if p.waiting != nil {
					p.waiting.remove(c)
				}
				if logged {
					s.redirectConns.requestBegan(c, time.Now())
				}
			case fasthttp.StateIdle:
				if p.waiting != nil {
					p.waiting.push(c)
				}
			case fasthttp.StateClosed:
				p.held.remove(c)
				if logged {
					s.redirectConns.remove(c)
				}
				p.connClosed(c)
				if abandon, ok := p.hijacks.LoadAndDelete(c); ok {
					abandon.(func())() // redirectExpect's hijack, skipped
				}
			case fasthttp.StateHijacked:
				p.held.remove(c)
				if logged {
					s.redirectConns.remove(c)
				}
				p.connHijacked(c)
			}
		},
	}
}

// answerRedirect answers a request on the redirect listener; early: before
// fasthttp numbered it (its ErrorHandler, ExpectHandler).
func (s *Server) answerRedirect(ctx *fasthttp.RequestCtx, early bool) {
	// Logged and counted like every other request (as answered by the
	// proxy itself), under the id the client gets, so that an operator
	// sees clients still arriving over plain HTTP.
	// The Host the HTTPS listener routes by (settleHost): the client's
	// line, not an absolute-form target's authority, and for an HTTP/1.0
	// request without one, its target's host. Before begin, which takes
	// the host the access log shows, as the traffic listeners' handle
	// does: the line named the target's host, not the one redirected to.
	settleHost(&ctx.Request.Header)
	var x exchange
	s.p.begin(ctx, &x, &s.redirectConns)
	x.kind = telemetry.RouteError
	// This server reads a body whole before the handler (no
	// StreamRequestBody): begin's estimate is that of the streaming
	// listeners, at most 8 KiB, and 0 for a chunked body.
	x.bytesIn = int64(len(ctx.Request.Body()))
	x.early = early
	host := ctx.Request.Header.Host()
	// Counted here, off the traffic listeners' hot path, as serve counts
	// them there.
	lines := scanHead(&ctx.Request.Header).lines
	manyLines := lines > maxHeaderLines
	if e := refusedRequestLine(&ctx.Request.Header); e != nil {
		// As on HTTPS (serve): a CONNECT's authority-form target made a
		// Location of "/", and a client on HTTP/9.9 came back only to be
		// refused.
		x.fail(ctx, *e, nil)
		if e == &errBadVersion {
			ctx.SetConnectionClose()
		}
	} else if e := refusedTarget(ctx.Request.Header.RequestURI()); e != nil {
		// Refused here as on HTTPS (serve), as nginx refuses it on any
		// server: redirected, it came back only to be refused there.
		x.fail(ctx, *e, nil)
	} else if manyLines {
		x.fail(ctx, errManyLines, nil)
	} else if len(host) == 0 {
		// HTTP/1.0 in origin form without Host, or with an empty one:
		// "https://:8443/x" names no server.
		x.fail(ctx, proxyError{status: 400, code: routing.CodeInvalidHost, msg: "empty host"}, nil)
	} else if !redirectableHost(host) {
		x.fail(ctx, proxyError{status: 400, code: routing.CodeInvalidHost, msg: "invalid host"}, nil)
	} else if id := s.p.redirectedChallenge(&ctx.Request.Header); id != nil {
		// Refused here, not redirected: a CA follows the 308 to HTTPS,
		// where the refusal would come after this answer told it where
		// to go (errACMEChallenge).
		x.fail(ctx, errACMEChallenge, id)
	} else {
		// Set as is, not through ctx.Redirect: that resolves the target
		// through fasthttp's URI, which normalises the path (a%2Fb
		// becomes a/b, dot segments go), while HTTPS forwards it
		// unnormalised.
		uri := ctx.Request.Header.RequestURI()
		ctx.Response.Header.Set(fasthttp.HeaderLocation,
			"https://"+httpsAuthority(string(host), s.redirectPort)+redirectTarget(uri))
		ctx.SetStatusCode(fasthttp.StatusPermanentRedirect)
		// A signed link keeps its token in the Location, or HTTPS would
		// get no credential; a browser may cache a 308, and with it the
		// token, as it must not the 302 that trades it for a cookie.
		if _, query, ok := bytes.Cut(uri, []byte{'?'}); ok && auth.HasQueryParam(query, auth.QueryParamName) {
			ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-store")
		}
	}
	// After the answer is written (an error answer resets the headers),
	// before it is logged.
	id := s.p.requestID(&ctx.Request.Header, nil)
	ctx.Response.Header.SetBytesV(HeaderRequestID, id)
	setRetcode(&ctx.Response.Header, false)
	x.noteRequestID(id)
	s.p.headersReady(ctx, &x)
	s.p.finish(ctx, &x, ctx.Response.StatusCode(), nil, nil)
	letGoOfHead(ctx, lines) // nothing after this reads the head
}

// redirectedChallenge is the sandbox id named by the host of an HTTP-01
// challenge request on the redirect listener (acmeChallengeFor), or nil.
func (p *Proxy) redirectedChallenge(h *fasthttp.RequestHeader) []byte {
	var t routing.Target
	if !acmeChallengeFor(h, &t) {
		return nil // the path, first: t is not parsed yet
	}
	if p.parser.ParseRequest(&t, h.Host(), h.RequestURI(), h) != nil || !acmeChallengeFor(h, &t) {
		return nil // the HTTPS listener refuses the request, or routes it by path
	}
	return t.ID()
}

// redirectExpect answers the head of an "Expect: 100-continue" upload on
// the redirect listener: the redirect needs nothing of the body, which the
// client then sends only once, over HTTPS, and never in clear text. The
// answer lingers as the traffic listeners' refusals do, for a client that
// sends its body without waiting for the 100.
func (s *Server) redirectExpect(ctx *fasthttp.RequestCtx) int {
	if s.redirect.Handler == nil {
		return fasthttp.StatusContinue
	}
	s.answerRedirect(ctx, true)
	raw := ctx.Conn()
	// Counted lingering from here, as lingerBody counts a refusal's:
	// fasthttp counts the connection out before the hijack handler runs.
	// When it skips that handler, ConnState's StateClosed abandons it.
	s.p.lingering.Add(1)
	s.p.hijack(ctx, func(c net.Conn) {
		defer s.p.lingering.Add(-1)
		// A hijacked connection is no StateClosed for this server's
		// ConnState: its place under client.max_conns is given back here.
		defer s.p.clientConnClosed()
		if s.p.beforeRefusalLingers != nil {
			s.p.beforeRefusalLingers()
		}
		ctx.Response.Header.SetConnectionClose()
		s.p.answerCounted(raw, c, &ctx.Response)
	}, func() { s.p.lingering.Add(-1) })
	return ctx.Response.StatusCode()
}

// ServeRedirect answers plain HTTP on ln with 308 redirects to the same
// URL over HTTPS on httpsPort ("" or "443" = default port). It is opt-in:
// some SDK clients only speak plain HTTP, so the default is to proxy.
func (s *Server) ServeRedirect(ln net.Listener, httpsPort string) error {
	if httpsPort == "443" {
		httpsPort = ""
	}
	if !s.admit(ln, false) {
		return nil
	}
	s.redirectPort = httpsPort
	s.redirect.Handler = func(ctx *fasthttp.RequestCtx) { s.answerRedirect(ctx, false) }
	if err := s.redirect.Serve(s.limited(ln)); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve redirect %s: %w", ln.Addr(), err)
	}
	return nil
}

// redirectableHost reports whether host can be pasted into a URL as its
// authority without changing which server it names: a name (not a port
// alone), no userinfo, path,
// query, fragment, backslash (browsers read it as a slash) or control byte,
// and brackets only around an IPv6 address. httpsAuthority takes brackets
// off to put the port back, so "[evil.test]" would name evil.test, and
// fasthttp refuses such a Host only when the request target is no
// absolute-form URL ("GET http://a.test/p" with "Host: [evil.test]").
func redirectableHost(host []byte) bool {
	if len(host) > 0 && host[0] == ':' {
		// A port alone (":80") names no server: the Location would be
		// "https://:8443/", and HTTPS answers such a Host 400 too.
		return false
	}
	for _, c := range host {
		switch {
		case c <= ' ' || c == 0x7f, c == '@', c == '/', c == '\\', c == '?', c == '#':
			return false
		}
	}
	if len(host) > 0 && host[0] == '[' {
		end := bytes.IndexByte(host, ']')
		if end < 0 {
			return false
		}
		ip, err := netip.ParseAddr(string(host[1:end]))
		if err != nil || !ip.Is6() {
			return false
		}
		host = host[end+1:]
		if len(host) > 0 && host[0] != ':' {
			return false
		}
	}
	return !bytes.ContainsAny(host, "[]")
}

// redirectTarget is the path and query of a request target as the client
// wrote it: an absolute-form target ("http://host/p?q") loses its scheme and
// authority, and a target without a path ("*", "host:port") becomes "/".
func redirectTarget(uri []byte) string {
	if len(uri) > 0 && uri[0] == '/' {
		return string(uri)
	}
	_, rest, ok := strings.Cut(string(uri), "://")
	if !ok {
		return "/"
	}
	i := strings.IndexAny(rest, "/?")
	if i < 0 {
		return "/"
	}
	if rest[i] == '?' {
		return "/" + rest[i:]
	}
	return rest[i:]
}

// httpsAuthority is the Host of a plain-HTTP request moved to the HTTPS
// port ("" = default). An IPv6 literal keeps its brackets, with or without
// a port: "2001:db8::1:8443" would not be a URL.
func httpsAuthority(host, port string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if port != "" {
		return net.JoinHostPort(host, port)
	}
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}
