package proxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// poolKey names one upstream connection pool. The sandbox id and CreatedAt
// are part of it so a recycled IP:port (a new sandbox behind the same
// address) never reuses a keep-alive connection opened to the old one.
type poolKey struct {
	id        string
	createdAt int64
	addr      netip.AddrPort
}

// upstream is one pool of keep-alive connections to one sandbox port. It is
// a few words and a slice: a new sandbox costs no goroutine and no buffer
// until a connection is actually open, and idle connections hold no
// buffers (readers and writers come from the proxy's pools per exchange).
type upstream struct {
	addr     string
	lastUsed atomic.Int64 // unix nanos
	conns    atomic.Int32 // open connections, idle or busy
	pending  atomic.Int32 // requests waiting for response headers
	dead     atomic.Bool  // swept out of the pool map
	// killed: the sandbox was killed (pools.kill); nothing is checked out
	// of this pool any more.
	killed atomic.Bool

	mu   sync.Mutex
	idle []*upstreamConn // most recently used last
	// busy lists the connections checked out of the pool (an intrusive
	// list: no allocation per request), so that the drain deadline can
	// close them under the requests waiting on them (pools.abort).
	busy *upstreamConn
	// tunnels lists the pool's WebSocket tunnels past their 101 (an
	// intrusive list), so that a kill cuts its sandbox's tunnels without
	// walking every tunnel of the instance (see pools.kill).
	tunnels *tunnel
}

// addTunnel lists t, a tunnel over one of u's connections; one opened
// while its sandbox was being killed is cut at once (the kill sets killed
// before it walks the list, both under u.mu).
func (u *upstream) addTunnel(t *tunnel) {
	u.mu.Lock()
	defer u.mu.Unlock()
	t.poolPrev, t.poolNext = nil, u.tunnels
	if u.tunnels != nil {
		u.tunnels.poolPrev = t
	}
	u.tunnels = t
	if u.killed.Load() && !t.isCut() {
		t.killed.Store(true)
		t.close()
	}
}

// removeTunnel takes t off u's list (a no-op when it is not on it).
func (u *upstream) removeTunnel(t *tunnel) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if t.poolPrev != nil {
		t.poolPrev.poolNext = t.poolNext
	} else if u.tunnels == t {
		u.tunnels = t.poolNext
	} else {
		return
	}
	if t.poolNext != nil {
		t.poolNext.poolPrev = t.poolPrev
	}
	t.poolPrev, t.poolNext = nil, nil
}

// pools holds the upstream pools; idle ones are dropped by sweep.
type pools struct {
	cfg *Config

	mu sync.RWMutex
	m  map[poolKey]*upstream
	// byID lists m's keys by sandbox id, so that a kill finds a sandbox's
	// pools without walking them all under the write lock, which every
	// request's pool lookup waits for (≈ 1 ms at 50k pools).
	byID map[string][]poolKey

	// aborted is set by abort (the drain deadline): a connection checked
	// out after it is closed at once.
	aborted atomic.Bool
	// dialCtx is cancelled by abort: a connect under way (a frozen
	// sandbox's takes two connect timeouts) ends then too, and so does a
	// request's wait for its route lookup.
	dialCtx     context.Context
	cancelDials context.CancelFunc

	// shedEmpty is when (unix nanos) shedIdle last found no idle
	// connection to close.
	shedEmpty atomic.Int64

	// afterGet, for tests, runs in get between the map's read and the
	// pool's use, where the sweep drops it; nil in production.
	afterGet func()
}

// get returns the pool of key, made if need be. A pool the sweep drops
// once get found it is not returned: it is out of the map, where a kill
// looks for the pools to cut, and a request that went on with it was
// forwarded to a sandbox killed after its state had been looked at, and
// left waiting for an answer the kill should have cut. The sweep reads
// lastUsed before it marks the pool dead, and get stores it before it
// reads dead: either the sweep sees the pool used and keeps it, or get
// sees it dead and looks again.
func (ps *pools) get(key poolKey, now int64) *upstream {
	for {
		ps.mu.RLock()
		u := ps.m[key]
		ps.mu.RUnlock()
		if ps.afterGet != nil {
			ps.afterGet()
		}
		if u == nil {
			u = ps.create(key)
		}
		u.lastUsed.Store(now)
		if !u.dead.Load() {
			return u
		}
	}
}

