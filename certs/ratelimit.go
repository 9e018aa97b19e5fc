package certs

import (
	"errors"
	"sync"
	"time"
)

// errRateLimited refuses an on-demand issuance over the per-minute budget.
var errRateLimited = errors.New("on-demand issuance rate limit reached")

// windowLimiter allows at most max events in any sliding minute. It keeps
// the times of the last max events in a ring.
type windowLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu     sync.Mutex
	events []time.Time
	next   int // oldest event once the ring is full
}

func newWindowLimiter(perMinute int) *windowLimiter {
	return &windowLimiter{max: perMinute, window: time.Minute, now: time.Now, events: make([]time.Time, 0, perMinute)}
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
