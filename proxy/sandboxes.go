package proxy

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// Sandbox states set through POST /admin/state (and "killed" by
// /admin/meta/delete). The zero value is running.
const (
	stateRunning uint32 = iota
	statePausing
	statePaused
	stateKilled
)

var stateNames = [...]string{"running", "pausing", "paused", "killed"}

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
	state      atomic.Uint32
	changedAt  atomic.Int64 // unix nanos of the last state change
	lastActive atomic.Int64 // unix millis
	active     atomic.Int64
	// unsure: the sandbox's route was invalidated while it was running;
	// the janitor asks whether it still exists (Proxy.recheckInvalidated).
	unsure atomic.Bool
}

// sandboxes maps sandbox id -> *sandboxState.
type sandboxes struct {
	m sync.Map
}

// get returns the state for id without allocating when it exists. id may
// alias a request buffer: the key is copied only when a new entry is stored.
func (s *sandboxes) get(id []byte) *sandboxState {
	if v, ok := s.m.Load(unsafe.String(unsafe.SliceData(id), len(id))); ok {
		return v.(*sandboxState)
	}
	v, _ := s.m.LoadOrStore(string(id), new(sandboxState))
	return v.(*sandboxState)
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
	e := s.get([]byte(id))
	// The time first: a request that sees the new state must see its time
	// too. serve un-kills a killed sandbox whose route is newer than
	// changedAt, so a kill read with an older time (0 for a sandbox never
	// changed before) would be undone by the killed sandbox's own traffic.
	now := time.Now().UnixNano()
	e.changedAt.Store(now)
	e.state.Store(st)
	return now
}

// kill marks sandbox id killed, so that new requests get 410, and ends
// what the sandbox (as created before the kill) still has open on this
// instance: streams, WebSockets, requests waiting for their answer. The
// VM is gone, and its connections may never close on their own.
func (p *Proxy) kill(id string) {
	killedAt := p.sandboxes.setState(id, stateKilled)
	p.pools.kill(id, killedAt)
}

// done counts one of the sandbox's requests finished at unix millis ms.
// The time goes first, and lastActive reads the count first: a poll that
// finds the request done finds its time too, never neither.
func (e *sandboxState) done(ms int64) {
	e.lastActive.Store(ms)
	e.active.Add(-1)
}

// appendLastActive appends the JSON members "<id>":<ms>, comma-separated,
// of the sandboxes active at or after since (unix millis) to dst, and
// returns dst with their count. A sandbox with a request or stream still
// open is active now (unix millis): an SSE or WebSocket session may last
// hours after the request that opened it, and an idle reaper must not
// pause the sandbox under it.
//
// It writes the answer directly rather than through a map and
// encoding/json, which sorts the keys and allocates twice per entry: at
// 100k sandboxes (a poll every few seconds) that took ≈ 570 ms of CPU and
// 200k allocations a poll on a loaded 2-core machine, against ≈ 150 ms
// (mostly the walk itself) and ≈ 40 allocations.
func (s *sandboxes) appendLastActive(dst []byte, since, now int64) ([]byte, int) {
	n := 0
	s.m.Range(func(k, v any) bool {
		e := v.(*sandboxState)
		// The count first (see done): read the other way round, the time
		// could be read while a request was in flight (its start) and the
		// count once it was done.
		ts := now
		if e.active.Load() <= 0 {
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
// sweep forgets a paused entry never, and a running one a day after its
// last request.
func (s *sandboxes) forget(id string) {
	v, ok := s.m.Load(id)
	if !ok {
		return
	}
	e := v.(*sandboxState)
	if e.state.Load() == stateKilled {
		return
	}
	if e.active.Load() <= 0 && s.m.CompareAndDelete(id, v) {
		return
	}
	// A swap, not a store: a kill that lands meanwhile must stand.
	for st := e.state.Load(); st == statePausing || st == statePaused; st = e.state.Load() {
		if e.state.CompareAndSwap(st, stateRunning) {
			return
		}
	}
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
// background, and its pause forgotten when Redis no longer has its route
// (a sandbox created again under the id must not answer 503). A running
// one is only marked: the janitor asks about it within a minute
// (recheckInvalidated), by then from the cache when the sandbox had a
// request meanwhile, so that an invalidation does not make every instance
// read the route at once. A kill's tombstone stays, and is not read for.
func (p *Proxy) Invalidate(id string) int {
	n := p.cache.Invalidate(id)
	if sb := p.sandboxes.peek(id); sb != nil {
		switch sb.state.Load() {
		case statePausing, statePaused:
			go p.forgetIfGone(id)
		case stateRunning:
			sb.unsure.Store(true)
		}
	}
	return n
}

// ExpireAll makes every cached route due for a re-read
// (redisstore.Invalidator); sandbox states stay.
func (p *Proxy) ExpireAll() int { return p.cache.ExpireAll() }

// forgetIfGone forgets id when the store says it has no route for it. It
// reports whether the answer settles the question: not when the store
// could not answer, nor from the negative cache, whose answer may predate
// a route written since. The cache bounds the read (LookupTimeout) and
// shares it with requests for id.
func (p *Proxy) forgetIfGone(id string) bool {
	_, res, err := p.cache.Get(context.Background(), []byte(id))
	var fe *routing.FieldError
	switch {
	case err == nil:
		return true
	case res != routing.CacheMiss:
		return false
	case errors.Is(err, routing.ErrNotFound):
		p.sandboxes.forget(id)
		return true
	}
	return errors.As(err, &fe) // the route is there, if invalid
}

// recheckInvalidated forgets the running sandboxes whose route was
// invalidated (Invalidate) and is no longer in the store, asking through
// the cache: a sandbox that had a request since is a hit, so only idle
// ones cost a store read, one after the other. It stops early when stop
// is closed; what it did not settle is asked about next time.
func (p *Proxy) recheckInvalidated(stop <-chan struct{}) {
	var ids []string
	p.sandboxes.m.Range(func(k, v any) bool {
		if e := v.(*sandboxState); e.unsure.Load() && e.active.Load() <= 0 && e.state.Load() == stateRunning {
			ids = append(ids, k.(string))
		}
		return true
	})
	for _, id := range ids {
		select {
		case <-stop:
			return
		default:
		}
		// Cleared before the read: an invalidation during it marks the
		// sandbox again, for the next round.
		if sb := p.sandboxes.peek(id); sb != nil && sb.unsure.CompareAndSwap(true, false) && !p.forgetIfGone(id) {
			sb.unsure.Store(true)
		}
	}
}

// sweep forgets running sandboxes idle for longer than idle, and killed
// tombstones older than killedTTL. A sandbox removed from the store is
// forgotten sooner (forget), when a request or, after an invalidation,
// recheckInvalidated finds its route gone.
func (s *sandboxes) sweep(now time.Time, idle, killedTTL time.Duration) {
	idleCut := now.Add(-idle).UnixMilli()
	killedCut := now.Add(-killedTTL).UnixNano()
	s.m.Range(func(k, v any) bool {
		e := v.(*sandboxState)
		if e.active.Load() > 0 {
			return true
		}
		switch e.state.Load() {
		case stateRunning:
			if e.lastActive.Load() < idleCut {
				s.m.Delete(k)
			}
		case stateKilled:
			if e.changedAt.Load() < killedCut {
				s.m.Delete(k)
			}
		}
		return true
	})
}
