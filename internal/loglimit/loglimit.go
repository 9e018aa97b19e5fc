// Package loglimit holds back repeats of a log line: at most one line of a
// kind per interval, the next line let through counting those held back as
// "suppressed". Without the count a line an interval reads the same for one
// failure an interval as for thousands.
package loglimit

import (
	"sync/atomic"
	"time"
)

// origin is the zero of the clock a Limit keeps, a century before the
// process started: a zero Limit's last line is then at 0, long before any
// line it is asked about, so that the first one passes with no "never
// logged" case to test. A Limit counts from it with time.Time.Sub, which
// uses the monotonic clock for times that carry it (time.Now): a wall
// clock stepped back does not hold lines back for the length of the step.
// Set once here and never written.
var origin = time.Now().Add(-100 * 365 * 24 * time.Hour)

// Limit lets one line through per interval and counts those held back.
// The zero value is ready; it is safe for concurrent use, takes no lock
// and allocates nothing, so request paths can use it. The times it is
// given must be within a century of the process's start.
type Limit struct {
	last atomic.Int64 // when the last line was let through: nanoseconds since origin
	held atomic.Int64 // lines held back since
}

// Admit reports whether a line at now may be logged: the last line let
// through was at least every before now (or there was none). If it may,
// held is the count of lines held back since the last one, which the line
// is to carry (WithSuppressed); if not, the line is counted. Of the lines
// several goroutines ask about at once within one interval, one passes.
func (l *Limit) Admit(now time.Time, every time.Duration) (held int64, ok bool) {
	t := int64(now.Sub(origin))
	last := l.last.Load()
	if t-last < int64(every) || !l.last.CompareAndSwap(last, t) {
		l.held.Add(1)
		return 0, false
	}
	// A line counted by a goroutine that lost the race just now may be
	// added after this Swap: the next line carries it, none is lost.
	return l.held.Swap(0), true
}

// WithSuppressed returns a log line's args with ("suppressed", held) added
// when lines were held back before it.
func WithSuppressed(held int64, args ...any) []any {
	if held > 0 {
		return append(args, "suppressed", held)
	}
	return args
}
