package routing

import "time"

// A miss's store call runs on a goroutine other than the caller's, so that
// the caller can give up on a store that ignores its deadline
// (LookupTimeout) while the call ends in the background, and misses for
// one id share one call. singleflight's DoChan started a goroutine per
// miss; each began with a small stack and grew it, copy by copy, to the
// store's call depth (go-redis's pipeline): ≈ 5 % of the proxy's CPU in a
// cold-start burst (bench/profile.sh cold). The calls now run on
// goroutines kept between misses, as fasthttp keeps its connection
// workers, and keep the stack they grew.

// flight is one store call for an id, which every miss for it waits on.
type flight struct {
	id    string
	force bool // asks the store even when the route is cached (Refresh)
	// deadline is the store call's, set when the flight is made, before
	// its first waiter starts its timer: see storeAnswerGrace.
	deadline time.Time
	done     chan struct{} // closed once route and err are set
	route    *Route
	err      error
}

const (
	// maxLoaders bounds the goroutines kept for store calls. More calls at
	// once (a store that hangs while thousands of ids miss) each get a
	// goroutine of their own, as they all did before: a call never waits
	// for a kept one.
	maxLoaders = 64
	// loaderIdle is how long a kept goroutine waits for the next call
	// before it ends, as fasthttp's MaxIdleWorkerDuration.
	loaderIdle = 10 * time.Second
)

// join returns the flight for id, starting one when none is in progress
// (force: one that asks the store even when the route is cached). One in
// progress is joined whatever its force: it began after the entry it is
// for stopped being fresh, or for a Refresh, so it asks the store too.
func (c *Cache) join(id string, force bool) *flight {
	c.mu.Lock()
	f := c.flights[id]
	if f != nil {
		c.mu.Unlock()
		return f
	}
	f = &flight{id: id, force: force, done: make(chan struct{}), deadline: time.Now().Add(c.cfg.LookupTimeout)}
	c.flights[id] = f
	c.mu.Unlock()
	select {
	case c.work <- f: // a kept goroutine was waiting
	default:
		if c.loaders.Add(1) <= maxLoaders {
			go c.loader(f)
		} else {
			c.loaders.Add(-1)
			go c.fly(f)
		}
	}
	return f
}

// loader makes f's store call, then those handed to it, until it has
// waited c.loaderIdle for one or the cache is closed.
func (c *Cache) loader(f *flight) {
	defer c.loaders.Add(-1)
	idle := time.NewTimer(c.loaderIdle)
	defer idle.Stop()
	for {
		c.fly(f)
		idle.Reset(c.loaderIdle)
		select {
		case f = <-c.work:
		case <-idle.C:
			return
		case <-c.closed:
			return
		}
	}
}

// fly makes f's store call and hands its answer to every miss waiting.
func (c *Cache) fly(f *flight) {
	f.route, f.err = c.load(f.id, f.force, f.deadline)
	c.land(f)
	close(f.done)
}

// land ends f as the flight for its id: the next miss starts a new one.
func (c *Cache) land(f *flight) {
	c.mu.Lock()
	if c.flights[f.id] == f {
		delete(c.flights, f.id)
	}
	c.mu.Unlock()
}

// Close ends the goroutines kept for store calls once they are idle. A
// miss after Close is still answered; its goroutine ends with its call.
func (c *Cache) Close() {
	c.closeOnce.Do(func() { close(c.closed) })
}