// create makes the pool of key. A new pool at another IP than the
// sandbox's other pools, or of another CreatedAt, means its route moved it
// to another node or names a sandbox created again: the others' idle
// connections are never used again, and each held a descriptor until
// upstream.idle_conn_timeout (to a VM that may never close it), so they
// are closed now. A pool at another port of the same IP keeps its own: it
// may be another container port of the same sandbox.
func (ps *pools) create(key poolKey) *upstream {
	ps.mu.Lock()
	if u := ps.m[key]; u != nil {
		ps.mu.Unlock()
		return u
	}
	u := &upstream{addr: key.addr.String()}
	ps.m[key] = u
	if ps.byID == nil {
		ps.byID = make(map[string][]poolKey)
	}
	var stale []*upstream
	for _, k := range ps.byID[key.id] {
		if k.createdAt != key.createdAt || k.addr.Addr() != key.addr.Addr() {
			stale = append(stale, ps.m[k])
		}
	}
	ps.byID[key.id] = append(ps.byID[key.id], key)
	ps.mu.Unlock()
	for _, old := range stale {
		old.closeIdle(math.MaxInt64)
	}
	return u
}

// removeLocked takes the pool of key out of m and byID; ps.mu must be
// held for writing.
func (ps *pools) removeLocked(key poolKey) {
	delete(ps.m, key)
	keys := ps.byID[key.id]
	if i := slices.Index(keys, key); i >= 0 {
		keys[i] = keys[len(keys)-1]
		keys = keys[:len(keys)-1]
	}
	if len(keys) == 0 {
		delete(ps.byID, key.id)
	} else {
		ps.byID[key.id] = keys
	}
}

// sweep closes keep-alive connections idle for longer than connIdle, or
// past their sandbox's Keep-Alive hint (takeExpired), and drops pools
// that have no connection and were unused for poolIdle. With one pool per
// sandbox there may be thousands: the map lock is held only to list and
// to delete, never across the closes.
//
// The closes are spread over spread (or until stop is closed), as nginx's
// per-connection timers spread them: a cold-start burst of sandboxes
// expires together, and closing thousands of connections in one go (each
// ≈ 10 µs on loopback) would hold the often only P for tens of
// milliseconds. runtime.Gosched would not help: the scheduler runs a
// yielded goroutine again before it polls the network, so every request
// waiting on a socket would wait for the end of the burst (or sysmon's
// 10 ms poll). Sleeping between closes lets the network be polled.
//
// The walk over the pools, and the drop of unused ones under the write
// lock, pause the same way every sweepChunk pools.
func (ps *pools) sweep(now time.Time, connIdle, poolIdle, spread time.Duration, stop <-chan struct{}) {
	connCutoff := now.Add(-connIdle).UnixNano()
	nowNanos := now.UnixNano()
	poolCutoff := now.Add(-poolIdle).UnixNano()
	pace := newPacer(stop)
	defer pace.stop()
	// Pools unused since poolCutoff may be dropped below: listed now, under
	// the read lock, so that the write lock is held only to check and drop
	// them, not to walk every pool again.
	type candidate struct {
		k poolKey
		u *upstream
	}
	var unused []candidate
	var stale []*upstreamConn
	chunk := make([]*upstream, 0, sweepChunk)
	takeIdle := func() {
		for i, u := range chunk {
			n := len(stale)
			stale = u.takeExpired(connCutoff, nowNanos, stale)
			// Out of the pool now: until closed they must not hold slots
			// of upstream.max_conns that requests would get 503 for.
			u.conns.Add(-int32(len(stale) - n))
			chunk[i] = nil
		}
		chunk = chunk[:0]
	}
	ps.walk(pace, func(k poolKey, u *upstream) bool {
		chunk = append(chunk, u)
		if u.lastUsed.Load() < poolCutoff {
			unused = append(unused, candidate{k, u})
		}
		return len(chunk) == sweepChunk
	}, takeIdle)

	pace.spreadOver(len(stale), spread)
	for i, c := range stale {
		pace.wait(i)
		_ = c.Close()
		stale[i] = nil
	}

	dead := chunk
	for len(unused) > 0 {
		batch := unused[:min(len(unused), sweepChunk)]
		unused = unused[len(batch):]
		ps.mu.Lock()
		for _, c := range batch {
			if ps.m[c.k] == c.u && c.u.lastUsed.Load() < poolCutoff && c.u.conns.Load() == 0 {
				c.u.dead.Store(true)
				ps.removeLocked(c.k)
				dead = append(dead, c.u)
			}
		}
		ps.mu.Unlock()
		// A request that took the pool just before it was deleted looks
		// again (get); one that took it before a kill may still release
		// a connection on it: put sees dead and closes it.
		for i, u := range dead {
			u.closeIdle(now.UnixNano() + 1)
			dead[i] = nil
		}
		dead = dead[:0]
		if len(unused) > 0 {
			pace.pause()
		}
	}
}

