package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// AdminConfig wires the admin API.
type AdminConfig struct {
	// Token is required in X-Cube-Admin-Token on every admin request. When
	// empty, the admin API answers loopback clients only (and cmd refuses
	// to bind it to a non-loopback address).
	Token string
	// Routes is the editable store behind /admin/routes and
	// /admin/meta/upsert; nil when routes live in Redis.
	Routes *routing.MemoryStore
	// Publish, when set, tells other proxy instances to drop a cached
	// route (Redis pub/sub); local invalidation happens regardless.
	Publish func(id string) error
	// Metrics, when set, is served at GET /metrics.
	Metrics http.Handler
	// MetricsLoopback serves /metrics without the token to loopback
	// clients (a local scraping agent).
	MetricsLoopback bool
	// Ready, when set, reports whether the store has been reachable
	// (GET /readyz); draining is checked by the server itself.
	Ready func() error
	// CertificatesReady, when set, reports whether the HTTPS listener has
	// its default certificate (GET /readyz's certificate_pending).
	CertificatesReady func() error
	// Signer issues signed browser tokens (POST /admin/tokens); nil = off.
	Signer *auth.Signer
	// Heartbeat, when set, returns the unix ms of the registry's last
	// heartbeat written (0: none yet), which GET /admin/healthz reports as
	// heartbeat_last_pushed_ms, as the platform's proxy does.
	Heartbeat func() int64
	// Pprof serves Go's runtime profiles at /debug/pprof/ (admin_pprof),
	// behind the same credential as the rest of the admin API.
	Pprof bool
}

// Admin is the admin API. It never shares a listener with sandbox traffic.
type Admin struct {
	cfg      AdminConfig
	p        *Proxy
	draining *atomic.Bool
	// sharedPorts: the server's listeners share their ports with another
	// process (reuse_port), which serves the admin API once this one
	// drains (see handedOver).
	sharedPorts bool
	metrics     fasthttp.RequestHandler
	started     time.Time
	// locks orders the changes of one sandbox (see sandboxLocks).
	locks sandboxLocks
	// afterStoreChange, for tests, runs between a change's route store
	// step and its sandbox state step (meta/delete: its kill, then the
	// store step), with the sandbox's lock held; nil in production.
	afterStoreChange func(id string)
}

// NewAdmin returns the admin API for p.
func NewAdmin(cfg AdminConfig, p *Proxy) *Admin {
	a := &Admin{cfg: cfg, p: p, started: time.Now(), draining: new(atomic.Bool)}
	if cfg.Metrics != nil {
		a.metrics = fasthttpadaptor.NewFastHTTPHandler(cfg.Metrics)
	}
	return a
}

// CheckAdminAddr refuses an admin listener on a non-loopback address
// without a token: an open admin API could re-route every sandbox.
func CheckAdminAddr(addr, token string) error {
	// Checked with a token too: net.Listen takes "" (or a bare host) as
	// every interface on a random port.
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin_addr %q: %w", addr, err)
	}
	if token != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("admin_addr %q is not loopback and no admin token is configured: set admin_token (CUBEPROXY_ADMIN_TOKEN) or bind the admin API to 127.0.0.1", addr)
	}
	return nil
}

// Handler serves the admin API.
func (a *Admin) Handler(ctx *fasthttp.RequestCtx) { a.serve(ctx, false) }

// metricsHandler serves the metrics listener (metrics_addr): the scrape
// alone (serveMetricsOnly), after the admin API's checks of the head.
func (a *Admin) metricsHandler(ctx *fasthttp.RequestCtx) { a.serve(ctx, true) }

