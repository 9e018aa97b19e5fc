package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// The access log's side of the soak (-access-log): logrotate's rename and
// SIGHUP under load, and at the end one line for every request the proxy
// counted, across the file and its rotated copies.

// rotator renames the proxy's access log to <path>.<n> and sends the proxy
// SIGHUP every l.hupEvery, as logrotate's create mode does; the proxy must
// reopen the path and lose no line.
func (l *soakLoad) rotator(ctx context.Context) {
	a := l.stats("rename+sighup")
	for {
		sleepCtx(ctx, l.hupEvery)
		if ctx.Err() != nil {
			return
		}
		err := os.Rename(l.accessLog, fmt.Sprintf("%s.%d", l.accessLog, l.rotations.Add(1)))
		if err == nil {
			err = syscall.Kill(l.pid, syscall.SIGHUP)
		}
		if err != nil {
			a.fail(fmt.Errorf("rotate access log: %w", err))
			continue
		}
		a.ok.Add(1)
	}
}

// countLogLines counts the complete lines of path and of every file whose
// name is path followed by a dot (its rotated copies).
func countLogLines(path string) (int64, error) {
	rotated, err := filepath.Glob(path + ".*")
	if err != nil {
		return 0, fmt.Errorf("list rotated access logs: %w", err)
	}
	var n int64
	buf := make([]byte, 1<<20)
	for _, name := range append([]string{path}, rotated...) {
		f, err := os.Open(name)
		if err != nil {
			return 0, fmt.Errorf("count access-log lines: %w", err)
		}
		for {
			k, err := f.Read(buf)
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return 0, fmt.Errorf("count access-log lines of %s: %w", name, err)
			}
		}
		f.Close()
	}
	return n, nil
}

// logAgreement returns why the access log's lines do not match the
// requests the proxy counted (cubeproxy_requests_total): each request is
// one line, written or counted as dropped (cubeproxy_accesslog_dropped_total).
func logAgreement(lines int64, requests, dropped float64) string {
	if float64(lines)+dropped == requests {
		return ""
	}
	return fmt.Sprintf("access log has %d lines (+%.0f dropped) for %.0f requests counted", lines, dropped, requests)
}

// waitLogLines polls the access log until its lines and the proxy's
// counters agree (the writer flushes what is queued at once, but the
// counters and the line of one request are not updated together), or
// until timeout; it returns the last reason they disagree, if any.
func (s *soakSampler) waitLogLines(path string, timeout time.Duration) (string, error) {
	end := time.Now().Add(timeout)
	for {
		m, err := s.scrape()
		if err != nil {
			return "", err
		}
		lines, err := countLogLines(path)
		if err != nil {
			return "", err
		}
		why := logAgreement(lines, sumOf(m["cubeproxy_requests_total"]), sumOf(m["cubeproxy_accesslog_dropped_total"]))
		if why == "" || !time.Now().Before(end) {
			fmt.Printf("access log: %d lines, %.0f requests counted, %.0f dropped\n",
				lines, sumOf(m["cubeproxy_requests_total"]), sumOf(m["cubeproxy_accesslog_dropped_total"]))
			return why, nil
		}
		time.Sleep(time.Second)
	}
}
