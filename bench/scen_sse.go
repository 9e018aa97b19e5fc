package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// sseStream is one SSE client connection of the sse scenario.
type sseStream struct {
	mu      sync.Mutex
	conn    net.Conn
	aborted bool

	newlines atomic.Int64 // throughput mode: '\n' count (2 per event)
	bytes    atomic.Int64 // de-chunked body bytes

	lat      *hist       // latency mode: arrival − send, measured window only
	ttfe     int64       // request write → first complete event, ns (0 = none)
	started  atomic.Bool // first event arrived (or the stream gave up)
	err      error
	ended    bool // the stream ended before the harness closed it
	badInput bool
}

// attach registers the live connection so abort can unblock its reader.
func (s *sseStream) attach(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return false
	}
	s.conn = c
	return true
}

func (s *sseStream) abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborted = true
	if s.conn != nil {
		_ = s.conn.Close()
	}
}

func (s *sseStream) isAborted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aborted
}

// run opens one stream and reads it until it ends or is aborted.
// latency selects per-event timestamp parsing; otherwise only newlines and
// bytes are counted, which keeps the client cheap at high event rates.
func (s *sseStream) run(addr string, req []byte, deadline time.Time, latency bool, phase *atomic.Int32) {
	defer s.started.Store(true)
	rc := newRawConn(addr, 64<<10)
	rc.deadline = deadline
	if err := rc.dial(); err != nil {
		s.err = err
		return
	}
	if !s.attach(rc.conn) {
		rc.close()
		return
	}
	defer rc.close()
	t0 := time.Now().UnixNano()
	if _, err := rc.conn.Write(req); err != nil {
		s.err = fmt.Errorf("write request: %w", err)
		return
	}
	if err := rc.hdr.Read(rc.br); err != nil {
		if s.isAborted() {
			s.err = errors.New("no response headers before the sample ended")
		} else {
			s.err = fmt.Errorf("read response header: %w", err)
		}
		return
	}
	if st := rc.hdr.StatusCode(); st != 200 {
		s.err = fmt.Errorf("status %d", st)
		return
	}
	bs := newBodyStream(rc.br, rc.hdr.ContentLength())
	var p sseParser
	var now int64 // arrival of the bytes being parsed
	onEvent := func(sent int64) {
		if s.ttfe == 0 {
			s.ttfe = now - t0
			s.started.Store(true)
		}
		if phase.Load() == phaseMeasure {
			s.lat.record(now - sent)
		}
	}
	// consume takes body bytes (decoded) that arrived at time at; false
	// stops the stream.
	consume := func(b []byte, at int64) bool {
		now = at
		s.bytes.Add(int64(len(b)))
		if latency {
			p.feed(b, onEvent)
		} else {
			nl := bytes.Count(b, []byte{'\n'})
			if s.ttfe == 0 && s.newlines.Load()+int64(nl) >= 2 {
				s.ttfe = now - t0
				s.started.Store(true)
			}
			s.newlines.Add(int64(nl))
		}
		if p.bad {
			s.badInput = true
			s.err = errors.New("response body is not the backend's event format")
			return false
		}
		return true
	}
	var err error
	switch ce := string(rc.hdr.Peek("Content-Encoding")); ce {
	case "":
		for {
			var b []byte
			if b, err = bs.next(); err != nil {
				break
			}
			if !consume(b, time.Now().UnixNano()) {
				return
			}
		}
	case "gzip":
		// Only a peer that compresses event streams (nginx with the
		// platform's gzip settings) takes this path. Events are timed at
		// the arrival of the compressed bytes that complete them, as a
		// browser's zlib would hand them out (gunzipEager).
		if err = gunzipEager(bs.next, consume, func() int64 { return time.Now().UnixNano() }); err == nil {
			return // consume stopped it
		}
	default:
		s.err = fmt.Errorf("unexpected Content-Encoding %q", ce)
		return
	}
	switch {
	case !s.isAborted():
		s.ended = true
		s.err = fmt.Errorf("stream ended early: %w", err)
	case s.ttfe == 0:
		// Its headers came, its first event never did: a stream left out
		// of the latencies and time to first event would flatter the
		// subject.
		s.err = errors.New("no event before the sample ended")
	}
}