// sweepChunk is how many pools a sweep walks, or drops under the write
// lock, between two pauses. A cold-start burst leaves tens of thousands
// of pools (one per sandbox, dropped two idle timeouts after their last
// request), and walking 25,000 in one go held the only P for ≈ 5 ms, and
// dropping 2,500 held the write lock, which every new pool waits for,
// for ≈ 2 ms, at every quarter-second tick of a cold-start burst.
const sweepChunk = 256

// pacer spreads n steps evenly over a duration: wait(i) returns once
// step i is due, sleeping at least sweepPause at a time (shorter sleeps
// are not kept by the timer), so late wake-ups are caught up by running
// several steps in a row. Once stop is closed every step is due, and
// pause no longer sleeps.
type pacer struct {
	n       int
	spread  time.Duration
	start   time.Time
	stopCh  <-chan struct{}
	stopped bool
	t       *time.Timer
	steps   int // calls of step
}

func newPacer(stop <-chan struct{}) *pacer {
	return &pacer{stopCh: stop}
}

// spreadOver makes wait spread n steps over spread, from now.
func (p *pacer) spreadOver(n int, spread time.Duration) {
	p.n, p.spread, p.start = n, spread, time.Now()
}

func (p *pacer) wait(i int) {
	for !p.stopped && p.spread > 0 && i >= p.due() {
		p.pause()
	}
}

// pause sleeps sweepPause, so that the scheduler polls the network
// meanwhile, unless stop is closed.
func (p *pacer) pause() {
	if p.stopped {
		return
	}
	if p.t == nil {
		p.t = time.NewTimer(sweepPause)
	} else {
		p.t.Reset(sweepPause)
	}
	select {
	case <-p.t.C:
	case <-p.stopCh:
		p.stopped = true
	}
}

// step pauses at every sweepChunk-th call: for a walk over a sync.Map,
// which can pause inside its Range but not stop and resume.
func (p *pacer) step() {
	if p.steps++; p.steps%sweepChunk == 0 {
		p.pause()
	}
}

// due is how many steps should have run by now (at least one).
func (p *pacer) due() int {
	return int(int64(p.n)*int64(time.Since(p.start))/int64(p.spread)) + 1
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}

// gauges reports the number of pools and of the connections idle in them,
// for the metrics. The idle lists are counted, not open connections less
// the busy ones: a connection is busy from the moment a request takes it
// (or starts to open it) until it is given back, while it sends an upload,
// reads a small answer or is being connected, not only while a request
// waits for a response head, a body streams or a tunnel holds it. A lock
// per pool, at scrape time only. As the sweep does, the walk lets go of
// the map's lock every sweepChunk pools: 100k pools in one go held it
// ≈ 8 ms, and a new pool waiting for it held up every request's lookup.
func (ps *pools) gauges() (pools, idle int) {
	ps.mu.RLock()
	i := 0
	for _, u := range ps.m {
		u.mu.Lock()
		idle += len(u.idle)
		u.mu.Unlock()
		if i++; i%sweepChunk == 0 {
			ps.mu.RUnlock()
			runtime.Gosched()
			ps.mu.RLock()
		}
	}
	pools = len(ps.m)
	ps.mu.RUnlock()
	return pools, idle
}