// serve answers a request of the admin listener, or of the metrics
// listener when metricsOnly.
func (a *Admin) serve(ctx *fasthttp.RequestCtx, metricsOnly bool) {
	// The traffic listener's refusals of a version fasthttp accepts but
	// cannot have been sent, and of a coding it frames otherwise than a
	// front proxy may ("Transfer-Encoding: identity" beside a length): the
	// admin API is as often behind a gateway, and took both.
	h := &ctx.Request.Header
	seen := scanHead(h)
	// As on the traffic listeners; this listener's connections are not
	// even counted under client.max_conns.
	defer letGoOfHead(ctx, seen.lines)
	if !h.IsHTTP11() && string(h.Protocol()) != "HTTP/1.0" {
		writeError(ctx, errBadVersion, nil)
		ctx.SetConnectionClose()
		return
	}
	if seen.lines > maxHeaderLines {
		writeError(ctx, errManyLines, nil)
		return
	}
	if h.ContentLength() != -1 && seen.transferEncoding {
		writeError(ctx, proxyError{status: 400, code: CodeBadRequest, msg: "Transfer-Encoding other than chunked"}, nil)
		ctx.SetConnectionClose()
		return
	}
	// The Host line, not an absolute-form target's host (which fasthttp
	// copies over it), is what a browser fills with the page's host name,
	// which localClient judges.
	settleHost(&ctx.Request.Header)
	path := string(ctx.Path())
	if metricsOnly {
		a.serveMetricsOnly(ctx, path)
		return
	}
	if path == "/readyz" || path == "/admin/healthz" {
		// Health answers without a token: load balancers probe it.
		if !ctx.IsGet() && !ctx.IsHead() {
			methodNotAllowed(ctx, path, "GET, HEAD")
			return
		}
		if path == "/readyz" {
			a.readyz(ctx)
		} else {
			a.healthz(ctx)
		}
		return
	}
	if path == "/metrics" && a.metrics != nil && a.cfg.MetricsLoopback && (ctx.IsGet() || ctx.IsHead()) && localClient(ctx) {
		a.metrics(ctx)
		return
	}
	if !a.authorized(ctx) {
		a.p.metrics.AuthRejected(telemetry.AuthAdmin)
		if a.cfg.Token == "" {
			adminError(ctx, 403, "no admin token is configured: only local clients without Origin, addressing the admin API by IP, localhost or a *.localhost name, are served")
			return
		}
		adminError(ctx, 403, "admin token missing or wrong")
		return
	}
	method := string(ctx.Method())
	if method == "HEAD" {
		method = "GET" // fasthttp leaves the body out
	}
	if method != "GET" && a.handedOver() && changesState(path) {
		// The next process never sees this one's table or sandbox
		// states: a change made here would be answered 200 and lost.
		// Closed, so that the client's retry opens a connection, which
		// the next process takes.
		ctx.SetConnectionClose()
		ctx.Response.Header.Set("Retry-After", "1")
		writeJSON(ctx, 503, map[string]string{"error": "this instance is draining and its successor (reuse_port) serves the admin API: send the change again", "code": CodeDraining})
		return
	}
	switch {
	case path == "/metrics" && a.metrics != nil && method == "GET":
		a.metrics(ctx)
	case path == "/admin/routes" && method == "GET":
		a.listRoutes(ctx)
	case strings.HasPrefix(path, "/admin/routes/"):
		a.route(ctx, method, strings.TrimPrefix(path, "/admin/routes/"))
	case path == "/admin/backend_cache/delete" && method == "POST":
		a.cacheDelete(ctx)
	case path == "/admin/meta/upsert" && method == "POST":
		a.metaUpsert(ctx)
	case path == "/admin/meta/delete" && method == "POST":
		a.metaDelete(ctx)
	case path == "/admin/state" && method == "POST":
		a.setState(ctx)
	case path == "/admin/last_active" && method == "GET":
		a.lastActive(ctx)
	case path == "/admin/tokens" && method == "POST":
		a.signToken(ctx)
	case pprofPath(path):
		a.pprof(ctx, method, path)
	default:
		allow := adminAllow(path)
		if path == "/metrics" && a.metrics != nil {
			allow = "GET, HEAD"
		}
		if allow != "" {
			// The endpoint exists: a 404 would tell a caller using the
			// wrong method that this proxy lacks it.
			methodNotAllowed(ctx, path, allow)
			return
		}
		adminError(ctx, 404, "no such admin endpoint: "+string(ctx.Method())+" "+path)
	}
}

// CodeDraining is the code of an admin change refused by an instance
// whose successor (reuse_port) serves the admin API: sent again, it
// reaches the successor.
const CodeDraining = "draining"

// handedOver reports whether the admin API is now the next process's: the
// listeners share their ports (reuse_port) and this one is draining.
func (a *Admin) handedOver() bool { return a.sharedPorts && a.draining.Load() }

// changesState reports whether a request to path other than a GET changes
// the route table or a sandbox's state (POST /admin/tokens signs a token,
// which any instance may).
func changesState(path string) bool {
	switch path {
	case "/admin/backend_cache/delete", "/admin/meta/upsert", "/admin/meta/delete", "/admin/state":
		return true
	}
	return strings.HasPrefix(path, "/admin/routes/")
}

// methodNotAllowed answers a request to an admin endpoint that exists
// with a method it does not take: 405 with the methods it does, which a
// 404 would hide.
func methodNotAllowed(ctx *fasthttp.RequestCtx, path, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	adminError(ctx, 405, "method not allowed: "+path+" takes "+allow)
}

// adminAllow returns the methods a fixed admin path answers, for the Allow
// header of a 405, or "" when path is no admin endpoint.
func adminAllow(path string) string {
	switch path {
	case "/admin/routes", "/admin/last_active":
		return "GET, HEAD"
	case "/admin/backend_cache/delete", "/admin/meta/upsert", "/admin/meta/delete", "/admin/state", "/admin/tokens":
		return "POST"
	}
	return ""
}

// maxAdminBody is the largest admin request body.
const maxAdminBody = 1 << 20

// maxTokenlessAdminBody is the largest body read from a caller that
// presents no valid admin token when one is configured: none of the
// endpoints it may call (health, readiness, a loopback scrape) reads a
// body, and fasthttp allocates a declared Content-Length whole as soon as
// the head has come, so the 1 MiB of an admin body let a host without the
// token hold 1 MiB per ~100-byte head for the read timeout, on a listener
// whose connections are not capped.
const maxTokenlessAdminBody = 8 << 10

// tokenPresented reports whether a request head carries the configured
// admin token, or no token is configured (the listener is then loopback
// only, and its local callers are trusted with the full body limit).
func (a *Admin) tokenPresented(h *fasthttp.RequestHeader) bool {
	return a.cfg.Token == "" || auth.AdminAuthorized([]byte(a.cfg.Token), h.Peek(auth.HeaderAdminToken))
}

