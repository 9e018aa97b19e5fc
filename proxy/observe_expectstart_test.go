package proxy

import (
	"bufio"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An upload sent with "Expect: 100-continue" is one request, whose head is
// judged first (here: its paused sandbox resumed) and whose body's run
// follows the 100. Its server span and its latency histograms run from its
// head, as its access log line's request_time does: they started at the
// body's run, so a resume, a wait for a slot or a slow route lookup that
// held the head showed in neither, and the trace of an upload that waited
// seconds for its sandbox showed a span of milliseconds.
func TestExpectRequestTimedFromItsHead(t *testing.T) {
	called, release := make(chan time.Time, 1), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // a failed test must not leave the call held
	sc := newFakeSidecar(t, func() int {
		called <- time.Now()
		<-release
		return 200
	})
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	h, host := resumeHarness(t, sc, 30*time.Second, func(o *harnessOpts) { o.cfg.Telemetry = tel })
	admin := obsMetricsAdmin(t, h, tel)
	h.setSandboxState("sleepy", "paused")
	before := scrapeMetrics(t, admin)

	c := dialRaw(t, h.addr)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nX-Cube-Request-Id: rid-expect\r\nExpect: 100-continue\r\n\r\n", host)
	// The head's run began before the lifecycle manager got its call.
	headJudged := testenv.Recv(t, called, 10*time.Second, "the head's resume call")
	// Held long enough that the body's run alone cannot take as long.
	const hold = time.Second
	time.Sleep(hold)
	released := time.Now()
	free()
	if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
		t.Fatalf("the head once resumed: %d %q, want 100", resp.StatusCode, b)
	}
	fmt.Fprint(c, "hello")
	if resp, b := readExpectAnswer(t, br); resp.StatusCode != 200 || b != "up" {
		t.Fatalf("the body's run: %d %q, want 200 \"up\"", resp.StatusCode, b)
	}

	server, _ := waitSandboxSpans(t, exp, "sleepy")
	if !server.StartTime.Before(headJudged) {
		t.Errorf("server span starts %v after the head's resume call, want before it: the span covers the head's judgement",
			server.StartTime.Sub(headJudged))
	}
	after := scrapeMetrics(t, admin)
	for _, name := range []string{"cubeproxy_request_duration_seconds_sum", "cubeproxy_response_duration_seconds_sum"} {
		b, _ := metricValue(before, name, map[string]string{"status_class": "2xx", "route_kind": "http"})
		a, _ := metricValue(after, name, map[string]string{"status_class": "2xx", "route_kind": "http"})
		if min := released.Sub(headJudged).Seconds(); a-b < min {
			t.Errorf("%s moved by %.3fs, want at least the %.3fs the head waited for its resume", name, a-b, min)
		}
	}
}