func runSSE(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("sse", flag.ContinueOnError)
	o.register(fs, 20001)
	n := fs.Int("n", 16, "concurrent SSE streams")
	size := fs.Int("size", 256, "bytes per event (with SSE framing), at least 32")
	interval := fs.Duration("interval", 0, "latency mode: time between events of one stream (0 = throughput mode, as fast as the backend writes)")
	gz := fs.Bool("gzip", false, "send Accept-Encoding: gzip as browsers do (and decode a gzip stream)")
	firstWait := fs.Duration("first-event-wait", 10*time.Second, "after the warm-up, wait up to this long for every stream's first event before the window opens")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	latency := *interval > 0
	maxMS := (o.warm + o.dur + 20*time.Second).Milliseconds()
	path := fmt.Sprintf("/sse?size=%d&max_ms=%d", *size, maxMS)
	label := "sse-tput-" + sizeLabel(*size)
	if latency {
		path += fmt.Sprintf("&interval_ms=%d", interval.Milliseconds())
		label = "sse-lat-" + sizeLabel(*size)
	}
	o.defLabel = label
	req := buildRequest(path, o.host(o.id), *gz)
	deadline := time.Now().Add(o.warm + o.dur + 25*time.Second)

	var phase atomic.Int32
	streams := make([]*sseStream, *n)
	var wg sync.WaitGroup
	for i := range streams {
		s := &sseStream{lat: newHist()}
		streams[i] = s
		// Stagger the starts over the first half of the warm-up so that
		// time-to-first-event is not a measurement of a connection storm.
		delay := time.Duration(i) * o.warm / 2 / time.Duration(*n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(delay)
			s.run(o.addr, req, deadline, latency, &phase)
		}()
	}
	count := func() (nl, by int64) {
		for _, s := range streams {
			nl += s.newlines.Load()
			by += s.bytes.Load()
		}
		return nl, by
	}
	m := o.newMeter()
	time.Sleep(o.warm)
	// The window opens once every stream delivered its first event, so that
	// slow starters (a peer that holds back the first bytes) are measured
	// rather than missed; a stream that stays silent through this wait and
	// the window fails the sample.
	for end := time.Now().Add(*firstWait); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		all := true
		for _, st := range streams {
			all = all && st.started.Load()
		}
		if all {
			break
		}
	}
	var marks [][2]int64
	o.window(m, &phase, func() {
		nl, by := count()
		marks = append(marks, [2]int64{nl, by})
	})
	nl0, by0, nl1, by1 := marks[0][0], marks[0][1], marks[1][0], marks[1][1]
	for _, s := range streams {
		s.abort()
	}
	wg.Wait()

	s := o.newSample(label, fmt.Sprintf("n=%d size=%d interval=%s gzip=%t d=%s", *n, *size, *interval, *gz, o.dur), m)
	lat, ttfe := newHist(), newHist()
	var firstErr error
	// Latencies are those of the events that arrived in the window. A
	// stream that stalled there (its events held back past the window's
	// end) added none, and the others' figures would stand for it: a
	// stream must deliver at least half the events the backend sent it in
	// the window's length. A steady delay of any size does not lower the
	// count, only a growing one does.
	expected := int64(0)
	if latency {
		expected = int64(m.wall / *interval)
	}
	for _, st := range streams {
		if st.err == nil && expected >= 4 && int64(st.lat.n) < expected/2 {
			st.err = fmt.Errorf("%d events in the window, %d sent at one per %s: the stream stalled", st.lat.n, expected, *interval)
		}
		lat.merge(st.lat)
		if st.ttfe > 0 {
			ttfe.record(st.ttfe)
		}
		if st.err != nil {
			s.Errors++
			if firstErr == nil {
				firstErr = st.err
			}
		}
	}
	sec := m.wall.Seconds()
	if latency {
		s.Ops = int64(lat.n)
		s.Metrics["events_per_s"] = float64(lat.n) / sec
		s.Metrics["lat_p50_us"] = us(lat.quantile(0.5))
		s.Metrics["lat_p99_us"] = us(lat.quantile(0.99))
		s.Metrics["lat_p999_us"] = us(lat.quantile(0.999))
		s.Metrics["lat_max_us"] = us(lat.max)
		s.Metrics["lat_mean_us"] = lat.mean() / 1e3
	} else {
		s.Ops = (nl1 - nl0) / 2
		s.Metrics["events_per_s"] = float64(s.Ops) / sec
	}
	s.Metrics["mib_per_s"] = float64(by1-by0) / sec / (1 << 20)
	s.Metrics["ttfe_p50_us"] = us(ttfe.quantile(0.5))
	s.Metrics["ttfe_p99_us"] = us(ttfe.quantile(0.99))
	s.Metrics["streams_ok"] = float64(int64(*n) - s.Errors)
	if len(m.subject) > 0 && s.Ops > 0 {
		s.Metrics["cpu_us_per_event"] = m.subjectCPU.Seconds() * 1e6 / float64(s.Ops)
	}
	// Every stream must survive the whole window: one broken stream is a
	// broken subject, not noise.
	if s.Errors > 0 {
		s.Failed = fmt.Sprintf("%d of %d streams failed: %v", s.Errors, *n, firstErr)
	} else if s.Ops == 0 {
		s.Failed = fmt.Sprintf("no events in the %s window (first events after %.2f s)", o.dur, float64(ttfe.quantile(0.5))/1e9)
	}
	return s, nil
}

func sizeLabel(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dk", n/1024)
	}
	return fmt.Sprint(n)
}
