package certs

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// errRateLimited refuses an on-demand issuance over the per-minute budget.
var errRateLimited = errors.New("on-demand issuance rate limit reached")

// windowLimiter allows at most max events in any sliding minute. It keeps
// the times of the last max events in a ring, which grows to max as
// events come.
type windowLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	events  []time.Time
	next    int       // oldest event once the ring is full
	refused int       // refusals not yet reported
	warned  time.Time // when refusals were last reported
}

func newWindowLimiter(perMinute int) *windowLimiter {
	// The ring grows with the issuances it sees rather than being sized
	// for max: on_demand_rate has no upper bound, and a large one (an
	// operator's "no limit") would be allocated at start, up to more
	// memory than the machine has.
	return &windowLimiter{max: perMinute, window: time.Minute, now: time.Now}
}

// allow records an event and reports whether it fits in the budget.
func (l *windowLimiter) allow() bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) < l.max {
		l.events = append(l.events, now)
		return true
	}
	if now.Sub(l.events[l.next]) < l.window {
		return false
	}
	l.events[l.next] = now
	l.next = (l.next + 1) % l.max
	return true
}

// full reports whether allow would refuse an event now, without
// recording one.
func (l *windowLimiter) full() bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events) >= l.max && now.Sub(l.events[l.next]) < l.window
}

// report counts a refusal and, at most once a window, returns the
// refusals since the last report (this one included) to be logged: every
// handshake over the budget is refused, and one warning each would let a
// client retrying in a loop flood the log.
func (l *windowLimiter) report() (refused int, ok bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused++
	if !l.warned.IsZero() && now.Sub(l.warned) < l.window {
		return 0, false
	}
	refused, l.refused, l.warned = l.refused, 0, now
	return refused, true
}

// Backoff of a name whose on-demand order failed: the first failure
// blocks it for failureBackoffMin, each further one doubles that, up to
// failureBackoffMax (Let's Encrypt allows 5 failed validations per name
// an hour).
const (
	failureBackoffMin = time.Minute
	failureBackoffMax = time.Hour
	// failureBackoffKeep bounds the names remembered: beyond it, names
	// whose backoff has ended are forgotten at the next failure.
	failureBackoffKeep = 1024
)

// failureBackoff remembers names whose on-demand order failed. Only names
// Allow accepted reach it (existing sandboxes), so it stays small.
type failureBackoff struct {
	mu    sync.Mutex
	names map[string]failureState
}

type failureState struct {
	until    time.Time // no order before then
	failures int
}

func newFailureBackoff() *failureBackoff {
	return &failureBackoff{names: make(map[string]failureState)}
}

// record notes a failed order for name at now and returns when the next
// may be placed.
func (b *failureBackoff) record(name string, now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.names[name]
	if now.Sub(st.until) > failureBackoffMax {
		st.failures = 0 // long enough ago: start over
	}
	wait := failureBackoffMin << min(st.failures, 6)
	st.failures++
	st.until = now.Add(min(wait, failureBackoffMax))
	if len(b.names) >= failureBackoffKeep {
		for n, s := range b.names {
			if now.After(s.until) {
				delete(b.names, n)
			}
		}
	}
	b.names[name] = st
	return st.until
}

// check refuses name while it is backing off.
func (b *failureBackoff) check(name string, now time.Time) error {
	b.mu.Lock()
	st, ok := b.names[name]
	b.mu.Unlock()
	if ok && now.Before(st.until) {
		return fmt.Errorf("on-demand order for %s failed %d time(s); next attempt after %s: %w",
			name, st.failures, st.until.UTC().Format(time.RFC3339), errBackingOff)
	}
	return nil
}

// forget clears name's failures once a certificate was obtained for it.
func (b *failureBackoff) forget(name string) {
	b.mu.Lock()
	delete(b.names, name)
	b.mu.Unlock()
}

// errBackingOff refuses an on-demand order for a name whose last failed.
var errBackingOff = errors.New("backing off after a failed order")