// closeIdle closes every idle connection (shutdown).
func (ps *pools) closeIdle() {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	for _, u := range ps.m {
		u.closeIdle(time.Now().UnixNano() + 1)
	}
}

// shedOnShortage is how many idle connections a connect that found the
// process out of descriptors closes before it tries again: one for itself,
// the rest for the requests and accepts that are short of one too.
const shedOnShortage = 16

// shedIdle closes up to n idle keep-alive connections, each pool's
// least recently used first, and returns how many it closed. A connect
// that failed with the process out of descriptors calls it: an idle
// connection is only a cache of a connect, and with one pool per sandbox
// a node that served many sandboxes once holds a descriptor for each
// until upstream.idle_conn_timeout, while the request that needs one
// fails. A walk that finds none is not repeated within the second, so
// that a flood of such connects does not walk every pool each.
func (ps *pools) shedIdle(n int) int {
	now := time.Now().UnixNano()
	if now-ps.shedEmpty.Load() < int64(time.Second) {
		return 0
	}
	type victim struct {
		u *upstream
		c *upstreamConn
	}
	var victims []victim
	ps.mu.RLock()
	for _, u := range ps.m {
		u.mu.Lock()
		k := min(n-len(victims), len(u.idle))
		for _, c := range u.idle[:k] {
			victims = append(victims, victim{u, c})
		}
		u.idle = append(u.idle[:0], u.idle[k:]...)
		clear(u.idle[len(u.idle):cap(u.idle)])
		u.mu.Unlock()
		if len(victims) == n {
			break
		}
	}
	ps.mu.RUnlock()
	if len(victims) == 0 {
		ps.shedEmpty.Store(now)
	}
	for _, v := range victims {
		v.u.drop(v.c)
	}
	return len(victims)
}

// ShedIdle closes up to 16 idle keep-alive sandbox connections, as a
// sandbox connect that finds no descriptor does, and returns how many it
// closed; none once the drain has aborted the pools. The route store's
// dial calls it when it finds no descriptor (redisstore.Config.OnShortage).
func (p *Proxy) ShedIdle() int {
	if p.pools.aborted.Load() {
		return 0
	}
	return p.pools.shedIdle(shedOnShortage)
}

// abort closes every connection checked out of a pool, at the drain
// deadline: a request waiting for its answer's head, sending its upload,
// or reading a small body whole then fails at once with errDrainCut (and
// is answered, logged and counted), instead of at its own timeout, which
// may be hours away. Streams and tunnels are the registry's to cut; their
// connections, closed twice, come to no harm. Whatever is checked out
// later is refused (checkOut).
func (ps *pools) abort() {
	ps.aborted.Store(true)
	ps.cancelDials()
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	for _, u := range ps.m {
		u.mu.Lock()
		for c := u.busy; c != nil; c = c.busyNext {
			c.cutUnder()
		}
		u.mu.Unlock()
	}
}

// errInterrupted is a read of a sandbox connection the proxy shut under
// its exchange (wake): what a read of the closed connection
// would have failed with, not the sandbox's end of input.
var errInterrupted = fmt.Errorf("sandbox connection shut by the proxy: %w", net.ErrClosed)

// errDrainCut is the failure of an exchange whose sandbox connection the
// drain deadline closed (pools.abort).
var errDrainCut = errors.New("sandbox connection closed at the drain deadline")

