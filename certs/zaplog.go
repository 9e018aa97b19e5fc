package certs

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cube-sandbox/cubeproxy/internal/loglimit"
)

// newZapLogger gives certmagic (which logs through zap) a logger that writes
// into our slog.Logger, so issuance and renewal messages land in the same log
// stream with the same level filtering.
func newZapLogger(log *slog.Logger) *zap.Logger {
	return zap.New(&slogCore{h: log.Handler(), th: &loglimit.Limit{}})
}

// slogCore is a zapcore.Core backed by a slog.Handler.
type slogCore struct {
	h  slog.Handler
	th *loglimit.Limit // the per-handshake lines' (perHandshake), shared by the cores With derives
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h.WithAttrs(attrs(fields)), th: c.th}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	var suppressed int64
	if perHandshake(e.Message) {
		var ok bool
		if suppressed, ok = c.th.Admit(e.Time, handshakeLogEvery); !ok {
			return nil
		}
	}
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	if suppressed > 0 {
		r.AddAttrs(slog.Int64("suppressed", suppressed))
	}
	return c.h.Handle(context.Background(), r)
}

// perHandshake reports whether msg is a certmagic line any client can have
// written once per TLS handshake: "tls-alpn challenge", its error for a
// ClientHello shaped as a TLS-ALPN-01 validation (acme-tls/1 alone) of a
// name on-demand accepts while no order for it runs. A real sandbox's name
// is no secret, so that was an ERROR line per handshake for anyone to send.
func perHandshake(msg string) bool { return msg == "tls-alpn challenge" }

// handshakeLogEvery is how often a per-handshake certmagic line is logged
// (a CA's real validations succeed and log none); the next line counts
// those held back, "suppressed".
const handshakeLogEvery = 10 * time.Second

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// attrs encodes zap fields with zap's own map encoder, sorted by key.
func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		v := enc.Fields[k]
		switch k {
		case slog.MessageKey, slog.TimeKey, slog.LevelKey, slog.SourceKey:
			k = "field_" + k // certmagic logs a DNS reply as "msg"
		}
		out = append(out, slog.Any(k, v))
	}
	return out
}
