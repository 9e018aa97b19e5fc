package main

import (
	"bytes"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// smallBody is the 64-byte payload of /small.
var smallBody = bytes.Repeat([]byte("a"), 63)

func init() { smallBody = append(smallBody, '\n') }

const (
	maxBytesBody = 16 << 20 // largest /bytes?size= served
	minEventSize = 32       // "data: " + 19-digit stamp + " " + "\n\n" fits
	maxEventSize = 1 << 20
	// Connection: close because fasthttp closes a hijacked connection when
	// the stream ends: unannounced, the proxy pooled it after the last
	// chunk, and a POST that took it before the FIN arrived got a 502 (a
	// GET is re-sent), about once in a few thousand in bench/soak.sh.
	sseHeader = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)

// fastBackend serves the byte-oriented endpoints with as little CPU as
// possible, since it shares a core with the load generator.
type fastBackend struct {
	maxHold time.Duration
	bulk    []byte // shared read-only payload for /bytes
	pad     []byte // read-only pseudo-random text that event padding is cut from
}

// padPoolSize is far larger than gzip's 32 KiB window, so event padding
// taken from consecutive slices compresses like real text payloads do,
// instead of collapsing into back-references to the previous event.
const padPoolSize = 1 << 20

func newFastBackend(maxHold time.Duration) *fastBackend {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	pad := make([]byte, padPoolSize+maxEventSize)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range pad {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		pad[i] = alphabet[x&63]
	}
	return &fastBackend{maxHold: maxHold, bulk: bytes.Repeat([]byte("0123456789abcdef"), maxBytesBody/16), pad: pad}
}

func (b *fastBackend) server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                       b.handle,
		Name:                          "bench-backend",
		NoDefaultDate:                 true,
		DisableHeaderNamesNormalizing: true,
		ReadBufferSize:                16 << 10,
		WriteBufferSize:               64 << 10,
		Concurrency:                   1 << 20,
	}
}

func (b *fastBackend) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/small":
		ctx.SetContentType("text/plain")
		ctx.SetBody(smallBody)
	case "/bytes":
		n := ctx.QueryArgs().GetUintOrZero("size")
		if n <= 0 {
			n = 64 << 10
		}
		if n > maxBytesBody {
			ctx.Error("size too large", fasthttp.StatusBadRequest)
			return
		}
		ctx.SetContentType("application/octet-stream")
		ctx.SetBody(b.bulk[:n])
	case "/sse":
		b.sse(ctx)
	default:
		ctx.Error("not found", fasthttp.StatusNotFound)
	}
}

// sseParams are the query parameters of /sse.
type sseParams struct {
	size     int           // bytes per event including framing
	n        int           // number of events
	interval time.Duration // pause between events; 0 = as fast as the socket takes them
	hold     time.Duration // keep the stream open this long after the last event
	maxDur   time.Duration // hard bound for the whole stream
	// cut ends the stream by closing the connection after the last event,
	// without the terminating chunk: a sandbox that dies mid-stream.
	cut bool
}

// sse streams events over the hijacked connection: one write(2) per event,
// each event carrying its send time in unix nanoseconds, so the client can
// compute per-event latency and the backend adds no buffering of its own.
func (b *fastBackend) sse(ctx *fasthttp.RequestCtx) {
	a := ctx.QueryArgs()
	p := sseParams{
		size:     a.GetUintOrZero("size"),
		n:        a.GetUintOrZero("n"),
		interval: time.Duration(a.GetUintOrZero("interval_ms")) * time.Millisecond,
		hold:     time.Duration(a.GetUintOrZero("hold_ms")) * time.Millisecond,
		maxDur:   time.Duration(a.GetUintOrZero("max_ms")) * time.Millisecond,
		cut:      a.GetBool("cut"),
	}
	if p.size == 0 {
		p.size = 256
	}
	if p.size < minEventSize || p.size > maxEventSize {
		ctx.Error("size out of range", fasthttp.StatusBadRequest)
		return
	}
	if p.n <= 0 {
		p.n = 1 << 30
	}
	if p.maxDur <= 0 || p.maxDur > b.maxHold {
		p.maxDur = b.maxHold
	}
	if p.hold > b.maxHold {
		p.hold = b.maxHold
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { streamSSE(c, p, b.pad) })
}

func streamSSE(c net.Conn, p sseParams, pad []byte) {
	// Frame: <hex size>\r\n data: <19-digit unix nanos> <padding>\n\n \r\n
	hexSize := strconv.FormatInt(int64(p.size), 16)
	frame := make([]byte, 0, len(sseHeader)+len(hexSize)+p.size+4)
	frame = append(frame, sseHeader...)
	eventStart := len(frame)
	frame = append(frame, hexSize...)
	frame = append(frame, "\r\n"...)
	stampAt := len(frame) + len("data: ")
	frame = append(frame, "data: "...)
	frame = append(frame, "0000000000000000000 "...)
	padAt := len(frame)
	payloadEnd := stampAt - len("data: ") + p.size - len("\n\n")
	frame = append(frame, pad[:payloadEnd-padAt]...)
	frame = append(frame, "\n\n\r\n"...)
	padOff := 0

	start := time.Now()
	var tick *time.Ticker
	if p.interval > 0 {
		tick = time.NewTicker(p.interval)
		defer tick.Stop()
	}
	out := frame // first write carries the response header too
	for i := 0; i < p.n; i++ {
		if i > 0 {
			out = frame[eventStart:]
			if tick != nil {
				<-tick.C
			}
			if time.Since(start) > p.maxDur {
				break
			}
			padOff = (padOff + payloadEnd - padAt) % padPoolSize
			copy(frame[padAt:payloadEnd], pad[padOff:])
		}
		stamp(frame[stampAt:stampAt+19], time.Now().UnixNano())
		if _, err := c.Write(out); err != nil {
			return
		}
	}
	if p.hold > 0 {
		// Idle phase: return when the peer closes or the hold expires.
		_ = c.SetReadDeadline(time.Now().Add(p.hold))
		var one [1]byte
		_, _ = c.Read(one[:])
	}
	if p.cut {
		return // fasthttp closes a hijacked connection when this returns
	}
	_, _ = c.Write([]byte("0\r\n\r\n"))
}

// stamp writes v as exactly len(dst) decimal digits, zero-padded.
func stamp(dst []byte, v int64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte('0' + v%10)
		v /= 10
	}
}