// checkOut lists c as busy; u.mu must be held. It reports false when the
// drain deadline has passed: c is then the caller's to drop with checkIn.
func (u *upstream) checkOut(c *upstreamConn, ps *pools) bool {
	c.busyPrev, c.busyNext = nil, u.busy
	if u.busy != nil {
		u.busy.busyPrev = c
	}
	u.busy = c
	if u.killed.Load() {
		c.killed.Store(true)
		c.interrupted.Store(true)
		return false
	}
	if ps.aborted.Load() {
		c.interrupted.Store(true)
		return false
	}
	return true
}

// kill ends every exchange with sandbox id created at or before killedAt
// (unix nanos, the kill's time): its pools leave the map, their idle
// connections close, and each connection checked out of them (a request
// waiting for its answer's head, a stream, a WebSocket's before its 101)
// is closed under its exchange, which fails with errSandboxKilled (one a
// route change or the drain deadline cut first keeps that cut's cause). A
// killed VM's connections often neither close nor reset (its address
// stops answering), so they would otherwise be held until their idle
// timeout. A sandbox recreated under the id after the kill (a later
// CreatedAt) keeps its pools, as serve keeps serving it. Its WebSocket
// tunnels are cut too, from the pools' own lists: walking every tunnel of
// the instance, under the lock every stream and tunnel registers with, took
// ≈ 1 ms per kill at 10k open WebSockets, at the platform's 100-300 kills
// a second.
func (ps *pools) kill(id string, killedAt int64) {
	var doomed []*upstream
	ps.mu.Lock()
	for _, k := range slices.Clone(ps.byID[id]) { // removeLocked edits the list
		if k.createdAt <= killedAt {
			u := ps.m[k]
			// Before the busy lists are walked: what checkOut lists later
			// sees it (both under u.mu).
			u.killed.Store(true)
			u.dead.Store(true) // released connections close (put)
			ps.removeLocked(k)
			doomed = append(doomed, u)
		}
	}
	ps.mu.Unlock()
	for _, u := range doomed {
		u.mu.Lock()
		// One cut already (a route change, the drain deadline) or whose
		// client left keeps its first cut's cause (rejudge).
		for c := u.busy; c != nil; c = c.busyNext {
			if !c.interrupted.Load() {
				c.killed.Store(true)
				c.cutUnder()
			}
		}
		for t := u.tunnels; t != nil; t = t.poolNext {
			if !t.isCut() {
				t.killed.Store(true)
				t.close()
			}
		}
		u.mu.Unlock()
		u.closeIdle(math.MaxInt64)
	}
}

// errSandboxKilled is the failure of an exchange whose sandbox connection
// a kill closed (pools.kill).
var errSandboxKilled = errors.New("sandbox killed: its connection was closed")

// cutErr is the failure of an exchange whose connection the proxy closed
// under it (interrupted): a kill's, a route change's (rejudge), or else the
// drain deadline's.
func (c *upstreamConn) cutErr() error {
	if c.killed.Load() {
		return errSandboxKilled
	}
	if why := c.changed.Load(); why != cutNone {
		return changedErr(why)
	}
	return errDrainCut
}

// checkIn takes c off the busy list (a no-op when it is not on it); u.mu
// must be held.
func (u *upstream) checkIn(c *upstreamConn) {
	if c.busyPrev != nil {
		c.busyPrev.busyNext = c.busyNext
	} else if u.busy == c {
		u.busy = c.busyNext
	} else {
		return
	}
	if c.busyNext != nil {
		c.busyNext.busyPrev = c.busyPrev
	}
	c.busyPrev, c.busyNext = nil, nil
}

// walk calls visit for every pool, under the map's read lock, and flush
// without it whenever visit says its chunk is full and once at the end,
// pausing (pace) before the walk goes on: with one pool per sandbox there
// may be tens of thousands, and one stretch under the lock held the often
// only P (and the write lock new pools wait for) for milliseconds. The
// walk goes on after the pause: a map may be changed between two steps of
// a range over it (the spec says what the loop then sees), and the lock
// orders those changes with the loop's reads.
func (ps *pools) walk(pace *pacer, visit func(poolKey, *upstream) (full bool), flush func()) {
	ps.mu.RLock()
	for k, u := range ps.m {
		if visit(k, u) {
			ps.mu.RUnlock()
			flush()
			pace.pause()
			ps.mu.RLock()
		}
	}
	ps.mu.RUnlock()
	flush()
}