// expect judges the head of an "Expect: 100-continue" request before the
// client is asked for its body, as nginx and the traffic listener (Proxy.
// Expect) do: a declared body over the limit is answered 413 and a caller
// without the credential its 403 (or whatever the handler answers it
// without a body), with the lingering close of the other refusals; else
// 100, and the request runs as usual once its body has come. Answering
// 100 to every head had the client send a body only to have it refused.
func (a *Admin) expect(ctx *fasthttp.RequestCtx) int {
	limit := maxAdminBody
	if !a.tokenPresented(&ctx.Request.Header) {
		limit = maxTokenlessAdminBody
	}
	return a.judgeExpect(ctx, limit, a.authorized, a.Handler)
}

// metricsExpect is expect for the metrics listener: the scrape alone is
// asked for its body (of at most the tokenless limit); anything else is
// answered from its head as its request would be, whatever token it
// carries or whoever sends it.
func (a *Admin) metricsExpect(ctx *fasthttp.RequestCtx) int {
	return a.judgeExpect(ctx, maxTokenlessAdminBody, a.servesScrape, a.metricsHandler)
}

// servesScrape reports whether the metrics listener answers ctx with the
// scrape.
func (a *Admin) servesScrape(ctx *fasthttp.RequestCtx) bool {
	return a.metrics != nil && string(ctx.Path()) == "/metrics" && (ctx.IsGet() || ctx.IsHead())
}

// judgeExpect answers an Expect head: 100 when its declared body is within
// limit and admitted lets it through; else the 413, or what handler
// answers it without a body, with a lingering close. The 100 goes out
// under a renewed write deadline (sendContinue), as on the traffic
// listener: fasthttp writes it under the one the connection's previous
// answer left, and on a keep-alive connection idle longer than the write
// timeout (30 s, where its idle timeout is 90 s) the write failed and the
// connection closed unanswered.
func (a *Admin) judgeExpect(ctx *fasthttp.RequestCtx, limit int, admitted func(*fasthttp.RequestCtx) bool, handler fasthttp.RequestHandler) int {
	h := &ctx.Request.Header
	// The Host line, as serve judges the request: an absolute-form
	// target's host, which fasthttp copies over it, had a local tool's
	// head run without its body, and a browser page's head get the 100.
	settleHost(h)
	if frameless(h) {
		return sendContinue(ctx, adminWriteTimeout)
	}
	switch {
	case h.ContentLength() > limit:
		writeError(ctx, refusedByParser(fasthttp.ErrBodyTooLarge), nil)
	case !admitted(ctx):
		handler(ctx)
	default:
		return sendContinue(ctx, adminWriteTimeout)
	}
	// fasthttp closes the connection after any answer but 100: a client
	// that sent its body without waiting would get a reset, not this.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		ctx.Response.Header.SetConnectionClose()
		a.p.answerLingering(c, c, &ctx.Response)
	})
	return ctx.Response.StatusCode()
}

func (a *Admin) authorized(ctx *fasthttp.RequestCtx) bool {
	if a.cfg.Token == "" {
		return localClient(ctx)
	}
	return auth.AdminAuthorized([]byte(a.cfg.Token), ctx.Request.Header.Peek(auth.HeaderAdminToken))
}

// localClient reports whether a caller without the admin token counts as
// a tool on this host (the tokenless admin API, metrics_loopback_open).
// Being on this host is the credential, and a web page in a browser on
// this host is a loopback client too: it may POST here without a
// preflight (CSRF), or read answers through DNS rebinding. Browsers send
// Origin on such writes and the page's host name in Host; admin tools
// and scrapers send no Origin and address a loopback listener by IP or
// localhost.
func localClient(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if !remoteIP(ctx).IsLoopback() || !localHost(h.Host()) {
		return false
	}
	// Every line: an empty one ahead of a page's would hide it from Peek.
	for _, o := range h.PeekAll("Origin") {
		if len(o) > 0 {
			return false
		}
	}
	return true
}

