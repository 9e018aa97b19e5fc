package proxy

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
)

// Sandbox states set through POST /admin/state (and "killed" by
// /admin/meta/delete). The zero value is running. stateGone is no state a
// sandbox has: it marks an entry forget or sweep took out of the map
// (sandboxes.retire), which nothing may count on or change any more.
const (
	stateRunning uint32 = iota
	statePausing
	statePaused
	stateKilled
	stateGone
)

var stateNames = [...]string{"running", "pausing", "paused", "killed", "gone"}

func parseState(s string) (uint32, bool) {
	for i, n := range stateNames[:3] {
		if s == n {
			return uint32(i), true
		}
	}
	return 0, false
}

// sandboxState is what the proxy itself knows about one sandbox: the
// lifecycle state the control plane told it, when it last saw traffic
// (GET /admin/last_active) and how many requests are in flight (the
// per-sandbox limit). One map lookup per request serves all three.
type sandboxState struct {
	// word holds the state and the count of requests in flight, and a
	// generation that every change of either bumps, so that one
	// compare-and-swap can take the entry out of the map only if nothing
	// happened to it since it was judged forgettable (sandboxes.retire):
	//
	//	bits  0-7   the state (stateRunning .. stateGone)
	//	bits  8-31  requests in flight, a signed 24-bit count
	//	bits 32-63  the generation; it wraps
	//
	// 2^23 requests in flight for one sandbox is far above what an
	// instance's file descriptors allow. An unmatched leave would make
	// the count -1 (as the separate counter it replaces did) without
	// bumping the generation; the next enter carries into it.
	word      atomic.Uint64
	changedAt atomic.Int64 // unix nanos of the last state change
	// resumedAt: unix nanos of the last change from pausing or paused to
	// running, from which the sandbox's open streams count their idle
	// timeout afresh (bodyStream.pausedIdle). Not changedAt: running sent
	// again for a running sandbox (a control plane's periodic sync) is a
	// change of its time, and gave every silent stream a fresh timeout.
	resumedAt  atomic.Int64
	lastActive atomic.Int64 // unix millis
	// unsure: the sandbox's route was invalidated while it was running,
	// or its pause is older than the sweep's idle time; the janitor asks
	// whether it still exists (Proxy.recheckInvalidated).
	unsure atomic.Bool
	// pauseChecked: unix nanos of the sweep that last marked a paused
	// sandbox unsure, so that a long pause costs one read of its route
	// per sweep idle time, not one a minute (an unanswered read is
	// retried each round while unsure stays set).
	pauseChecked atomic.Int64
	// held counts the bytes of the bodies read whole for the
	// sandbox's requests over max_streams_per_sandbox (readHeldBody),
	// against Config.HeldBodyPerSandbox: its share of HeldBodyBudget. It
	// lives outside word: it bounds memory, not requests, and the entry
	// it was taken on gets it back (exchange.heldOn), even one forgotten
	// meanwhile.
	held atomic.Int64
	// rereads is Invalidate's re-read of a paused sandbox's route: 0
	// none, 1 one in flight, 2 one in flight and another asked for by an
	// invalidation that came during it (askReread, rereadDone).
	rereads atomic.Int32
	// resumeLogged limits a failed resume's log line, so that a sandbox
	// the lifecycle manager cannot resume logs once a second, not once
	// per request.
	resumeLogged loglimit.Limit
}

// askReread asks for a re-read of the sandbox's route and reports whether
// the caller is to start it: none is in flight. Otherwise the one in
// flight is followed by one more, however many invalidations asked: it
// may have read the route before the change they announce.
func (e *sandboxState) askReread() bool {
	for {
		switch e.rereads.Load() {
		case 0:
			if e.rereads.CompareAndSwap(0, 1) {
				return true
			}
		case 1:
			if e.rereads.CompareAndSwap(1, 2) {
				return false
			}
		default:
			return false
		}
	}
}

// rereadDone ends a re-read and reports whether another was asked for
// meanwhile, which the caller then makes.
func (e *sandboxState) rereadDone() bool {
	if e.rereads.CompareAndSwap(1, 0) {
		return false
	}
	// 2: only rereadDone changes it from there.
	e.rereads.Store(1)
	return true
}