// sweepPause is the shortest sleep between closes. It must outlast a
// scheduling round, so that the scheduler finds the sweep's timer not yet
// fired and polls the network; longer than that it only trades wake-ups
// (one per pause) against how many closes run in a row (≈ 10 µs each).
const sweepPause = 200 * time.Microsecond

// closeIdle closes the idle connections last used before cutoff (unix
// nanos).
func (u *upstream) closeIdle(cutoff int64) {
	for _, c := range u.takeIdle(cutoff, nil) {
		u.drop(c)
	}
}

// takeIdle moves the idle connections last used before cutoff (unix
// nanos) from the idle list to the end of stale, for the caller to drop.
func (u *upstream) takeIdle(cutoff int64, stale []*upstreamConn) []*upstreamConn {
	return u.takeExpired(cutoff, 0, stale)
}

// takeExpired is takeIdle, and also takes the connections idle, by now
// (unix nanos; 0: none of these), at least as long as their sandbox's
// Keep-Alive hint lets them be reused (reuseWithin): never reused again
// and closed by the sandbox about then, each otherwise held a descriptor
// in CLOSE_WAIT until cutoff. Those are anywhere in the list (hints
// differ), so it is filtered in place: no allocation, the order (newest
// last) kept, and nothing written when nothing is taken.
func (u *upstream) takeExpired(cutoff, now int64, stale []*upstreamConn) []*upstreamConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	kept := 0
	for i, c := range u.idle {
		if c.idleSince < cutoff || (now > 0 && c.reuseWithin > 0 && now-c.idleSince >= c.reuseWithin) {
			stale = append(stale, c)
			continue
		}
		if kept != i {
			u.idle[kept] = c
		}
		kept++
	}
	if kept == len(u.idle) {
		return stale
	}
	clear(u.idle[kept:])
	u.idle = u.idle[:kept]
	return stale
}

// errNoFreeConns: the pool is at upstream.max_conns.
var errNoFreeConns = errors.New("no free upstream connections")

// acquire returns a usable idle connection (reused true) or, when there is
// none or fresh is set, dials a new one. Every idle connection is peeked
// before reuse, however recently it was released: bytes the backend sent
// after its answer (a second response, a body longer than its framing,
// Python's http.server answering HEAD with a body) would otherwise be read
// as this request's answer, and its own answer as the next one's, for as
// long as the connection is reused (one non-blocking syscall, ≈ 0.3 µs).
//
// client is the request's connection, for dial (nil: none).
func (u *upstream) acquire(p *Proxy, fresh bool, g grant, client net.Conn) (c *upstreamConn, reused bool, err error) {
	var now, expired int64
	if !fresh {
		now = time.Now().UnixNano()
		expired = now - int64(p.cfg.UpstreamIdleConnTimeout)
	}
	for !fresh {
		u.mu.Lock()
		n := len(u.idle)
		if n == 0 {
			u.mu.Unlock()
			break
		}
		if u.idle[n-1].idleSince < expired {
			// Idle past upstream.idle_conn_timeout, and so are the others
			// (the newest is last): the janitor, which runs only every
			// quarter of it, has yet to close them. Reused, they met the
			// sandbox server's own keep-alive timeout the operator set the
			// timeout under, and a POST sent into its close got a 502.
			u.mu.Unlock()
			u.closeIdle(expired)
			break
		}
		c = u.idle[n-1]
		u.idle[n-1] = nil
		u.idle = u.idle[:n-1]
		if c.reuseWithin > 0 && now-c.idleSince >= c.reuseWithin {
			// Idle close to the timeout the sandbox announced (Keep-Alive:
			// timeout=N, keepAliveReuse): it closes the connection about
			// now, and a request sent into that close gets a 502.
			u.mu.Unlock()
			u.drop(c)
			continue
		}
		c.grant = g
		ok := u.checkOut(c, &p.pools) // under the lock taken anyway
		u.mu.Unlock()
		if !ok {
			u.dropBusy(c)
			return nil, false, c.cutErr()
		}
		if c.idleOK() {
			return c, true, nil // a close racing us is roundTrip's retry
		}
		// The backend closed it, or sent bytes nobody asked for (say a 408
		// before closing): they must not be read as the next answer.
		u.dropBusy(c)
	}
	c, err = u.dialNew(p, g, client)
	return c, false, err
}