// localHost reports whether a Host header names this host in a way no DNS
// answer can redirect: an IP literal, localhost or a *.localhost name.
func localHost(host []byte) bool {
	name := string(host)
	if h, port, err := net.SplitHostPort(name); err == nil {
		// A port that is no number ("10.0.0.0:@") makes the whole Host
		// no name at all, as net/http and browsers read it; not the
		// address before the colon.
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"), "."))
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

func (a *Admin) healthz(ctx *fasthttp.RequestCtx) {
	streams, tunnels := a.p.streams.open()
	answer := map[string]any{
		"ok":          true,
		"status":      "ok",
		"instance_id": a.p.cfg.InstanceID,
		"uptime_s":    int64(time.Since(a.started).Seconds()),
		"draining":    a.draining.Load(),
		"streams":     streams,
		"websockets":  tunnels,
	}
	// Absent, as on the platform's proxy, while no heartbeat was written
	// (the registry off, or Redis not reached yet).
	if a.cfg.Heartbeat != nil {
		if ms := a.cfg.Heartbeat(); ms > 0 {
			answer["heartbeat_last_pushed_ms"] = ms
		}
	}
	writeJSON(ctx, 200, answer)
}

// The reasons GET /readyz gives for a 503.
const (
	// ReadyDraining: the proxy is draining.
	ReadyDraining = "draining"
	// ReadyStoreUnreachable: no route read from the store has been
	// answered yet (AdminConfig.Ready failed).
	ReadyStoreUnreachable = "store_unreachable"
	// ReadyCertificatePending: the HTTPS listener's default certificate
	// has not been obtained yet (acme without sync), so its handshakes
	// fail (AdminConfig.CertificatesReady failed).
	ReadyCertificatePending = "certificate_pending"
)

// readyz answers the readiness probe, which needs no credential. Its
// reason is a code; the store's error text (Redis addresses, the ACL user,
// what Redis said) goes in "detail" only to a caller the rest of the admin
// API serves: with a token configured and the admin listener on a shared
// network, any host that reaches the port (or a sandbox, where the network
// lets one) would read it otherwise. The log has it regardless (cmd logs
// each new reason).
func (a *Admin) readyz(ctx *fasthttp.RequestCtx) {
	if a.draining.Load() {
		writeJSON(ctx, 503, map[string]any{"ready": false, "reason": ReadyDraining})
		return
	}
	for _, c := range []struct {
		check  func() error
		reason string
	}{
		{a.cfg.Ready, ReadyStoreUnreachable},
		{a.cfg.CertificatesReady, ReadyCertificatePending},
	} {
		if c.check == nil {
			continue
		}
		if err := c.check(); err != nil {
			out := map[string]any{"ready": false, "reason": c.reason}
			if a.authorized(ctx) {
				out["detail"] = err.Error()
			}
			writeJSON(ctx, 503, out)
			return
		}
	}
	writeJSON(ctx, 200, map[string]any{"ready": true})
}

// listRoutes answers every route, or one page of them in id order:
// ?after=<id> starts past that id (a route's or not), ?limit=N stops at N
// routes and names the last one in "next" while more remain. A table of
// 100k routes is ≈ 25 MB of JSON in one answer otherwise.
func (a *Admin) listRoutes(ctx *fasthttp.RequestCtx) {
	if a.cfg.Routes == nil {
		adminError(ctx, 404, "routes are managed by the control plane in Redis; the route API needs store: memory")
		return
	}
	q := ctx.QueryArgs()
	if twice := givenTwice(q, "limit", "after"); twice != "" {
		adminError(ctx, 400, twice)
		return
	}
	limit := 0
	if q.Has("limit") {
		n, err := strconv.Atoi(string(q.Peek("limit")))
		if errors.Is(err, strconv.ErrRange) && n > 0 {
			err = nil // too large for an int, still a positive number: n is the largest int
		}
		if err != nil || n < 1 {
			adminError(ctx, 400, "limit must be a positive number of routes")
			return
		}
		limit = n
	}
	after := string(q.Peek("after"))
	if q.Has("after") && !routing.ValidID(after) {
		adminError(ctx, 400, "after must be a sandbox id: "+routing.IDForm)
		return
	}
	routes, more := a.cfg.Routes.Page(after, limit)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetStatusCode(200)
	ctx.Response.SetBodyRaw(appendRoutes(nil, routes, more))
}

// appendRoutes appends listRoutes' answer, the JSON encoding/json makes
// of {"count","next","routes":{id:fields}} (keys sorted, one line),
// written directly: through a map of every route and encoding/json, one
// listing of 100k routes (12 MB) took ≈ 150 MB of the proxy's memory, and
// a few at once carried a proxy of 80 MB to 670 MB. routes are sorted by
// id.
func appendRoutes(b []byte, routes []*routing.Route, more bool) []byte {
	b = slices.Grow(b, 64+160*len(routes)) // ≈ 120 bytes a route with two ports
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(len(routes)), 10)
	if more {
		b = append(b, `,"next":`...)
		b = appendJSONString(b, routes[len(routes)-1].ID)
	}
	b = append(b, `,"routes":{`...)
	var keys []string
	for i, r := range routes {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, r.ID)
		b = append(b, `:{`...)
		// Fields is the one mapping of a route to its fields; its keys
		// in encoding/json's order (ports are sorted as strings too).
		fields := r.Fields()
		keys = keys[:0]
		for k := range fields {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for j, k := range keys {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, fields[k])
		}
		b = append(b, '}')
	}
	return append(b, "}}\n"...)
}

// givenTwice names the first of names that q holds more than once, in the
// 400's message, or returns "". Which copy counts is a reader's choice
// (fasthttp's Peek takes the first, other libraries the last), as for a
// body member given twice (decodeObject).
func givenTwice(q *fasthttp.Args, names ...string) string {
	for _, name := range names {
		if len(q.PeekMulti(name)) > 1 {
			return "query parameter " + name + " given twice"
		}
	}
	return ""
}

