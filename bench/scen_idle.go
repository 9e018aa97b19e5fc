package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// runIdle opens n SSE streams that receive one event and then stay silent,
// and reports how much the subject's resident memory grew per open stream.
func runIdle(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("idle", flag.ContinueOnError)
	o.register(fs, 20001)
	n := fs.Int("n", 2000, "idle SSE streams to hold open")
	par := fs.Int("par", 32, "streams opened concurrently")
	settle := fs.Duration("settle", time.Second, "pause after the last stream opened before reading RSS")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	o.defLabel = fmt.Sprintf("idle-%d", *n)
	subj, _ := parsePIDs(o.pids)
	if len(subj) == 0 && o.subject != "direct" {
		return nil, errors.New("idle needs -pids of the subject (RSS is read from /proc/<pid>/status)")
	}
	holdMS := (*settle + o.dur + 30*time.Second).Milliseconds()
	req := buildGET(fmt.Sprintf("/sse?size=64&n=1&hold_ms=%d", holdMS), o.host(o.id))
	deadline := time.Now().Add(2*time.Minute + o.dur)

	rssBefore, err := treeRSSKiB(subj)
	if err != nil {
		return nil, fmt.Errorf("rss before: %w", err)
	}
	m := o.newMeter()
	m.start()
	conns := make([]*idleStream, *n)
	errs := make([]error, *n)
	sem := make(chan struct{}, *par)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			conns[i], errs[i] = openIdleStream(o.addr, req, deadline)
		}()
	}
	wg.Wait()
	openTime := time.Since(t0)
	time.Sleep(*settle)
	rssOpen, err1 := treeRSSKiB(subj)
	time.Sleep(o.dur)
	rssHeld, err2 := treeRSSKiB(subj)
	m.stop()
	notHeld := checkHeld(conns)
	for _, c := range conns {
		if c != nil {
			c.rc.close()
		}
	}
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("rss while streams are open: %w", err)
	}

	s := o.newSample(o.defLabel, fmt.Sprintf("n=%d hold=%s", *n, o.dur), m)
	var firstErr, firstNotHeld error
	for i, e := range errs {
		switch {
		case e != nil:
			s.Errors++
			if firstErr == nil {
				firstErr = e
			}
		case notHeld[i] != nil:
			s.Errors++
			if firstNotHeld == nil {
				firstNotHeld = notHeld[i]
			}
		default:
			s.Ops++
		}
	}
	s.Metrics["streams"] = float64(s.Ops)
	s.Metrics["open_sec"] = openTime.Seconds()
	s.Metrics["rss_before_kib"] = float64(rssBefore)
	s.Metrics["rss_open_kib"] = float64(rssOpen)
	s.Metrics["rss_held_kib"] = float64(rssHeld)
	if s.Ops > 0 && len(subj) > 0 {
		s.Metrics["rss_kib_per_stream"] = float64(max(rssOpen, rssHeld)-rssBefore) / float64(s.Ops)
	}
	if firstErr != nil {
		s.Failed = fmt.Sprintf("%d of %d streams failed to open: %v", s.Errors, *n, firstErr)
	} else if firstNotHeld != nil {
		// The RSS figure is of the streams held: one the subject ended
		// during the hold (an idle timeout, a cap that evicts) would
		// have its share divided over streams no longer there.
		s.Failed = fmt.Sprintf("%d of %d streams were not held through the window: %v", s.Errors, *n, firstNotHeld)
	}
	return s, nil
}

// idleStream is one open stream of the idle scenario: its connection and
// the body being read, to tell at the end whether it is still open.
type idleStream struct {
	rc *rawConn
	bs *bodyStream
}

// checkHeld reads what each stream received during the hold, all streams
// at once, and returns per stream why it is no longer held (nil: still
// open). Bytes that came (a proxy's heartbeat comments) are read past; the
// response's end or the connection's is not held. Each stream's deadline
// starts when its read does: one deadline shared by all could pass before
// the last of 2,000 goroutines runs on a busy core, and a read past its
// deadline returns without looking at the socket; a read begun only after
// its own deadline (the goroutine stalled in between) is tried again.
func checkHeld(streams []*idleStream) []error {
	out := make([]error, len(streams))
	var wg sync.WaitGroup
	for i, st := range streams {
		if st == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(50 * time.Millisecond)
			_ = st.rc.conn.SetReadDeadline(deadline)
			for {
				looked := time.Now()
				_, err := st.bs.next()
				switch {
				case err == nil:
					continue
				case errors.Is(err, os.ErrDeadlineExceeded) && !looked.Before(deadline):
					// The goroutine ran only after its deadline (a busy
					// core): the read returned without looking. Again.
					deadline = time.Now().Add(50 * time.Millisecond)
					_ = st.rc.conn.SetReadDeadline(deadline)
					continue
				case errors.Is(err, os.ErrDeadlineExceeded):
					return // open, and silent until the deadline
				case errors.Is(err, io.EOF):
					out[i] = errors.New("the subject ended the stream")
				default:
					out[i] = fmt.Errorf("the stream broke: %w", err)
				}
				return
			}
		}()
	}
	wg.Wait()
	return out
}

// openIdleStream sends the request and returns once the first event arrived.
func openIdleStream(addr string, req []byte, deadline time.Time) (*idleStream, error) {
	rc := newRawConn(addr, 4<<10)
	rc.deadline = deadline
	if err := rc.dial(); err != nil {
		return nil, err
	}
	if _, err := rc.conn.Write(req); err != nil {
		rc.close()
		return nil, fmt.Errorf("write request: %w", err)
	}
	if err := rc.hdr.Read(rc.br); err != nil {
		rc.close()
		return nil, fmt.Errorf("read response header: %w", err)
	}
	if st := rc.hdr.StatusCode(); st != 200 {
		rc.close()
		return nil, fmt.Errorf("status %d", st)
	}
	bs := newBodyStream(rc.br, rc.hdr.ContentLength())
	var p sseParser
	for {
		b, err := bs.next()
		if err != nil {
			rc.close()
			return nil, fmt.Errorf("read first event: %w", err)
		}
		if p.feed(b, nil) > 0 {
			return &idleStream{rc: rc, bs: bs}, nil
		}
		if p.bad {
			rc.close()
			return nil, errors.New("response body is not the backend's event format")
		}
	}
}
