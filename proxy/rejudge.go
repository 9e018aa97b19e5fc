package proxy

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// A stream or a WebSocket may last hours after the request that opened it
// was let through. When the sandbox's route changes (its traffic token
// rotated, the route made private, its backend moved, the route deleted),
// what it still has open on this instance is judged again, as its opening
// request would be judged now, with the credential that request presented,
// and what the route no longer lets through to the same place is cut. The
// evidence is kept on the sandbox connection checked out for the exchange
// (upstreamConn.grant, then the tunnel's): the route it was judged against,
// how it passed and when it read that route, a pointer and three small
// words, set under the pool's lock the checkout takes anyway.

// authVia is how a request passed authorize.
type authVia uint8

const (
	// viaUnjudged: nothing was recorded (a connection not checked out by
	// a request); a route change never cuts it.
	viaUnjudged authVia = iota
	// viaAnonymous: no credential: a public route, or an exempt port.
	viaAnonymous
	// viaToken: the route's traffic token in its header (on a public route
	// too, when the request carried it: made private with the same token,
	// the route still lets it through).
	viaToken
	// viaCookie: the signed cookie, which is bound to the route's traffic
	// token: judged as the token it is bound to.
	viaCookie
	// viaLink: a signed link's query parameter. A link is signed with the
	// proxy's keys for the sandbox and port and bound to no token: a
	// rotation does not revoke it, as it does not refuse its next request.
	viaLink
)

// grant is the evidence an exchange was let through on: the route it was
// judged against, the sandbox port it asked for, how it passed, and the
// count of announced route changes (routing.Cache.Changes) when it read
// that route, which orders its read with a re-read's (rejudge).
type grant struct {
	route   *routing.Route
	port    uint16
	via     authVia
	changes uint64
}

// cutCause is why a route change cut an exchange (upstreamConn.changed,
// tunnel.changed); 0 when none did.
type cutCause = uint32

const (
	cutNone cutCause = iota
	// cutMoved: the route was deleted, or now sends the port elsewhere (a
	// new address or port mapping, a sandbox created again under the id):
	// the old backend is no longer this route's.
	cutMoved
	// cutRevoked: the credential the exchange was let through on no
	// longer passes (a rotated token, a route made private).
	cutRevoked
)

// Failures of an exchange whose sandbox connection a route change closed.
var (
	errRouteChanged      = errors.New("route changed: its sandbox connection was closed")
	errCredentialRevoked = errors.New("credential revoked by a route change: its sandbox connection was closed")
)

// changedErr is the failure of an exchange a route change cut (why, one of
// cutMoved and cutRevoked).
func changedErr(why cutCause) error {
	if why == cutRevoked {
		return errCredentialRevoked
	}
	return errRouteChanged
}

// changedCode is the error code of an exchange a route change cut.
func changedCode(why cutCause) string {
	if why == cutRevoked {
		return CodeCredentialRevoked
	}
	return CodeRouteChanged
}

// changedStatus is the status of a request a route change cut before its
// answer's head: upstreamError's errRevoked or errMoved.
func changedStatus(why cutCause) int {
	if why == cutRevoked {
		return errRevoked.status
	}
	return errMoved.status
}

// judge decides an exchange let through on g against now, the sandbox's
// route as the store has it now (nil: the route is gone). It mirrors
// authorize (through auth.CheckTraffic, given the token the request
// presented) rather than restating it.
func (p *Proxy) judge(g grant, now *routing.Route) cutCause {
	old := g.route
	if old == nil || old == now || g.via == viaUnjudged {
		return cutNone
	}
	if now == nil || !p.sameBackend(old, now, g.port) {
		return cutMoved
	}
	var presented tokenHeader
	if g.via == viaToken || g.via == viaCookie {
		// It passed, so what it presented (or what its cookie is bound
		// to) is the token of the route it was judged against.
		presented = tokenHeader(old.TrafficToken)
	}
	err := auth.CheckTraffic(now.Public, now.TrafficToken, p.exemptPort(g.port), presented)
	if err == nil {
		return cutNone
	}
	if g.via == viaLink && rejection(err, rejTrafficInvalid).Code == auth.CodeTrafficTokenMissing {
		// authorize verifies the link on any restricted route that has a
		// token; it verified then, and nothing in the route binds it.
		return cutNone
	}
	return cutRevoked
}