func (a *Admin) route(ctx *fasthttp.RequestCtx, method, id string) {
	if a.cfg.Routes == nil {
		adminError(ctx, 404, "routes are managed by the control plane in Redis; the route API needs store: memory")
		return
	}
	switch method {
	case "GET", "PUT", "DELETE":
	default:
		// Before the id is judged: a 400 for the id sent a caller using
		// the wrong method to fix an id that was never the problem.
		ctx.Response.Header.Set("Allow", "GET, HEAD, PUT, DELETE")
		adminError(ctx, 405, "method not allowed: /admin/routes/"+id+" takes GET, HEAD, PUT, DELETE")
		return
	}
	if !routing.ValidID(id) {
		adminError(ctx, 400, "invalid sandbox id: "+routing.IDForm)
		return
	}
	switch method {
	case "GET":
		r, ok := a.cfg.Routes.Get(id)
		if !ok {
			adminError(ctx, 404, "no route for sandbox "+id)
			return
		}
		writeJSON(ctx, 200, r.Fields())
	case "PUT":
		raw, err := decodeObject(ctx.PostBody())
		if err != nil {
			adminError(ctx, 400, "body must be a JSON object of string fields: "+err.Error())
			return
		}
		fields := make(map[string]string, len(raw))
		for _, k := range memberNames(raw) {
			s, ok := raw[k].(string)
			if !ok {
				adminError(ctx, 400, "field "+k+" must be a string")
				return
			}
			fields[k] = s
		}
		if a.putRoute(ctx, id, fields) {
			writeJSON(ctx, 200, map[string]any{"ok": true, "sandbox_id": id})
		}
	case "DELETE":
		defer a.locks.lock(id)()
		deleted, err := a.cfg.Routes.Remove(id)
		a.storeChanged(id)
		_, perr := a.invalidate(id)
		a.p.closeUnrouted(id, nil)
		if deleted {
			// The sandbox is gone: what this instance knew of it goes too.
			// A paused one was otherwise remembered for ever (the sweep
			// forgets only idle running sandboxes and old kills), one entry
			// per sandbox ever paused, however many come and go.
			// No state is newer than this delete: a change racing it
			// may land on either side (changes of the route wait for it).
			a.p.sandboxes.forget(id, math.MaxInt64)
			a.audit(ctx, "route deleted", id)
		}
		if err != nil {
			a.notWritten(ctx, id, err)
			adminError(ctx, 500, deletedNotWritten(deleted, err))
			return
		}
		if perr != nil {
			notPublished(ctx, perr)
			return
		}
		writeJSON(ctx, 200, map[string]any{"ok": true, "deleted": deleted})
	}
}

// deletedNotWritten is the 500 of a delete whose routes file write
// failed. A route already gone from memory (a retry of a delete whose
// write failed) may still be in the file: the retry wrote it again, and
// failed again.
func deletedNotWritten(deleted bool, err error) string {
	if deleted {
		return "route deleted but routes file not written: " + err.Error()
	}
	return "no route to delete in memory, but the routes file (which may still hold it) not written: " + err.Error()
}

// putRoute validates and stores a route, answering 400 naming the bad
// field. It reports whether the route was stored.
func (a *Admin) putRoute(ctx *fasthttp.RequestCtx, id string, fields map[string]string) bool {
	r, err := routing.ParseRouteStrict(id, fields)
	if err != nil {
		adminError(ctx, 400, err.Error())
		return false
	}
	defer a.locks.lock(id)()
	// The body is the whole route, and AllowPublicTraffic left out is
	// public: a control plane that sends only the fields it changes (as it
	// would HSET them in Redis) turned a restricted sandbox public, its
	// token dropped. Refused unless said, or for a sandbox created again
	// under the id (a later CreatedAt), whose route is a new one.
	if _, said := fields[routing.FieldAllowPublicTraffic]; !said {
		if old, ok := a.cfg.Routes.Get(id); ok && !old.Public && r.CreatedAt <= old.CreatedAt {
			adminError(ctx, 400, "route field AllowPublicTraffic: left out, which is public, but the stored route of sandbox "+id+` is restricted; a body is the whole route: send "AllowPublicTraffic":"true" to make it public, or "false" with its TrafficAccessToken`)
			return false
		}
	}
	// A failed file write still leaves the new route live in memory, so
	// the cached old one is dropped either way.
	err = a.cfg.Routes.Put(r)
	a.storeChanged(id)
	_, perr := a.invalidate(id)
	a.p.closeUnrouted(id, r)
	a.liftKill(id)
	a.audit(ctx, "route stored", id)
	if err != nil {
		a.notWritten(ctx, id, err)
		adminError(ctx, 500, "route stored in memory, but "+err.Error())
		return false
	}
	if perr != nil {
		notPublished(ctx, perr)
		return false
	}
	return true
}

// storeChanged runs the test hook afterStoreChange, if set.
func (a *Admin) storeChanged(id string) {
	if a.afterStoreChange != nil {
		a.afterStoreChange(id)
	}
}

// liftKill forgets a meta/delete of id: a route stored again is a
// re-created sandbox, no longer killed.
func (a *Admin) liftKill(id string) { a.p.sandboxes.liftKill(id) }

// routeWritten answers meta/upsert when the routes live in Redis. The
// control plane has written the route there and calls upsert after, as
// with the platform's proxy: the fields are not kept here (Redis holds
// them), every instance drops its cached copy and reads the new one, and
// the sandbox is no longer killed on this instance.
func (a *Admin) routeWritten(ctx *fasthttp.RequestCtx, id string) {
	defer a.locks.lock(id)()
	_, perr := a.invalidate(id)
	a.liftKill(id)
	a.audit(ctx, "cached route dropped", id)
	if perr != nil {
		notPublished(ctx, perr)
		return
	}
	writeJSON(ctx, 200, map[string]any{"ok": true, "sandbox_id": id})
}

// invalidate drops id from this instance's cache and tells the others.
// An error means the others may not have been told, and may serve the old
// route until it expires: the caller answers 503 (notPublished) so that
// the control plane retries (the local drop stands).
func (a *Admin) invalidate(id string) (int, error) {
	n := a.p.cache.Invalidate(id)
	// What the sandbox has open here is judged against the new route (or
	// its absence) at once: with the memory store no invalidation comes
	// back to this instance, and with Redis only while it is subscribed.
	a.p.routeWritten(id, a.cfg.Routes == nil)
	if a.cfg.Publish != nil {
		if err := a.cfg.Publish(id); err != nil {
			a.p.cfg.Logger.Warn("publish cache invalidation", "sandbox_id", id, "err", err)
			// "May": a PUBLISH that timed out on a Redis that stalled
			// (a fork, SIGSTOP) is still run when it wakes up.
			return n, fmt.Errorf("done on this instance, but the invalidation may not have reached the other instances (publish failed); retry: %v", err)
		}
	}
	return n, nil
}

