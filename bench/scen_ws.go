package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// wsConn is a raw-frame WebSocket client: one pre-built masked frame is sent
// per round trip and the echo is read and discarded in place.
type wsConn struct {
	rc    *rawConn
	frame []byte
	size  int
}

func newWSFrame(size int) []byte {
	f := []byte{0x82} // FIN + binary
	switch {
	case size < 126:
		f = append(f, 0x80|byte(size))
	case size < 1<<16:
		f = append(f, 0x80|126, byte(size>>8), byte(size))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(size))
	}
	// A fixed mask key is legal for a benchmark client: servers must unmask,
	// they cannot check randomness.
	key := [4]byte{0x11, 0x22, 0x33, 0x44}
	f = append(f, key[:]...)
	for i := range size {
		f = append(f, byte('a'+i%26)^key[i%4])
	}
	return f
}

func (w *wsConn) handshake(path, host string) error {
	if err := w.rc.dial(); err != nil {
		return err
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := w.rc.conn.Write([]byte(req)); err != nil {
		return fmt.Errorf("write upgrade: %w", err)
	}
	if err := w.rc.hdr.Read(w.rc.br); err != nil {
		return fmt.Errorf("read upgrade response: %w", err)
	}
	if st := w.rc.hdr.StatusCode(); st != 101 {
		return fmt.Errorf("upgrade status %d", st)
	}
	return nil
}

// roundTrip sends one message and reads frames until the echoed message is
// complete (FIN), returning an error if its length differs.
func (w *wsConn) roundTrip() error {
	if _, err := w.rc.conn.Write(w.frame); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	br := w.rc.br
	got := 0
	for {
		h, err := br.Peek(2)
		if err != nil {
			return fmt.Errorf("read frame header: %w", err)
		}
		fin, op, masked, ln := h[0]&0x80 != 0, h[0]&0x0f, h[1]&0x80 != 0, int(h[1]&0x7f)
		hl := 2
		switch ln {
		case 126:
			hl = 4
		case 127:
			hl = 10
		}
		if masked {
			hl += 4
		}
		if h, err = br.Peek(hl); err != nil {
			return fmt.Errorf("read frame header: %w", err)
		}
		switch ln {
		case 126:
			ln = int(binary.BigEndian.Uint16(h[2:4]))
		case 127:
			ln = int(binary.BigEndian.Uint64(h[2:10]))
		}
		if _, err := br.Discard(hl + ln); err != nil {
			return fmt.Errorf("read frame payload: %w", err)
		}
		if op >= 0x8 { // control frame (close/ping/pong)
			if op == 0x8 {
				return errors.New("server closed the WebSocket")
			}
			continue
		}
		got += ln
		if fin {
			break
		}
	}
	if got != w.size {
		return fmt.Errorf("echo of %d bytes, want %d", got, w.size)
	}
	return nil
}

func runWS(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("ws", flag.ContinueOnError)
	o.register(fs, 20002)
	c := fs.Int("c", 32, "concurrent WebSocket connections")
	size := fs.Int("size", 64, "message size in bytes")
	path := fs.String("path", "/ws", "WebSocket path on the backend")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	host := o.host(o.id)
	frame := newWSFrame(*size)
	deadline := time.Now().Add(o.warm + o.dur + 10*time.Second)
	type worker struct{ tally }
	var phase atomic.Int32
	workers := make([]*worker, *c)
	var wg sync.WaitGroup
	for i := range workers {
		wk := &worker{tally{h: newHist()}}
		workers[i] = wk
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := &wsConn{rc: newRawConn(o.addr, 16<<10), frame: frame, size: *size}
			wc.rc.deadline = deadline
			defer wc.rc.close()
			if err := wc.handshake(*path, host); err != nil {
				wk.errs++
				wk.err = err
				return
			}
			for {
				ph := phase.Load()
				if ph == phaseStop {
					return
				}
				t0 := time.Now()
				err := wc.roundTrip()
				el := time.Since(t0)
				if err != nil {
					wk.errs++
					wk.err = err
					return // a broken tunnel stays broken
				}
				if ph == phaseMeasure && phase.Load() == phaseMeasure {
					wk.ops++
					wk.h.record(int64(el))
				}
			}
		}()
	}
	m := o.newMeter()
	time.Sleep(o.warm)
	o.window(m, &phase, nil)
	wg.Wait()

	s := o.newSample("ws", fmt.Sprintf("c=%d size=%d d=%s", *c, *size, o.dur), m)
	h, firstErr := mergeTallies(s, workers)
	sec := m.wall.Seconds()
	s.Metrics["rtt_per_s"] = float64(s.Ops) / sec
	s.Metrics["p50_us"] = us(h.quantile(0.5))
	s.Metrics["p99_us"] = us(h.quantile(0.99))
	s.Metrics["p999_us"] = us(h.quantile(0.999))
	if len(m.subject) > 0 && s.Ops > 0 {
		s.Metrics["cpu_us_per_rtt"] = m.subjectCPU.Seconds() * 1e6 / float64(s.Ops)
	}
	if s.Errors > 0 {
		s.Failed = fmt.Sprintf("%d of %d connections failed: %v", s.Errors, *c, firstErr)
	} else if s.Ops == 0 {
		s.Failed = "no round trips in the measured window"
	}
	return s, nil
}