const (
	stateMask = 1<<8 - 1
	countUnit = 1 << 8
	genUnit   = 1 << 32
)

func stateOf(w uint64) uint32 { return uint32(w & stateMask) }

func countOf(w uint64) int64 { return int64(int32(uint32(w)) >> 8) }

// withState is w with state st and the next generation.
func withState(w uint64, st uint32) uint64 { return (w&^stateMask | uint64(st)) + genUnit }

// state returns the sandbox's state (stateGone once forgotten).
func (e *sandboxState) state() uint32 { return stateOf(e.word.Load()) }

// inFlight returns how many of the sandbox's requests are in flight.
func (e *sandboxState) inFlight() int64 { return countOf(e.word.Load()) }

// enter counts a request in and returns the count with it. It fails on
// an entry forgotten since the caller looked it up: the caller looks the
// sandbox up again (sandboxes.get gives a live entry) and counts there,
// or its count would sit on an entry no other request sees.
func (e *sandboxState) enter() (int64, bool) {
	w := e.word.Add(countUnit)
	if stateOf(w) == stateGone {
		e.leave()
		return 0, false
	}
	return countOf(w), true
}

// leave counts a request out. It bumps the generation too: a request
// that began and ended while the sweep judged the entry idle (its
// lastActive read before the request's) must make the sweep's retire
// fail, though the count is back where it was.
func (e *sandboxState) leave() { e.word.Add(genUnit - countUnit) }

// setState sets the state to st; it fails only on an entry forgotten.
func (e *sandboxState) setState(st uint32) bool {
	for {
		w := e.word.Load()
		if stateOf(w) == stateGone {
			return false
		}
		if e.word.CompareAndSwap(w, withState(w, st)) {
			return true
		}
	}
}

// casState sets the state to to if it is from, and reports whether it did.
func (e *sandboxState) casState(from, to uint32) bool {
	for {
		w := e.word.Load()
		if stateOf(w) != from {
			return false
		}
		if e.word.CompareAndSwap(w, withState(w, to)) {
			return true
		}
	}
}

// sandboxes maps sandbox id -> *sandboxState.
//
// Entries leave the map without a lock (forget, sweep), and every other
// user changes them without one; what keeps a change from landing on an
// entry that is leaving is the entry's word. retire takes an entry out
// in two steps: a compare-and-swap of the word seen when the entry was
// judged forgettable to one in stateGone, then the map's delete of that
// entry. The word changes with every state change (setState, casState,
// unkill) and every request's start and end (enter, leave), so:
//
//   - a change before the swap makes it fail: retire looks again, and
//     finds a kill, a pause or a request to keep the entry for;
//   - a change after the swap finds stateGone: a request's enter fails
//     and it looks the id up again, a state change retries on a fresh
//     entry (sandboxes.setState), an un-kill is a request's and retries
//     with it. get never returns an entry in stateGone: it deletes one it
//     finds (helping its retire along) and stores a fresh one.
//
// lastActive and changedAt sit outside the word; their writers order
// them against it: a request stores lastActive after its enter and
// before its leave, setState stores changedAt before its swap, and
// retire reads them after the word it swaps from. A write retire did not
// see is followed by a change of the word: before retire's swap, the
// swap fails; after it, the writer retries on a fresh entry.
type sandboxes struct {
	m sync.Map
	// beforeRetire, for tests, runs between retire's reading of an entry
	// and its swap, where a concurrent kill or request lands; nil in
	// production.
	beforeRetire func(id string)
	// beforeUnkill, for tests, runs between unkill's judging of a kill's
	// time and its swap, where another kill lands; nil in production.
	beforeUnkill func()
	// beforeLiftKill, for tests, runs between liftKill's finding the
	// sandbox killed and its swap, where a state change lands; nil in
	// production.
	beforeLiftKill func()
}

