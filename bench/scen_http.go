package main

import (
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Window phases shared by the request loops.
const (
	phaseWarm int32 = iota
	phaseMeasure
	phaseStop
)

// window is the measured part of a sample: the meter runs and phase tells
// the workers to count for o.dur, then to stop. mark, when not nil, runs
// right after the meter's clock starts and right before it stops: counters
// read there cover the wall time the rates divide by. Read around the
// meter instead, they also covered its /proc walks (milliseconds on a busy
// core, more for a subject with more threads), inflating the rates.
func (o *options) window(m *meter, phase *atomic.Int32, mark func()) {
	m.start()
	if mark != nil {
		mark()
	}
	phase.Store(phaseMeasure)
	time.Sleep(o.dur)
	phase.Store(phaseStop)
	if mark != nil {
		mark()
	}
	m.stop()
}

// loopWorker is one keep-alive connection issuing requests back to back.
type loopWorker struct {
	rc       *rawConn
	h        *hist
	ops      int64
	errs     int64
	bytes    int64
	firstErr error
}

// loopResult aggregates all workers of one request loop.
type loopResult struct {
	h        *hist
	ops      int64
	errs     int64
	bytes    int64
	redials  int64
	firstErr error
}

// runLoop drives c connections sending req until warm+dur has passed and
// records the requests that completed inside the measured window.
func runLoop(o *options, m *meter, c int, req []byte, readBuf int) loopResult {
	var phase atomic.Int32
	workers := make([]*loopWorker, c)
	var wg sync.WaitGroup
	deadline := time.Now().Add(o.warm + o.dur + 10*time.Second)
	for i := range workers {
		w := &loopWorker{rc: newRawConn(o.addr, readBuf), h: newHist()}
		w.rc.deadline = deadline
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(&phase, req)
		}()
	}
	time.Sleep(o.warm)
	o.window(m, &phase, nil)
	wg.Wait()

	res := loopResult{h: newHist()}
	for _, w := range workers {
		w.rc.close()
		res.h.merge(w.h)
		res.ops += w.ops
		res.errs += w.errs
		res.bytes += w.bytes
		res.redials += max(w.rc.redials-1, 0)
		if res.firstErr == nil {
			res.firstErr = w.firstErr
		}
	}
	return res
}

func (w *loopWorker) run(phase *atomic.Int32, req []byte) {
	for {
		ph := phase.Load()
		if ph == phaseStop {
			return
		}
		t0 := time.Now()
		status, n, err := w.rc.roundTrip(req)
		el := time.Since(t0)
		if phase.Load() != phaseMeasure || ph != phaseMeasure {
			if err != nil {
				time.Sleep(10 * time.Millisecond) // refused during warm-up: do not spin
			}
			continue
		}
		switch {
		case err != nil:
			w.errs++
			if w.firstErr == nil {
				w.firstErr = err
			}
			time.Sleep(10 * time.Millisecond)
		case status < 200 || status > 299:
			w.errs++
			if w.firstErr == nil {
				w.firstErr = fmt.Errorf("status %d", status)
			}
		default:
			w.ops++
			w.bytes += n
			w.h.record(int64(el))
		}
	}
}

func buildGET(path, host string) []byte { return buildRequest(path, host, false) }

// buildRequest returns a complete GET request; gzip adds the
// Accept-Encoding header that browsers and most HTTP clients send.
func buildRequest(path, host string, gzip bool) []byte {
	ae := ""
	if gzip {
		ae = "Accept-Encoding: gzip\r\n"
	}
	return []byte("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: cube-bench\r\nAccept: */*\r\n" + ae + "\r\n")
}

func runHTTP(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	o.register(fs, 20001)
	c := fs.Int("c", 64, "concurrent keep-alive connections")
	path := fs.String("path", "/small", "request path (the backend's /small returns 64 bytes)")
	gz := fs.Bool("gzip", false, "send Accept-Encoding: gzip as browsers do (bodies are discarded, not decoded)")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	m := o.newMeter()
	res := runLoop(o, m, *c, buildRequest(*path, o.host(o.id), *gz), 16<<10)
	s := o.newSample("http", fmt.Sprintf("c=%d path=%s gzip=%t d=%s", *c, *path, *gz, o.dur), m)
	fillLoopMetrics(s, res, m)
	o.checkErrors(s, res.firstErr)
	return s, nil
}

func runBytes(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("bytes", flag.ContinueOnError)
	o.register(fs, 20001)
	c := fs.Int("c", 8, "concurrent keep-alive connections")
	size := fs.Int("size", 64<<10, "response body size in bytes")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	m := o.newMeter()
	path := fmt.Sprintf("/bytes?size=%d", *size)
	res := runLoop(o, m, *c, buildGET(path, o.host(o.id)), 64<<10)
	s := o.newSample("bytes", fmt.Sprintf("c=%d size=%d d=%s", *c, *size, o.dur), m)
	fillLoopMetrics(s, res, m)
	o.checkErrors(s, res.firstErr)
	if s.Failed == "" && res.ops > 0 && res.bytes != res.ops*int64(*size) {
		s.Failed = fmt.Sprintf("received %d body bytes for %d responses of %d", res.bytes, res.ops, *size)
	}
	return s, nil
}

func fillLoopMetrics(s *Sample, res loopResult, m *meter) {
	s.Ops, s.Errors = res.ops, res.errs
	sec := m.wall.Seconds()
	s.Metrics["rps"] = float64(res.ops) / sec
	s.Metrics["mib_per_s"] = float64(res.bytes) / sec / (1 << 20)
	s.Metrics["p50_us"] = us(res.h.quantile(0.50))
	s.Metrics["p99_us"] = us(res.h.quantile(0.99))
	s.Metrics["p999_us"] = us(res.h.quantile(0.999))
	s.Metrics["max_us"] = us(res.h.max)
	s.Metrics["mean_us"] = res.h.mean() / 1e3
	s.Metrics["redials"] = float64(res.redials)
	if len(m.subject) > 0 && res.ops > 0 {
		s.Metrics["cpu_us_per_req"] = m.subjectCPU.Seconds() * 1e6 / float64(res.ops)
	}
}

func us(ns int64) float64 { return float64(ns) / 1e3 }