// CodeNotPublished is the "code" of the admin API's 503 for a change made
// on this instance whose invalidation could not be published to the
// others: the one 5xx a control plane should retry as it is.
const CodeNotPublished = "invalidation_not_published"

// notPublished answers the 503 of a failed invalidation publish, with a
// code a control plane can match (the message is for people) and
// Retry-After, as the traffic listener's 503s: the change is safe to send
// again, and Redis is likely back within a second or so.
func notPublished(ctx *fasthttp.RequestCtx, err error) {
	ctx.Response.Header.Set("Retry-After", "1")
	writeJSON(ctx, 503, map[string]string{"error": err.Error(), "code": CodeNotPublished})
}

// audit logs a change made through the admin API, whatever the answer
// (a 500 or 503 still leaves it in effect here): routes and sandbox
// states change nowhere else, so an operator asking why a sandbox answers
// 410 or 503, or goes elsewhere, finds when and from where.
func (a *Admin) audit(ctx *fasthttp.RequestCtx, change, id string, args ...any) {
	args = append([]any{"sandbox_id", id, "remote_addr", remoteIP(ctx).String()}, args...)
	a.p.cfg.Logger.Info("admin: "+change, args...)
}

// notWritten logs, at error level, a change whose routes file write
// failed (persist_routes: a full disk, a read-only file system): it is
// live in memory only, and a restart undoes it (a deleted route comes
// back). The caller gets the 500, but the log had only the audit line
// saying the change was made, so a caller that did not retry or report
// it left no trace of the failure for the operator.
func (a *Admin) notWritten(ctx *fasthttp.RequestCtx, id string, err error) {
	a.p.cfg.Logger.Error("admin: routes file not written: the change is live in memory only, and a restart undoes it",
		"sandbox_id", id, "remote_addr", remoteIP(ctx).String(), "err", err)
}

type sandboxBody struct {
	SandboxID string
	State     string
}

// readSandboxBody reads {"sandbox_id"}, and "state" too when withState;
// other members are ignored (the control plane may send more), but these
// must be strings spelled exactly so: encoding/json's struct decoding
// also took "SANDBOX_ID" or "Sandbox_Id", which meta/upsert refused, and
// the platform's proxy does not read.
func readSandboxBody(ctx *fasthttp.RequestCtx, withState bool) (sandboxBody, bool) {
	var b sandboxBody
	raw, err := decodeObject(ctx.PostBody())
	if err != nil {
		adminError(ctx, 400, "invalid JSON body: "+err.Error())
		return b, false
	}
	fields := []struct {
		name string
		dst  *string
	}{{"sandbox_id", &b.SandboxID}, {"state", &b.State}}
	if !withState {
		fields = fields[:1]
	}
	for _, f := range fields {
		v, ok := raw[f.name]
		if !ok {
			continue
		}
		if *f.dst, ok = v.(string); !ok {
			adminError(ctx, 400, "field "+f.name+" must be a string")
			return b, false
		}
	}
	if !routing.ValidID(b.SandboxID) {
		_, given := raw["sandbox_id"]
		badSandboxID(ctx, given, b.SandboxID)
		return b, false
	}
	return b, true
}

// badSandboxID answers the 400 of a body whose sandbox_id is missing
// (given false) or not a sandbox id, saying what one is: a control plane
// that sent "MyBox" was told only "missing or invalid".
func badSandboxID(ctx *fasthttp.RequestCtx, given bool, id string) {
	if !given {
		adminError(ctx, 400, "sandbox_id missing")
		return
	}
	adminError(ctx, 400, "sandbox_id "+routing.Echo(id)+" is not a sandbox id: "+routing.IDForm)
}

// decodeObject decodes body, one JSON object, into its members, numbers
// as json.Number (through float64 a nanosecond CreatedAt would lose its
// last digits). A member given twice is refused, however its name is
// escaped: encoding/json keeps the last one and other readers the first,
// so {"sandbox_id":"a","sandbox_id":"b"} killed b while an audit of the
// request read a, and {"AllowPublicTraffic":"false",…,
// "AllowPublicTraffic":"true"} stored a public route that read private.
func decodeObject(body []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err == io.EOF {
		return nil, errors.New("empty body, want a JSON object")
	} else if err != nil {
		return nil, err
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("want a JSON object, got %s", jsonKind(tok))
	}
	out := make(map[string]any)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, cutShort(err)
		}
		name, _ := tok.(string) // the decoder yields only strings as names
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, cutShort(err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("field %s given twice", routing.Echo(name))
		}
		out[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, cutShort(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the object")
	}
	return out, nil
}

// memberNames returns the names of a decoded body's members in order, so
// that a body with more than one bad member is refused naming the same
// one every time, as routing.ParseRoute names the smallest bad field: in
// Go's map order, which is random, one body got "field HostIP must be a
// string" and, sent again, "field 3000 must be a string".
func memberNames(raw map[string]any) []string {
	return slices.Sorted(maps.Keys(raw))
}