// sameBackend reports whether now sends port where old did, to the same
// sandbox (the pool key: its CreatedAt and address).
func (p *Proxy) sameBackend(old, now *routing.Route, port uint16) bool {
	if old.CreatedAt != now.CreatedAt {
		return false
	}
	a, perr := p.backend(old, port)
	b, nerr := p.backend(now, port)
	return perr == nil && nerr == nil && a == b
}

// sameJudgement reports whether now judges every exchange as old does:
// then an exchange's evidence may point at now instead (the next look
// compares pointers, and old can be collected).
func (p *Proxy) sameJudgement(old, now *routing.Route, port uint16) bool {
	return old.Public == now.Public && auth.SameTrafficToken(old.TrafficToken, now.TrafficToken) && p.sameBackend(old, now, port)
}

// tokenHeader is a request head that carries one traffic token (none when
// empty), for auth.CheckTraffic.
type tokenHeader string

func (t tokenHeader) Peek(key string) []byte {
	if key == auth.HeaderE2BTrafficToken && t != "" {
		return []byte(t)
	}
	return nil
}

// rejudge judges every exchange of sandbox id open on this instance (a
// request waiting for its answer, a stream, a WebSocket) against now, its
// route as the store has it now (nil: gone), and cuts those now no longer
// lets through to the same place: their sandbox connection is closed under
// them, as a kill closes it (pools.kill), and they end logged with
// route_changed or credential_revoked. It returns how many it cut. The
// idle connections now no longer routes to are closed (closeUnrouted). An
// exchange already cut and not yet unlisted is left to its first cut
// (earlier builds cut it again, counted it twice, and a later change's
// cause replaced the first's: a rotation's 403 credential_revoked became
// a delete's 502 route_changed). The
// pools' map lock is held only to list id's pools, each pool's lock while
// its lists are walked; nothing waits on I/O under either.
//
// asOf is the count of announced route changes (routing.Cache.Changes)
// read before now was: an exchange that read its route at a higher count
// read it after now, and is not judged against it. now may be older than
// that route: a re-read that read "no route" (a kill's, or a delete's)
// judged, on a loaded machine, only after the route had been stored again
// and an exchange let through on it, and cut that exchange 502
// route_changed for a deletion that came before it. What a change
// announced after its read asks for judges it: the re-read that change
// starts (askReread), or its own look at its checkout (judgeLate); one
// announced by nobody, the janitor's next round.
func (p *Proxy) rejudge(id string, now *routing.Route, asOf uint64) int {
	if p.beforeRejudge != nil {
		p.beforeRejudge(id)
	}
	ps := &p.pools
	ps.mu.RLock()
	keys := ps.byID[id]
	us := make([]*upstream, 0, len(keys))
	for _, k := range keys {
		us = append(us, ps.m[k])
	}
	ps.mu.RUnlock()
	n := 0
	for _, u := range us {
		u.mu.Lock()
		for c := u.busy; c != nil; c = c.busyNext {
			// One cut already (by an earlier change, a kill, the drain
			// deadline) or whose client left stays listed until its
			// goroutine ends it: the first cut says why it ended, and
			// it is counted once.
			if c.interrupted.Load() {
				continue
			}
			if why := p.judgeAgain(&c.grant, now, asOf); why != cutNone {
				c.changed.Store(why)
				c.cutUnder()
				n++
			}
		}
		for t := u.tunnels; t != nil; t = t.poolNext {
			if t.isCut() {
				continue // as above
			}
			// A compare-and-swap: splice sets changed outside this lock.
			if why := p.judgeAgain(&t.grant, now, asOf); why != cutNone && t.changed.CompareAndSwap(cutNone, why) {
				t.close()
				n++
			}
		}
		u.mu.Unlock()
	}
	if n > 0 {
		p.cfg.Logger.Info("route change cut open exchanges", "sandbox_id", id, "exchanges", n)
	}
	// Only when no change was announced since now was read: now may then
	// be older than the route a newer pool was made for, and that change's
	// own re-read (or the janitor's next round) closes what it no longer
	// routes to.
	if p.cache.Changes() == asOf {
		p.closeUnrouted(id, now)
	}
	return n
}