// get returns the state for id without allocating when it exists. id may
// alias a request buffer: the key is copied only when a new entry is stored.
func (s *sandboxes) get(id []byte) *sandboxState {
	key := unsafe.String(unsafe.SliceData(id), len(id))
	if v, ok := s.m.Load(key); ok {
		e := v.(*sandboxState)
		if e.state() != stateGone {
			return e
		}
		s.m.CompareAndDelete(key, e)
	}
	for {
		v, _ := s.m.LoadOrStore(string(id), new(sandboxState))
		e := v.(*sandboxState)
		if e.state() != stateGone {
			return e
		}
		s.m.CompareAndDelete(key, e)
	}
}

// peek returns the state for id, or nil.
func (s *sandboxes) peek(id string) *sandboxState {
	if v, ok := s.m.Load(id); ok {
		return v.(*sandboxState)
	}
	return nil
}

// setState sets id's state and returns the time of the change (unix nanos).
func (s *sandboxes) setState(id string, st uint32) int64 {
	for {
		e := s.get([]byte(id))
		// The time first: a request that sees the new state must see its
		// time too. serve un-kills a killed sandbox whose route is newer
		// than changedAt, so a kill read with an older time (0 for a
		// sandbox never changed before) would be undone by the killed
		// sandbox's own traffic.
		now := time.Now().UnixNano()
		e.changedAt.Store(now)
		if st == stateRunning {
			if cur := e.state(); cur == statePausing || cur == statePaused {
				// Before the swap, as changedAt; a swap that then fails
				// leaves a time at most one idle timeout of a stream's.
				e.resumedAt.Store(now)
			}
		}
		if e.setState(st) {
			return now
		}
		// Forgotten between get and the swap: the change goes to the
		// entry that replaces it.
	}
}

// unkill makes e, killed, running again for a request whose route was
// created at createdAt, after the kill: a sandbox re-created under the
// id. It reports false when the kill stands. The swap is from the word
// the kill's time was judged with: a kill that lands after that look (a
// kill of the re-created sandbox, newer than its route) changes the word
// and is judged in turn, where a swap from any killed word would undo it.
// True also means that e is no longer killed for another reason (un-killed
// by another request, paused, forgotten): the caller looks again.
func (s *sandboxes) unkill(e *sandboxState, createdAt int64) bool {
	return s.outlive(e, stateKilled, createdAt)
}

// outlive makes e, in state st (killed, pausing or paused), running for a
// request whose route was created at createdAt, after st was set: a
// sandbox re-created under the id. It reports false when st stands, and
// true as unkill does. A pause ends too when this instance reads the
// route gone (Invalidate, a lookup), but one that never did kept the old
// sandbox's pause for the new one: the delete's invalidation missed while
// unsubscribed, or the delete and the new route announced together, so
// that the re-read found the new route.
func (s *sandboxes) outlive(e *sandboxState, st uint32, createdAt int64) bool {
	for {
		w := e.word.Load()
		if stateOf(w) != st {
			return true
		}
		// After the word: setState stores the time before its swap.
		if createdAt <= e.changedAt.Load() {
			return false
		}
		if s.beforeUnkill != nil {
			s.beforeUnkill()
		}
		if e.word.CompareAndSwap(w, withState(w, stateRunning)) {
			return true
		}
	}
}

// liftKill makes id running if it is killed: a route stored again is a
// re-created sandbox, no longer killed. The swap is from the killed word
// it looked at: a state set since (a pause through /admin/state) is the
// control plane's later word and stands, where a set after a look
// replaced it with running while both calls answered 200.
func (s *sandboxes) liftKill(id string) {
	e := s.peek(id)
	if e == nil {
		return
	}
	for {
		w := e.word.Load()
		if stateOf(w) != stateKilled {
			return // also when forgotten: a fresh entry is running
		}
		if s.beforeLiftKill != nil {
			s.beforeLiftKill()
		}
		// The time before the swap, as setState: a request that sees the
		// state sees its time. Stored by a swap that then fails, it is a
		// little later than the state set since, which only keeps that
		// state from a forget that began before it.
		e.changedAt.Store(time.Now().UnixNano())
		if e.word.CompareAndSwap(w, withState(w, stateRunning)) {
			return
		}
	}
}