// dialNew opens a new connection of this pool, within upstream.max_conns.
// At the limit, the oldest idle connection gives up its slot: a WebSocket
// tunnel (which never takes an idle connection) would otherwise be
// refused while keep-alive connections nobody uses hold every slot.
// client is the request's connection, for dial (nil: none).
func (u *upstream) dialNew(p *Proxy, g grant, client net.Conn) (*upstreamConn, error) {
	for int(u.conns.Add(1)) > p.cfg.MaxConnsPerUpstream { // int: a huge max_conns must not wrap
		u.conns.Add(-1)
		u.mu.Lock()
		if len(u.idle) == 0 {
			u.mu.Unlock()
			return nil, errNoFreeConns
		}
		c := u.idle[0]
		u.idle = append(u.idle[:0], u.idle[1:]...)
		clear(u.idle[len(u.idle):cap(u.idle)])
		u.mu.Unlock()
		u.drop(c)
	}
	c, err := p.dial(u.addr, client)
	if err != nil {
		u.conns.Add(-1)
		return nil, err
	}
	c.pool = u
	u.mu.Lock()
	c.grant = g
	ok := u.checkOut(c, &p.pools)
	u.mu.Unlock()
	if !ok {
		u.dropBusy(c)
		return nil, c.cutErr()
	}
	return c, nil
}

// put returns a connection whose exchange ended cleanly to the idle list.
func (u *upstream) put(c *upstreamConn) {
	c.idleSince = time.Now().UnixNano()
	u.mu.Lock()
	u.checkIn(c)
	c.grant = grant{} // an idle connection keeps no route alive
	if u.dead.Load() {
		u.mu.Unlock()
		u.drop(c)
		return
	}
	u.idle = append(u.idle, c)
	u.mu.Unlock()
}

// drop closes a connection that must not be reused.
func (u *upstream) drop(c *upstreamConn) {
	_ = c.Close()
	u.conns.Add(-1)
}

// dropBusy closes a checked-out connection that must not be reused.
func (u *upstream) dropBusy(c *upstreamConn) {
	u.mu.Lock()
	u.checkIn(c)
	u.mu.Unlock()
	u.drop(c)
}

// cutUnder closes c under its exchange, which the caller has marked as
// a kill's or a route change's cut (or neither: the drain deadline's). It
// is never pooled, and an exchange blocked reading its client's body, not
// writing here, is woken: a client that stalled mid-upload would keep it,
// and the sandbox's slot, until client.body_timeout. u.mu must be held
// (c.upload).
func (c *upstreamConn) cutUnder() {
	c.interrupted.Store(true)
	_ = c.Conn.Close()
	if c.upload != nil {
		_ = c.upload.ctx.SetReadDeadline(time.Now())
	}
}

// setUpload records (or with nil, forgets) the client body that c is
// sending, for cutUnder to wake the read of a stalled client.
func (u *upstream) setUpload(c *upstreamConn, b *clientBody) {
	if b != nil {
		b.cut = &c.interrupted
		b.answered = &c.answered
	}
	u.mu.Lock()
	c.upload = b
	u.mu.Unlock()
}

// handOff takes a checked-out connection off the busy list, still counted
// in the pool: a WebSocket tunnel's, which the registry cuts from now on.
// It returns what the exchange was let through on, as rejudge last left
// it (read under the lock rejudge writes it under).
func (u *upstream) handOff(c *upstreamConn) grant {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.checkIn(c)
	return c.grant
}
