package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
)

// libLogEvery is how often one kind of a library's warning is logged.
const libLogEvery = 10 * time.Second

// throttledLog logs a library's warnings as the proxy's own JSON lines,
// tagged with the library's component, at most one line per kind of
// message per libLogEvery: while Redis or a trace collector is down, the
// library repeats the same failure several times a second, thousands of
// identical lines an hour. The next line of a kind counts what was held
// back (suppressed).
type throttledLog struct {
	l         *slog.Logger
	component string
	now       func() time.Time
	mu        sync.Mutex                 // guards seen, not its Limits
	seen      map[string]*loglimit.Limit // by kind: a handful
}

func newThrottledLog(l *slog.Logger, component string, now func() time.Time) *throttledLog {
	return &throttledLog{l: l, component: component, now: now, seen: map[string]*loglimit.Limit{}}
}

// warn logs msg() unless a line of kind was logged within libLogEvery;
// msg is called only for a line that is logged.
func (t *throttledLog) warn(kind string, msg func() string) {
	now := t.now()
	t.mu.Lock()
	lim := t.seen[kind]
	if lim == nil {
		lim = &loglimit.Limit{}
		t.seen[kind] = lim
	}
	t.mu.Unlock()
	if n, ok := lim.Admit(now, libLogEvery); ok {
		t.l.Warn(msg(), loglimit.WithSuppressed(n, "component", t.component)...)
	}
}

// redisLogger routes go-redis's process-wide log into slog; a message's
// format is its kind.
type redisLogger struct{ t *throttledLog }

// Printf implements go-redis's internal.Logging.
func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.t.warn(format, func() string { return fmt.Sprintf(format, v...) })
}

// otelErrorHandler routes the OpenTelemetry SDK's errors (a failed span
// export) into slog. Their text up to the first colon is their kind
// ("traces export"); the rest names addresses and causes that vary.
type otelErrorHandler struct{ t *throttledLog }

// Handle implements otel.ErrorHandler.
func (h otelErrorHandler) Handle(err error) {
	msg := err.Error()
	kind, _, _ := strings.Cut(msg, ":")
	h.t.warn(kind, func() string { return msg })
}