// retire takes id's entry e out of the map unless keep, asked with the
// word read just before (and reading e's other fields after it), says it
// stays; it reports whether it did.
func (s *sandboxes) retire(id string, e *sandboxState, keep func(w uint64, e *sandboxState) bool) bool {
	for {
		w := e.word.Load()
		if stateOf(w) == stateGone || keep(w, e) {
			return false
		}
		if s.beforeRetire != nil {
			s.beforeRetire(id)
		}
		if e.word.CompareAndSwap(w, withState(w, stateGone)) {
			s.m.CompareAndDelete(id, e)
			return true
		}
	}
}

// kill marks sandbox id killed, so that new requests get 410, and ends
// what the sandbox (as created before the kill) still has open on this
// instance: streams, WebSockets, requests waiting for their answer or for
// the sandbox's resume call. The VM is gone, and its connections may never
// close on their own.
func (p *Proxy) kill(id string) {
	killedAt := p.sandboxes.setState(id, stateKilled)
	p.pools.kill(id, killedAt)
	if p.resumer != nil {
		// After the state: the requests the cut call lets go find the kill.
		p.resumer.kill(id)
	}
}

// done counts one of the sandbox's requests finished at unix millis ms.
// The time goes first, and lastActive reads the count first: a poll that
// finds the request done finds its time too, never neither.
func (e *sandboxState) done(ms int64) {
	e.lastActive.Store(ms)
	e.leave()
}

// appendLastActive appends the JSON members "<id>":<ms>, comma-separated,
// of the sandboxes active at or after since (unix millis) to dst, and
// returns dst with their count; a killed sandbox is not listed. A sandbox
// with a request or stream still open is active now (unix millis): an SSE or WebSocket session may last
// hours after the request that opened it, and an idle reaper must not
// pause the sandbox under it.
//
// It writes the answer directly rather than through a map and
// encoding/json, which sorts the keys and allocates twice per entry: at
// 100k sandboxes (a poll every few seconds) that took ≈ 570 ms of CPU and
// 200k allocations a poll on a loaded 2-core machine, against ≈ 150 ms
// (mostly the walk itself) and ≈ 40 allocations.
//
// It pauses every sweepChunk entries, as the janitor does: at 100k
// sandboxes the walk takes 20-45 ms of CPU, which with one P held every
// request that long.
func (s *sandboxes) appendLastActive(dst []byte, since, now int64) ([]byte, int) {
	n := 0
	pace := newPacer(nil)
	defer pace.stop()
	s.m.Range(func(k, v any) bool {
		pace.step()
		e := v.(*sandboxState)
		// The count first (see done): read the other way round, the time
		// could be read while a request was in flight (its start) and the
		// count once it was done.
		w := e.word.Load()
		if st := stateOf(w); st == stateGone || st == stateKilled {
			// A kill's tombstone keeps the 410, not the activity: the
			// sandbox is gone, as one whose route was deleted (forget).
			return true
		}
		ts := now
		if countOf(w) <= 0 {
			ts = e.lastActive.Load()
		}
		if ts >= since && ts > 0 {
			if n > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k.(string))
			dst = append(dst, ':')
			dst = strconv.AppendInt(dst, ts, 10)
			n++
		}
		return true
	})
	return dst, n
}

// forget drops id's entry once its route was deleted: its pause state
// and last activity describe a sandbox that no longer exists, and a route
// stored again under the id is a new sandbox. A kill's tombstone stays
// (410 for its hour). An entry with requests in flight stays too, for the
// count max_streams_per_sandbox still needs, but loses its pause: the
// sweep forgets a paused entry only through here (it marks an old one for
// recheckInvalidated), and a running one a day after its
// last request.
//
// since (unix nanos) is when the store read that found the route gone
// began: a state set at or after it (setState stores the time before its
// swap) is newer than that read, given for a route stored since, and
// stays. A request that read "no route" just before the sandbox's route
// was stored and its pause set otherwise forgot the pause as it ended.
func (s *sandboxes) forget(id string, since int64) {
	v, ok := s.m.Load(id)
	if !ok {
		return
	}
	e := v.(*sandboxState)
	keep := func(w uint64, e *sandboxState) bool {
		return killedOrBusy(w, e) || e.changedAt.Load() >= since
	}
	if s.retire(id, e, keep) {
		return
	}
	// A swap from the word the time was judged with, not a store: a kill
	// or a newer pause that lands meanwhile must stand.
	for {
		w := e.word.Load()
		if st := stateOf(w); st != statePausing && st != statePaused || e.changedAt.Load() >= since {
			return
		}
		if e.word.CompareAndSwap(w, withState(w, stateRunning)) {
			return
		}
	}
}