// cutShort says a body that ends inside its object so: the decoder
// reports it as a bare "EOF" or "unexpected EOF".
func cutShort(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errors.New("unexpected end of the body")
	}
	return err
}

// jsonKind names the kind of a JSON token other than an object's start,
// for a 400 ("got <nil>" said nothing of a null).
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "an array"
	case json.Number, float64:
		return "a number"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	}
	return "null"
}

func (a *Admin) cacheDelete(ctx *fasthttp.RequestCtx) {
	b, ok := readSandboxBody(ctx, false)
	if !ok {
		return
	}
	n, err := a.invalidate(b.SandboxID)
	a.audit(ctx, "cached route dropped", b.SandboxID)
	if err != nil {
		notPublished(ctx, err)
		return
	}
	writeJSON(ctx, 200, map[string]any{"ok": true, "deleted": n})
}

func (a *Admin) metaUpsert(ctx *fasthttp.RequestCtx) {
	raw, err := decodeObject(ctx.PostBody())
	if err != nil {
		adminError(ctx, 400, "invalid JSON body: "+err.Error())
		return
	}
	v, given := raw["sandbox_id"]
	id, isString := v.(string)
	if given && !isString {
		adminError(ctx, 400, "field sandbox_id must be a string")
		return
	}
	if !routing.ValidID(id) {
		badSandboxID(ctx, given, id)
		return
	}
	if a.cfg.Routes == nil {
		a.routeWritten(ctx, id)
		return
	}
	fields := make(map[string]string, len(raw))
	for _, k := range memberNames(raw) {
		if k == "sandbox_id" {
			continue
		}
		switch v := raw[k].(type) {
		case string:
			fields[k] = v
		case json.Number:
			fields[k] = v.String()
		case bool:
			fields[k] = strconv.FormatBool(v)
		default:
			adminError(ctx, 400, "field "+k+" must be a string, number or boolean")
			return
		}
	}
	if a.putRoute(ctx, id, fields) {
		writeJSON(ctx, 200, map[string]any{"ok": true, "sandbox_id": id})
	}
}

func (a *Admin) metaDelete(ctx *fasthttp.RequestCtx) {
	b, ok := readSandboxBody(ctx, false)
	if !ok {
		return
	}
	defer a.locks.lock(b.SandboxID)()
	// Remember the sandbox as killed for a while: its clients get 410,
	// not a misleading 404. What it still has open ends. Before the
	// route goes, and before the invalidation, which makes what is open
	// be judged against the route (gone): a kill's cuts are the kill's
	// (410 sandbox_killed), not a route change's. Removed first, the
	// route was found gone by a look in between (the janitor's, a
	// re-read), which cut what was open 502 route_changed.
	a.p.kill(b.SandboxID)
	var werr error
	deleted := false
	if a.cfg.Routes != nil {
		a.storeChanged(b.SandboxID)
		deleted, werr = a.cfg.Routes.Remove(b.SandboxID)
	}
	n, err := a.invalidate(b.SandboxID)
	a.audit(ctx, "sandbox killed", b.SandboxID)
	if werr != nil {
		// The route would come back at the next restart.
		a.notWritten(ctx, b.SandboxID, werr)
		adminError(ctx, 500, deletedNotWritten(deleted, werr))
		return
	}
	if err != nil {
		notPublished(ctx, err)
		return
	}
	writeJSON(ctx, 200, map[string]any{"ok": true, "backend_cache_deleted": n})
}

func (a *Admin) setState(ctx *fasthttp.RequestCtx) {
	b, ok := readSandboxBody(ctx, true)
	if !ok {
		return
	}
	st, ok := parseState(b.State)
	if !ok {
		adminError(ctx, 400, "state must be running, pausing or paused, not "+routing.Echo(b.State))
		return
	}
	if st == stateRunning {
		if e := a.p.sandboxes.peek(b.SandboxID); e != nil {
			if cur := e.state(); cur == statePausing || cur == statePaused {
				// A resume: restored from its snapshot, the sandbox may be
				// at another address, which the control plane wrote before
				// this call and may announce after it, or not at all. The
				// route is read from the store again (the cached one kept
				// should the store fail), as after a lifecycle manager's
				// resume; the route cached before the pause kept sending
				// requests to the old address for its 500-700 s TTL.
				// Before the state: a request in between is still answered
				// 503, and its lookup reads the new route.
				a.p.cache.Expire(b.SandboxID)
			}
		}
	}
	a.p.sandboxes.setState(b.SandboxID, st)
	a.audit(ctx, "sandbox state set", b.SandboxID, "state", b.State)
	writeJSON(ctx, 200, map[string]any{"ok": true, "sandbox_id": b.SandboxID, "state": b.State})
}

