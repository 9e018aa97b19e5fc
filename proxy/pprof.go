package proxy

import (
	"math"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
	// pprofhandler imports net/http/pprof, whose init registers its
	// handlers on http.DefaultServeMux. No listener of the proxy serves
	// DefaultServeMux (every server here is a fasthttp.Server with a
	// handler of its own; cmd's demo servers are given their mux), so
	// those registrations are reachable from nowhere: the profiles are
	// served only through Admin.pprof, behind the admin credential.
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// maxProfileSeconds is the longest `seconds` a profile may run for (the
// CPU profile, whose default is 30, and the delta heap, allocs, block,
// mutex and goroutine profiles). The request holds its connection for that
// long, not the admin API: every admin connection has a goroutine of its
// own and fasthttp's 30 s write timeout runs from the handler's return.
const maxProfileSeconds = 60

// maxTraceSeconds is the longest execution trace: the adaptor holds the
// whole answer in memory until it is written, and a trace records every
// scheduling event of a busy proxy.
const maxTraceSeconds = 10

// pprofPath reports whether path is one of the profiling endpoints'
// (the index, /debug/pprof/ or without its slash, and what is below it).
func pprofPath(path string) bool {
	return path == "/debug/pprof" || strings.HasPrefix(path, "/debug/pprof/")
}

// pprof serves Go's runtime profiles (net/http/pprof's endpoints) to an
// authorized admin caller when AdminConfig.Pprof is on. Off, it answers the
// 404 of a path the admin API lacks, with a hint, as POST /admin/tokens
// does without signing keys.
func (a *Admin) pprof(ctx *fasthttp.RequestCtx, method, path string) {
	if !a.cfg.Pprof {
		adminError(ctx, 404, "no such admin endpoint: "+string(ctx.Method())+" "+path+" (profiling is off: set admin_pprof, CUBEPROXY_ADMIN_PPROF)")
		return
	}
	// GET alone (HEAD is one), so that `seconds` is read from the query:
	// net/http/pprof reads a POST's form body ahead of it, past the cap.
	// go tool pprof posts to symbol, which takes no seconds.
	if path == "/debug/pprof/symbol" && method != "GET" && method != "POST" {
		methodNotAllowed(ctx, path, "GET, HEAD, POST")
		return
	}
	if path != "/debug/pprof/symbol" && method != "GET" {
		methodNotAllowed(ctx, path, "GET, HEAD")
		return
	}
	if path == "/debug/pprof/cmdline" {
		// The command line may carry a secret given as a flag
		// (--admin-token, --redis-password), which the admin token
		// must not hand out; no pprof tool needs it.
		adminError(ctx, 404, "not served: "+path+" would show the command line, which may carry secrets given as flags")
		return
	}
	if msg := pprofSeconds(path, ctx.QueryArgs()); msg != "" {
		adminError(ctx, 400, msg)
		return
	}
	pprofhandler.PprofHandler(ctx)
}

// pprofSeconds returns why the `seconds` of a profile request to path is
// refused, or "" when it is absent or within the cap: a whole number of
// seconds from 1 to maxProfileSeconds, or for the trace a number above 0
// and at most maxTraceSeconds (net/http/pprof reads it so).
func pprofSeconds(path string, q *fasthttp.Args) string {
	if twice := givenTwice(q, "seconds"); twice != "" {
		return twice
	}
	if !q.Has("seconds") {
		return ""
	}
	v := q.Peek("seconds")
	if path == "/debug/pprof/trace" {
		s, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsNaN(s) || s <= 0 || s > maxTraceSeconds {
			return "seconds must be a number above 0 and at most " + strconv.Itoa(maxTraceSeconds) + " for a trace (held in memory whole until sent), not " + routing.Echo(v)
		}
		return ""
	}
	s, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || s < 1 || s > maxProfileSeconds {
		return "seconds must be a whole number from 1 to " + strconv.Itoa(maxProfileSeconds) + ", not " + routing.Echo(v)
	}
	return ""
}