// killedOrBusy is what forget keeps: a kill's tombstone, and an entry
// whose requests in flight still count.
func killedOrBusy(w uint64, _ *sandboxState) bool {
	return stateOf(w) == stateKilled || countOf(w) > 0
}

// Invalidate drops id's cached route, for the Redis subscriber
// (redisstore.Invalidator): the control plane publishes the id of a
// sandbox it changed or removed, and every instance gets it. Most
// instances behind a balancer get no request for a given sandbox, and
// a sandbox removed without meta/delete kept its entry: a pause for ever,
// a running sandbox's entry (and its last_active line) for the day the
// sweep waits, one per sandbox removed: at the platform's 100-300 removals
// a second, millions of entries.
//
// A sandbox this instance holds paused is read again at once, in the
// background (cut short and waited for by Server.Shutdown, not started
// after it), and its pause forgotten when Redis no longer has its route
// (a sandbox created again under the id must not answer 503); a read
// that settles nothing leaves it marked for the janitor. One read per
// sandbox runs at a time, and invalidations during it make one more
// (askReread): whoever may PUBLISH can send an id a million times a
// second, and a goroutine and a store call each (every message drops the
// read in flight) made tens of thousands of both at once. A running
// one is only marked: the janitor asks about it within a minute
// (recheckInvalidated), by then from the cache when the sandbox had a
// request meanwhile, so that an invalidation does not make every instance
// read the route at once. A kill's tombstone stays, and is not read for.
//
// A sandbox with exchanges open on this instance (a request waiting for its
// answer, a stream, a WebSocket) is read again at once too, the same way,
// and what it has open judged against the route read (rejudge): a rotated
// token or a route made private must not leave an hour-long stream opened
// with the old credential relaying.
func (p *Proxy) Invalidate(id string) int {
	n := p.cache.Invalidate(id)
	if sb := p.sandboxes.peek(id); sb != nil {
		p.applyInvalidation(id, sb)
	}
	return n
}

// Paused reports whether the control plane marked sandbox id pausing or
// paused on this instance (POST /admin/state): it accepts no connection
// then, on any port, though a request for it is answered (503
// sandbox_pausing) or resumes it (lifecycle.sidecar_addr).
func (p *Proxy) Paused(id string) bool {
	sb := p.sandboxes.peek(id)
	if sb == nil {
		return false
	}
	st := sb.state()
	return st == statePausing || st == statePaused
}

// applyInvalidation is what Invalidate does to sandbox id's entry sb
// besides dropping the cached route.
func (p *Proxy) applyInvalidation(id string, sb *sandboxState) {
	w := sb.word.Load()
	switch stateOf(w) {
	case statePausing, statePaused:
		p.routeChanged(id, sb)
	case stateRunning:
		sb.unsure.Store(true)
		if countOf(w) > 0 {
			p.routeChanged(id, sb)
		}
	}
}

// routeWritten is Admin.invalidate's: the route of id was changed through
// this instance's admin API, the cached one dropped. What the sandbox has
// open here is judged against the new route at once, as Invalidate does.
// With the memory store (shared false) the rest of what Invalidate does
// the admin call does itself (a delete forgets the sandbox's state). With
// Redis (shared) the route changed in the store, as an announced id says,
// and this instance applies the change as it applies one (Invalidate): it
// relied on its own PUBLISH coming back to it, which never comes while
// its subscription is refused or being made again, and then kept the
// pause (and the last_active line) of a sandbox removed from Redis until
// the janitor's once-a-day read. A kill's tombstone is not read for.
func (p *Proxy) routeWritten(id string, shared bool) {
	sb := p.sandboxes.peek(id)
	if sb == nil {
		return
	}
	w := sb.word.Load()
	if shared && stateOf(w) != stateKilled {
		p.applyInvalidation(id, sb)
		return
	}
	if stateOf(w) != stateGone && countOf(w) > 0 {
		p.routeChanged(id, sb)
	}
}