// closeUnrouted closes the idle connections of sandbox id's pools that
// now, its route (nil: gone), sends no port to: it moved to another node,
// names another incarnation (CreatedAt), or no longer maps the host port.
// They would never be used again, and each held a descriptor until
// upstream.idle_conn_timeout (30 s by default), to a VM that may be gone.
// pools.create does the same for the changes that make a new pool; this
// is for those that make none: a route deleted, a port unmapped, a move
// back to an address whose pool is still there. Busy connections are
// rejudge's; one it leaves open that is released to such a pool idles
// there until the janitor's idle timeout, as before.
func (p *Proxy) closeUnrouted(id string, now *routing.Route) {
	ps := &p.pools
	var unrouted []*upstream
	ps.mu.RLock()
	for _, k := range ps.byID[id] {
		if !p.routesTo(now, k) {
			unrouted = append(unrouted, ps.m[k])
		}
	}
	ps.mu.RUnlock()
	for _, u := range unrouted {
		u.closeIdle(math.MaxInt64)
	}
}

// routesTo reports whether route r (nil: none) sends some port of its
// sandbox to the pool of k.
func (p *Proxy) routesTo(r *routing.Route, k poolKey) bool {
	if r == nil || r.CreatedAt != k.createdAt {
		return false
	}
	if r.OnNode(p.cfg.NodeIP) {
		// Any container port, mapped or not (backend).
		return r.SandboxIP.IsValid() && k.addr.Addr() == r.SandboxIP
	}
	for port := range r.Ports {
		if addr, err := p.backend(r, port); err == nil && addr == k.addr {
			return true
		}
	}
	return false
}

// judgeAgain judges an open exchange's evidence g against now, read at
// the change count asOf (judge); one that read its route after now is
// left alone (rejudge). One it keeps is pointed at now when now judges as
// its old route does, so that the next look is a pointer comparison and
// the old route can be collected. The pool's lock, which guards g, must
// be held.
func (p *Proxy) judgeAgain(g *grant, now *routing.Route, asOf uint64) cutCause {
	if g.changes > asOf {
		return cutNone
	}
	why := p.judge(*g, now)
	if why == cutNone && g.route != nil && now != nil && g.route != now && p.sameJudgement(g.route, now, g.port) {
		g.route = now
	}
	return why
}

// judgeLate judges the exchange x, let through on g, when a route change
// was announced (routing.Cache.Changes moved) between the read of its route
// and the checkout of its sandbox connection: that change's rejudge may
// have walked the pools before the exchange was listed there, and would
// not see it. The count is read after the checkout, which rejudge's walk
// is ordered with (the pool's lock), and the cache raises it before the
// re-read that rejudge waits for: either the walk found the exchange, or
// this finds the change. On a request without one (nearly all) it is an
// atomic load; with one, the route comes from the cache (read again by
// the change's re-read, or read here).
func (p *Proxy) judgeLate(x *exchange, g grant) cutCause {
	if p.cache.Changes() == x.changes {
		return cutNone
	}
	return p.judgeNow(g)
}

// judgeNow judges an exchange let through on g against its route as the
// cache has it now (judgeLate).
func (p *Proxy) judgeNow(g grant) cutCause {
	if g.route == nil {
		return cutNone
	}
	r, _, err := p.cache.Get(context.Background(), []byte(g.route.ID))
	switch {
	case err == nil:
		return p.judge(g, r)
	case errors.Is(err, routing.ErrNotFound):
		// From the negative cache too: the route this exchange read was
		// cached by a store read that dropped the id's negative entry, so
		// one there now is a "no route" read since, most often the
		// change's own re-read, whose walk ran while this exchange had no
		// connection listed yet (its dial). A new request gets its 404
		// from it; this one went on to the deleted sandbox's backend.
		return p.judge(g, nil)
	}
	return cutNone // the store cannot say: as rejudge, nothing is cut
}

