package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
)

// At a drain every GET event stream ends at once, and each one's access-log
// line with it. The log's sink is a pipe nobody reads while the streams end
// (a log shipper that lags), and its queue is far shorter than the
// streams: every stream's line must still reach the sink once it is read,
// none dropped. Earlier builds dropped the lines the queue had no room for
// (on the built binary, 9,900 streams and a shipper reading a FIFO at
// 3 MB/s: 4,141 of 9,900 lines lost with the default 4,096-line queue).
func TestDrainLogsEveryStreamBehindASlowSink(t *testing.T) {
	const streams, queue = 300, 16
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close(); pw.Close() })
	al, err := accesslog.New(accesslog.Config{Format: accesslog.FormatJSON, Output: pw, BufferLines: queue}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = al.Close() })
	h := newHarness(t, func(o *harnessOpts) { o.srv.DrainTimeout = 30 * time.Second; o.cfg.AccessLog = al })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := sseHeaders(w)
		fmt.Fprint(w, "data: hello\n\n")
		f.Flush()
		<-r.Context().Done()
	}))
	host := h.route("drainlog", port)

	var opened, ended sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		opened.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			resp, err := h.client.Do(h.req("GET", host, "/", nil))
			if err != nil {
				errs <- err
				opened.Done()
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			_, err = readEvent(br)
			opened.Done()
			if err != nil {
				errs <- fmt.Errorf("first event: %w", err)
				return
			}
			if _, err := io.ReadAll(br); err != nil {
				errs <- fmt.Errorf("stream did not end cleanly at the drain: %w", err)
			}
		}()
	}
	opened.Wait()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	ended.Wait()
	drainEnds(t, shutdownDone, 30*time.Second, "Shutdown did not return")
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The shipper reads again; the process exits after Close.
	var got bytes.Buffer
	read := make(chan struct{})
	go func() { defer close(read); _, _ = io.Copy(&got, pr) }()
	if err := al.Close(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	<-read
	if n := bytes.Count(got.Bytes(), []byte(`"route_kind":"sse"`)); n != streams || al.Dropped() != 0 {
		t.Errorf("%d lines of %d streams written, %d dropped; want every stream's line", n, streams, al.Dropped())
	}
}