// ExpireAll makes every cached route due for a re-read
// (redisstore.Invalidator); sandbox states stay.
func (p *Proxy) ExpireAll() int { return p.cache.ExpireAll() }

// recheckInvalidated forgets the running sandboxes whose route was
// invalidated (Invalidate), and the pauses sweep found old, whose route
// is no longer in the store, asking through
// the cache: a sandbox that had a request since is a hit, so only idle
// ones cost a store read, one after the other. It stops early when ctx
// ends; what it did not settle is asked about next time.
func (p *Proxy) recheckInvalidated(ctx context.Context) {
	var ids []string
	p.sandboxes.m.Range(func(k, v any) bool {
		e := v.(*sandboxState)
		if w := e.word.Load(); e.unsure.Load() && stateOf(w) != stateKilled && stateOf(w) != stateGone && countOf(w) <= 0 {
			ids = append(ids, k.(string))
		}
		return true
	})
	for _, id := range ids {
		if ctx.Err() != nil {
			return
		}
		// Cleared before the read: an invalidation during it marks the
		// sandbox again, for the next round.
		if sb := p.sandboxes.peek(id); sb != nil && sb.unsure.CompareAndSwap(true, false) && !p.rereadRoute(ctx, id) {
			sb.unsure.Store(true)
		}
	}
}

// sweep forgets running sandboxes idle for longer than idle, and killed
// tombstones older than killedTTL. A sandbox removed from the store is
// forgotten sooner (forget), when a request or, after an invalidation,
// recheckInvalidated finds its route gone.
//
// A pause is kept: it is the control plane's word, and a paused sandbox
// gets no requests. But one set that long ago and idle since is marked
// for recheckInvalidated, which forgets it if the store has no route: a
// pause set for an id that never had one (or whose route went without an
// invalidation reaching this instance) otherwise stayed for good.
//
// It pauses every sweepChunk entries (until stop is closed), as the pool
// sweep does, so that a day's worth of sandboxes is not walked in one go.
func (s *sandboxes) sweep(now time.Time, idle, killedTTL time.Duration, stop <-chan struct{}) {
	idleCut := now.Add(-idle).UnixMilli()
	pausedCut := now.Add(-idle).UnixNano()
	killedCut := now.Add(-killedTTL).UnixNano()
	keep := func(w uint64, e *sandboxState) bool {
		if countOf(w) > 0 {
			return true
		}
		switch stateOf(w) {
		case stateRunning:
			return e.lastActive.Load() >= idleCut
		case stateKilled:
			return e.changedAt.Load() >= killedCut
		case statePausing, statePaused:
			if max(e.changedAt.Load(), e.pauseChecked.Load()) < pausedCut && e.lastActive.Load() < idleCut {
				e.pauseChecked.Store(now.UnixNano())
				e.unsure.Store(true)
			}
		}
		return true
	}
	pace := newPacer(stop)
	defer pace.stop()
	s.m.Range(func(k, v any) bool {
		pace.step()
		s.retire(k.(string), v.(*sandboxState), keep)
		return true
	})
}

// background runs the store reads the proxy makes on its own, outside any
// request (Invalidate's re-read of a paused sandbox's route, the janitor's
// recheckInvalidated), so that Server.Shutdown can cut them short and wait
// for them: a read left running would outlive the Server by up to its
// timeout.
type background struct {
	mu      sync.Mutex // orders run's wg.Add before stop's wg.Wait
	stopped bool
	ctx     context.Context // ended by stop
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// run starts f in a goroutine, with a context that stop ends, unless stop
// was called.
func (b *background) run(f func(ctx context.Context)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	if b.ctx == nil {
		b.ctx, b.cancel = context.WithCancel(context.Background())
	}
	b.wg.Add(1)
	go func(ctx context.Context) {
		defer b.wg.Done()
		f(ctx)
	}(b.ctx)
}

// stop ends the context of what run started, waits for it to return, and
// makes run start nothing more. What was cut is asked about no more: the
// process is ending, and the proxy's memory with it.
func (b *background) stop() {
	b.mu.Lock()
	b.stopped = true
	if b.cancel != nil {
		b.cancel()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