// rejudgeOpen judges again the open exchanges of every sandbox that has
// some on this instance against the route the cache holds for it now, for
// route changes no invalidation announced (the control plane wrote Redis
// and published nothing, or the message was lost): the janitor runs it
// every tick. The cache answers from memory while its entry is fresh; once
// its TTL is over it reads the store, as a request would, once per sandbox
// per TTL. An exchange judged against the route the cache holds costs a
// pointer comparison. The pools are walked in chunks, as the sweep walks
// them; the reads run one after the other, outside every lock. A store
// that cannot answer ends the round (what is open stays; the next round
// asks again), so that a hung store costs a round one lookup timeout, not
// one per sandbox.
func (p *Proxy) rejudgeOpen(ctx context.Context, stop <-chan struct{}) {
	ps := &p.pools
	pace := newPacer(stop)
	defer pace.stop()
	var ids []string
	seen := map[string]bool{}
	chunk := make([]poolKeyed, 0, sweepChunk)
	flush := func() {
		for i, c := range chunk {
			c.u.mu.Lock()
			open := c.u.busy != nil || c.u.tunnels != nil
			c.u.mu.Unlock()
			if open && !seen[c.k.id] {
				seen[c.k.id] = true
				ids = append(ids, c.k.id)
			}
			chunk[i] = poolKeyed{}
		}
		chunk = chunk[:0]
	}
	ps.walk(pace, func(k poolKey, u *upstream) bool {
		if u.conns.Load() == 0 {
			return false
		}
		chunk = append(chunk, poolKeyed{k, u})
		return len(chunk) == sweepChunk
	}, flush)
	var fe *routing.FieldError
	for _, id := range ids {
		pace.step()
		if ctx.Err() != nil {
			return
		}
		asOf := p.cache.Changes()
		r, res, err := p.cache.Get(ctx, []byte(id))
		switch {
		case res == routing.CacheStale:
			// The store is failing (the cache serves the old route):
			// the rest of the round would wait for it up to a lookup
			// timeout each. What is open stays; the next round asks.
			return
		case err == nil:
			p.rejudge(id, r, asOf)
		case errors.Is(err, routing.ErrNotFound):
			// From the negative cache too (judgeNow): a "no route" read
			// since the open exchanges read theirs. Requests for the
			// sandbox renew it every negative TTL, and a janitor that
			// waited for a miss could wait as long as they came.
			p.rejudge(id, nil, asOf)
		case errors.As(err, &fe):
			// Invalid route data: requests get a 404, what is open stays.
		default:
			return // the store could not answer, as above
		}
	}
}

// poolKeyed is a pool with its key.
type poolKeyed struct {
	k poolKey
	u *upstream
}

// rereadRoute reads id's route again (through the cache, which shares the
// read with requests for id and bounds it) and acts on the answer: the
// sandbox's open exchanges are judged against it (rejudge), and a route
// the store no longer has makes this instance forget what it knew of the
// sandbox (its pause). It reports whether the answer settles the question:
// not when the store could not answer (or ctx ended the wait), nor from
// the negative cache, whose answer may predate a route written since and
// its pause (what is open is cut on it all the same): the caller leaves
// the sandbox for the janitor to ask again.
func (p *Proxy) rereadRoute(ctx context.Context, id string) bool {
	since := time.Now().UnixNano()
	asOf := p.cache.Changes()
	r, res, err := p.cache.Get(ctx, []byte(id))
	var fe *routing.FieldError
	switch {
	case err == nil:
		p.rejudge(id, r, asOf)
		return true
	case errors.Is(err, routing.ErrNotFound) && res != routing.CacheMiss:
		// What is open is cut on the negative cache's answer too, a "no
		// route" read since it read its route (judgeNow); the pause only
		// on the store's own, which the janitor asks for.
		p.rejudge(id, nil, asOf)
		return false
	case res != routing.CacheMiss:
		return false
	case errors.Is(err, routing.ErrNotFound):
		// The read may be one a request began earlier, joined here.
		if start, ok := routing.ReadStart(err); ok {
			since = start
		}
		p.sandboxes.forget(id, since)
		p.rejudge(id, nil, asOf)
		return true
	}
	// The route is there, if invalid: requests get 404 route_invalid, but
	// what is open stays, as a store that cannot answer leaves it.
	return errors.As(err, &fe)
}

// routeChanged re-reads id's route in the background and judges what the
// sandbox has open against it, when it has anything open on this
// instance: an admin call changed the route here (the memory store), or
// an invalidation says it changed in the store. One re-read per sandbox
// runs at a time; the changes announced during it make one more
// (askReread), so that a flood of invalidations costs no goroutine or
// store read each. A re-read the store cannot answer leaves the sandbox
// marked for the janitor (unsure), which asks again.
func (p *Proxy) routeChanged(id string, sb *sandboxState) {
	if !sb.askReread() {
		return
	}
	p.bg.run(func(ctx context.Context) {
		for {
			if !p.rereadRoute(ctx, id) {
				sb.unsure.Store(true)
			}
			if ctx.Err() != nil {
				sb.rereads.Store(0)
				return
			}
			if !sb.rereadDone() {
				return
			}
		}
	})
}