func (a *Admin) lastActive(ctx *fasthttp.RequestCtx) {
	var since int64
	// An empty since is refused, not read as 0: a caller's unset
	// variable would otherwise get every sandbox instead of a 400.
	q := ctx.QueryArgs()
	if twice := givenTwice(q, "since"); twice != "" {
		adminError(ctx, 400, twice)
		return
	}
	if q.Has("since") {
		n, err := strconv.ParseInt(string(q.Peek("since")), 10, 64)
		if errors.Is(err, strconv.ErrRange) && n > 0 {
			// A whole number past int64 is the far future (n is the
			// largest int64), not a 400 saying it is no milliseconds.
			err = nil
		}
		if err != nil || n < 0 {
			adminError(ctx, 400, "since must be unix milliseconds")
			return
		}
		since = n
	}
	now := time.Now().UnixMilli()
	// The members first: the count precedes them in the answer.
	entries, n := a.p.sandboxes.appendLastActive(nil, since, now)
	b := make([]byte, 0, len(entries)+96)
	b = append(b, `{"now":`...)
	b = strconv.AppendInt(b, now, 10)
	b = append(b, `,"since":`...)
	b = strconv.AppendInt(b, since, 10)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"entries":{`...)
	b = append(b, entries...)
	b = append(b, "}}\n"...)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetStatusCode(200)
	ctx.SetBody(b)
}

// signToken issues a signed browser token: {"sandbox_id","port","ttl"}
// (ttl a Go duration, default 10m, at most 24h).
func (a *Admin) signToken(ctx *fasthttp.RequestCtx) {
	if a.cfg.Signer == nil {
		adminError(ctx, 404, "signed tokens are off: configure auth.signing_keys")
		return
	}
	var b struct {
		SandboxID, TTL string
		Port           int64
	}
	// badPort is a port given as a number that is no whole int64 (80.5,
	// 1e2), as sent.
	var badPort string
	// Unknown fields are refused: a lifetime spelled another way
	// ("ttl_seconds") would otherwise silently issue a 10-minute token.
	// So are a member given twice and one spelled in another case
	// (decodeObject, as for the other admin bodies): struct decoding took
	// the last copy, and "TTL" for "ttl".
	raw, err := decodeObject(ctx.PostBody())
	for _, name := range memberNames(raw) {
		if err != nil {
			break
		}
		v := raw[name]
		var ok bool
		switch name {
		case "sandbox_id":
			b.SandboxID, ok = v.(string)
		case "ttl":
			b.TTL, ok = v.(string)
		case "port":
			var n json.Number
			if n, ok = v.(json.Number); ok {
				if p, perr := n.Int64(); perr == nil {
					b.Port = p
				} else {
					// Said as the bad port it is, below.
					b.Port, badPort = -1, n.String()
				}
			}
		default:
			err = fmt.Errorf("unknown field %s", routing.Echo(name))
			continue
		}
		if !ok {
			err = fmt.Errorf("field %s has the wrong type", routing.Echo(name))
		}
	}
	if err != nil {
		adminError(ctx, 400, "invalid JSON body: "+err.Error())
		return
	}
	ttl, err := ParseTokenTTL(b.TTL)
	if err != nil {
		adminError(ctx, 400, err.Error())
		return
	}
	// A field given a bad value is said to be that, not missing:
	// "required" for a port 0 puzzled.
	_, hasID := raw["sandbox_id"]
	_, hasPort := raw["port"]
	var msg string
	switch {
	case !hasID:
		msg = "sandbox_id (a sandbox id) is required"
	case !hasPort:
		msg = "port (1-65535) is required"
	case !routing.ValidID(b.SandboxID):
		msg = "sandbox_id " + routing.Echo(b.SandboxID) + " is not a sandbox id: " + routing.IDForm
	case badPort != "":
		msg = "port " + echoNumber(badPort) + " is not a port (1-65535)"
	case b.Port < 1 || b.Port > 65535:
		msg = fmt.Sprintf("port %d is not a port (1-65535)", b.Port)
	}
	if msg != "" {
		adminError(ctx, 400, msg)
		return
	}
	exp := TokenExpiry(time.Now(), ttl)
	tok, err := a.cfg.Signer.Sign(b.SandboxID, uint16(b.Port), exp)
	if err != nil {
		adminError(ctx, 400, err.Error())
		return
	}
	writeJSON(ctx, 200, map[string]any{
		"token": tok, "expires_at": exp.UTC().Format(time.RFC3339), "query_param": auth.QueryParamName,
	})
}

// echoNumber is a JSON number as a refusal quotes it: as written (it holds
// nothing to escape), cut as routing.Echo cuts, so a port of 64 KiB of
// digits is not answered whole.
func echoNumber(n string) string {
	if len(n) > 64 {
		return n[:64] + "..."
	}
	return n
}

// ParseTokenTTL parses a signed-token lifetime: a Go duration, default
// 10m, between 1s and 24h (TokenExpiry rounds the expiry up to a whole
// second).
func ParseTokenTTL(s string) (time.Duration, error) {
	if s == "" {
		return 10 * time.Minute, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > 24*time.Hour {
		return 0, fmt.Errorf("ttl %s: want a duration between 1s and 24h", routing.Echo(s))
	}
	return d, nil
}

// TokenExpiry is the expiry of a signed token issued at now to live ttl:
// now+ttl rounded up to a whole second, as the token holds its expiry in
// whole seconds. Rounded down, a token of ttl 1s issued at x.999 lived
// a millisecond.
func TokenExpiry(now time.Time, ttl time.Duration) time.Time {
	exp := now.Add(ttl)
	if t := exp.Truncate(time.Second); t.Before(exp) {
		return t.Add(time.Second)
	}
	return exp
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		adminError(ctx, 500, err.Error())
		return
	}
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetStatusCode(status)
	ctx.SetBody(append(b, '\n'))
}

func adminError(ctx *fasthttp.RequestCtx, status int, msg string) {
	writeJSON(ctx, status, map[string]string{"error": msg})
}
