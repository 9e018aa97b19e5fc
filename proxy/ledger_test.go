package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// The ledger tests drive the leak tests' exchanges (every way one can
// end) through a proxy with its access log, metrics and tracing all on,
// and check that the three tell the same story: each exchange is one log
// line, one request counted under the status class and route kind the
// line shows, one time to its end in the response or stream histogram,
// the bytes the lines show in the byte counters, and one server span with
// the line's status and error code.

// ledgerEnv is a leakEnv whose access log and spans the test reads.
type ledgerEnv struct {
	*leakEnv
	log *obsLogBuf
	exp *tracetest.InMemoryExporter
}

func newLedgerEnv(t *testing.T, mod func(*harnessOpts)) *ledgerEnv {
	t.Helper()
	l := &ledgerEnv{log: new(obsLogBuf), exp: tracetest.NewInMemoryExporter()}
	al, err := accesslog.New(accesslog.Config{Format: accesslog.FormatJSON, Output: l.log}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = al.Close() })
	tel := obsTelemetry(t, l.exp)
	l.leakEnv = newLeakEnv(t, func(o *harnessOpts) {
		o.cfg.AccessLog = al
		o.cfg.Telemetry = tel
		if mod != nil {
			mod(o)
		}
	})
	// newLeakEnv made a telemetry of its own before mod replaced it: the
	// gauges it reads must be the proxy's.
	l.tel = tel
	return l
}

// ledgerLine is what the test reads of an access log line.
type ledgerLine struct {
	Status    int    `json:"status"`
	Sent      int64  `json:"body_bytes_sent"`
	In        int64  `json:"bytes_in"`
	Kind      string `json:"route_kind"`
	Code      string `json:"error_code"`
	RequestID string `json:"x_cube_request_id"`
	Method    string `json:"method"`
	URI       string `json:"request_uri"`
}

func (l ledgerLine) String() string {
	return fmt.Sprintf("%s %s -> %d %s %s sent=%d in=%d id=%s", l.Method, l.URI, l.Status, l.Kind, l.Code, l.Sent, l.In, l.RequestID)
}

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

// ledgerScrape is the metrics the test compares with the lines, keyed by
// their labels.
type ledgerScrape map[string]float64

func (e *ledgerEnv) scrape(t *testing.T) ledgerScrape {
	t.Helper()
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	samples, err := testenv.ParsePromText(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	s := ledgerScrape{}
	for _, p := range samples {
		switch p.Name {
		case "cubeproxy_requests_total", "cubeproxy_request_duration_seconds_count", "cubeproxy_response_duration_seconds_count":
			s[p.Name+" "+p.Labels["status_class"]+" "+p.Labels["route_kind"]] += p.Value
		case "cubeproxy_stream_duration_seconds_count", "cubeproxy_sent_bytes_total", "cubeproxy_received_bytes_total":
			s[p.Name+" "+p.Labels["route_kind"]] += p.Value
		case "cubeproxy_streams_ended_total":
			s[p.Name+" "+p.Labels["route_kind"]+" "+p.Labels["reason"]] += p.Value
		}
	}
	return s
}

// lines returns the access log's lines.
func (e *ledgerEnv) lines(t *testing.T) []ledgerLine {
	t.Helper()
	var out []ledgerLine
	for _, ln := range strings.Split(e.log.String(), "\n") {
		if ln == "" {
			continue
		}
		var l ledgerLine
		if err := json.Unmarshal([]byte(ln), &l); err != nil {
			t.Fatalf("access log line %q: %v", ln, err)
		}
		out = append(out, l)
	}
	return out
}

// serverSpans returns the server spans exported.
func (e *ledgerEnv) serverSpans() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range e.exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer {
			out = append(out, s)
		}
	}
	return out
}

// expected is the scrape's change that lines account for.
func expected(lines []ledgerLine) ledgerScrape {
	s := ledgerScrape{}
	for _, l := range lines {
		c := statusClass(l.Status)
		s["cubeproxy_requests_total "+c+" "+l.Kind]++
		s["cubeproxy_request_duration_seconds_count "+c+" "+l.Kind]++
		s["cubeproxy_sent_bytes_total "+l.Kind] += float64(l.Sent)
		s["cubeproxy_received_bytes_total "+l.Kind] += float64(l.In)
	}
	return s
}

// diff is the scrape's change from before to after.
func diff(before, after ledgerScrape) ledgerScrape {
	d := ledgerScrape{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func (s ledgerScrape) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s = %v", k, s[k])
	}
	return b.String()
}

// account checks the lines logged, the metrics changed and the server spans
// ended since the last call against each other.
func (e *ledgerEnv) account(t *testing.T, before ledgerScrape, lines0, spans0 int) {
	t.Helper()
	var lines []ledgerLine
	var spans []tracetest.SpanStub
	var problems []string
	var got ledgerScrape
	deadline := time.Now().Add(5 * time.Second)
	for {
		problems = problems[:0]
		lines = e.lines(t)[lines0:]
		spans = e.serverSpans()[spans0:]
		got = diff(before, e.scrape(t))
		want := expected(lines)
		for k, v := range want {
			if !strings.HasPrefix(k, "cubeproxy_requests_total") && !strings.HasPrefix(k, "cubeproxy_request_duration") &&
				!strings.HasPrefix(k, "cubeproxy_sent") && !strings.HasPrefix(k, "cubeproxy_received") {
				continue
			}
			if got[k] != v {
				problems = append(problems, fmt.Sprintf("%s: lines say %v, metrics %v", k, v, got[k]))
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok && (strings.HasPrefix(k, "cubeproxy_requests_total") || strings.HasPrefix(k, "cubeproxy_request_duration") ||
				strings.HasPrefix(k, "cubeproxy_sent") || strings.HasPrefix(k, "cubeproxy_received")) {
				problems = append(problems, fmt.Sprintf("%s: metrics %v, no line", k, v))
			}
		}
		// Every exchange's end is timed once: to its last byte, or as a
		// stream's lifetime.
		var ends float64
		for k, v := range got {
			if strings.HasPrefix(k, "cubeproxy_response_duration_seconds_count") || strings.HasPrefix(k, "cubeproxy_stream_duration_seconds_count") {
				ends += v
			}
		}
		if int(ends) != len(lines) {
			problems = append(problems, fmt.Sprintf("%v ends timed, %d lines", ends, len(lines)))
		}
		if len(spans) != len(lines) {
			problems = append(problems, fmt.Sprintf("%d server spans, %d lines", len(spans), len(lines)))
		} else {
			problems = append(problems, matchSpans(lines, spans)...)
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(problems) > 0 {
		var ls []string
		for _, l := range lines {
			ls = append(ls, "\n  "+l.String())
		}
		t.Errorf("%s\nlines:%s\nmetrics changed:%s", strings.Join(problems, "\n"), strings.Join(ls, ""), got)
	}
}

// matchSpans pairs each line with the server span of its request id and
// checks that they agree.
func matchSpans(lines []ledgerLine, spans []tracetest.SpanStub) []string {
	var problems []string
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		for _, a := range s.Attributes {
			if a.Key == telemetry.AttrRequestID {
				byID[a.Value.AsString()] = s
			}
		}
	}
	for _, l := range lines {
		s, ok := byID[l.RequestID]
		if !ok {
			problems = append(problems, fmt.Sprintf("no server span for line %v", l))
			continue
		}
		attr := map[string]string{}
		for _, a := range s.Attributes {
			attr[string(a.Key)] = a.Value.String()
		}
		if attr["http.response.status_code"] != strconv.Itoa(l.Status) {
			problems = append(problems, fmt.Sprintf("line %v: span status %s", l, attr["http.response.status_code"]))
		}
		if attr["cube.error.code"] != l.Code {
			problems = append(problems, fmt.Sprintf("line %v: span cube.error.code %q", l, attr["cube.error.code"]))
		}
		if attr["http.response.body.size"] != strconv.FormatInt(l.Sent, 10) {
			problems = append(problems, fmt.Sprintf("line %v: span body size %s", l, attr["http.response.body.size"]))
		}
		if attr["cube.route.kind"] != "" && attr["cube.route.kind"] != l.Kind {
			problems = append(problems, fmt.Sprintf("line %v: span route kind %s", l, attr["cube.route.kind"]))
		}
		// A 404 or a client that left is no server error; a 5xx, or a
		// forwarded answer the proxy or the sandbox cut, is.
		wantErr := l.Status >= 500 || (l.Code != "" && !telemetry.ClientEnded(l.Code) && l.Kind != "error")
		if (s.Status.Code == codes.Error) != wantErr {
			problems = append(problems, fmt.Sprintf("line %v: span status %v", l, s.Status.Code))
		}
	}
	return problems
}

func runLedgerCases(t *testing.T, e *ledgerEnv, cases []leakCase, reps int) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.scrape(t)
			lines0, spans0 := len(e.lines(t)), len(e.serverSpans())
			for range reps {
				c.run(t, e.leakEnv)
			}
			// At rest: every exchange of the case has ended.
			e.noStep(t)
			for _, c := range e.conns {
				c.Close()
			}
			e.conns = nil
			e.waitEnded(t)
			e.account(t, before, lines0, spans0)
		})
	}
}

// Every way an exchange can end is one line, one count and one span that
// agree.
func TestLedgerEveryWayAnExchangeEnds(t *testing.T) {
	e := newLedgerEnv(t, nil)
	runLedgerCases(t, e, leakEnds, 2)
}

// So is every timeout.
func TestLedgerTimeouts(t *testing.T) {
	e := newLedgerEnv(t, leakTimeoutOpts)
	runLedgerCases(t, e, leakTimeouts, 1)
}

// ledgerMore are endings the leak tables leave out: answers without a
// body, interim heads, Expect, refusals from the head, methods of any name.
var ledgerMore = []leakCase{
	{"HEAD of a large download", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("HEAD", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", 3*wholeBody))
		leakResponse(t, br, "HEAD", 200)
		c.Close()
	}},
	{"304 with a large Content-Length", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", "If-None-Match: \"x\"\r\n"))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, fmt.Sprintf("HTTP/1.1 304 Not Modified\r\nContent-Length: %d\r\nETag: \"x\"\r\n\r\n", 3*wholeBody))
		leakResponse(t, br, "GET", 304)
		c.Close()
	}},
	{"204", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("DELETE", "/", ""))
		s := e.next(t)
		s.w.WriteHeader(204)
		s.end()
		leakResponse(t, br, "DELETE", 204)
		c.Close()
	}},
	{"103 then 200", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		c.Close()
	}},
	{"sandbox answers 100 then 413 to an upload", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Content-Length: 5\r\n")+"hello")
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig")
		io.Copy(io.Discard, leakResponse(t, br, "POST", 413).Body)
		c.Close()
	}},
	{"Expect admitted", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Content-Length: 5\r\nExpect: 100-continue\r\n"))
		leakResponse(t, br, "POST", 100)
		leakSend(t, c, "hello")
		e.next(t).answer("ok")
		io.Copy(io.Discard, leakResponse(t, br, "POST", 200).Body)
		c.Close()
	}},
	{"Expect refused, body too large", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Content-Length: 4096\r\nExpect: 100-continue\r\n"))
		io.Copy(io.Discard, leakResponse(t, br, "POST", 413).Body)
		c.Close()
	}},
	{"Expect refused, unknown sandbox", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, "POST / HTTP/1.1\r\nHost: 80-sbxledgermissing.cube.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
		io.Copy(io.Discard, leakResponse(t, br, "POST", 404).Body)
		c.Close()
	}},
	{"method FOO", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("FOO", "/", ""))
		e.next(t).answer("foo")
		io.Copy(io.Discard, leakResponse(t, br, "FOO", 200).Body)
		c.Close()
	}},
	{"head too large", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", "X-Big: "+strings.Repeat("b", 64<<10)+"\r\n"))
		io.Copy(io.Discard, leakResponse(t, br, "GET", 431).Body)
		c.Close()
	}},
	{"malformed request line", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, "GET\r\nHost: "+e.host+"\r\n\r\n")
		io.Copy(io.Discard, leakResponse(t, br, "GET", 400).Body)
		c.Close()
	}},
	{"HTTP/1.0 close-delimited answer", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, "GET / HTTP/1.0\r\nHost: "+e.host+"\r\n\r\n")
		sc, _ := e.next(t).raw(t)
		io.WriteString(sc, "HTTP/1.0 200 OK\r\n\r\nuntil close")
		sc.Close()
		io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
		c.Close()
	}},
}

// And so is each of those.
func TestLedgerMore(t *testing.T) {
	e := newLedgerEnv(t, nil)
	runLedgerCases(t, e, ledgerMore, 1)
}

// recreate stores the scripted sandbox's route again under another
// CreatedAt through the admin API: a new incarnation, whose change cuts
// what the old one had open (route_changed). Each call flips it.
func (e *leakEnv) recreate(t *testing.T) {
	t.Helper()
	port, _, _ := strings.Cut(e.host, "-")
	e.incarnation++
	body := fmt.Sprintf(`{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"%d","%s":"%s"}`, 100+e.incarnation, port, port)
	if st, out := e.h.adminDo("PUT", "/admin/routes/sbxleak", body, ""); st != 200 {
		t.Fatalf("store the route again: %d %s", st, out)
	}
	http.DefaultClient.CloseIdleConnections()
}

// ledgerRouteChanges are exchanges a change of the sandbox's route cuts.
var ledgerRouteChanges = []leakCase{
	{"SSE GET cut by a route change", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		e.recreate(t)
		io.Copy(io.Discard, resp.Body)
		s.end()
	}},
	{"SSE POST cut by a route change", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "POST")
		e.recreate(t)
		io.Copy(io.Discard, resp.Body)
		s.end()
	}},
	{"WebSocket cut by a route change", func(t *testing.T, e *leakEnv) {
		c, br, sc, sbr := e.tunnel(t)
		leakEcho(t, c, br, sc, sbr)
		e.recreate(t)
		readEOF(t, c)
		readEOF(t, sc)
	}},
	{"request waiting for its head cut by a route change", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		e.recreate(t)
		io.Copy(io.Discard, leakResponse(t, br, "GET", 502).Body)
		s.end()
		c.Close()
	}},
}

// So is every cut a route change makes.
func TestLedgerRouteChanges(t *testing.T) {
	e := newLedgerEnv(t, nil)
	runLedgerCases(t, e, ledgerRouteChanges, 1)
}

// And every exchange a drain ends, one of each kind open at once.
func TestLedgerDrain(t *testing.T) {
	e := newLedgerEnv(t, func(o *harnessOpts) { o.srv.DrainTimeout = 300 * time.Millisecond })
	before := e.scrape(t)
	var steps []*leakStep
	open := func(head string, status int) *leakStep {
		c, br := e.dial(t)
		leakSend(t, c, head)
		s := e.next(t)
		steps = append(steps, s)
		if status == 0 {
			return s // waits for its head
		}
		if strings.Contains(head, "/sse") {
			sseHeaders(s.w)
		}
		s.write("first\n\n")
		resp := leakResponse(t, br, "GET", status)
		readUntil(t, resp.Body, "first")
		return s
	}
	open(e.head("GET", "/sse", ""), 200)
	open(e.head("POST", "/sse", "Content-Length: 2\r\n")+"{}", 200)
	open(e.head("GET", "/download", ""), 200)
	open(e.head("GET", "/", ""), 0)
	c, br, sc, sbr := e.tunnel(t)
	leakEcho(t, c, br, sc, sbr)
	if err := e.h.server.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		s.end()
	}
	for _, c := range e.conns {
		c.Close()
	}
	e.conns = nil
	e.waitEnded(t)
	e.account(t, before, 0, 0)
}

// The redirect listener's answers and refusals are exchanges too.
//
// Only "stalled body" waits out a timeout, so only it runs under a short
// one: the redirect listener's client.read_timeout counts from the accept
// and bounds the whole first request, body included, and at 300 ms for
// every case a stall of the test's goroutine between its dial and its
// write (a loaded -race run) answered "body" a 408 in place of its 308.
func TestLedgerRedirectListener(t *testing.T) {
	serve := func(e *ledgerEnv) net.Listener {
		ln := listen(t, "127.0.0.1:0")
		go e.h.server.ServeRedirect(ln, "8443")
		return ln
	}
	e := newLedgerEnv(t, nil)
	ln := serve(e)
	short := newLedgerEnv(t, func(o *harnessOpts) { o.srv.ClientReadTimeout = 300 * time.Millisecond })
	shortLn := serve(short)
	const host = "Host: 50005-box.cube.test\r\n"
	for _, tc := range []struct {
		name, send string
		status     int // 0: no answer is read (the client leaves)
		cut        bool
		timesOut   bool // waits out client.read_timeout: sent to short
	}{
		{"redirect", "GET /a?b HTTP/1.1\r\n" + host + "\r\n", 308, false, false},
		{"HEAD", "HEAD /a HTTP/1.1\r\n" + host + "\r\n", 308, false, false},
		{"no Host", "GET /a HTTP/1.0\r\n\r\n", 400, false, false},
		{"body", "POST /up HTTP/1.1\r\n" + host + "Content-Length: 5\r\n\r\nhello", 308, false, false},
		{"large upload", "POST /up HTTP/1.1\r\n" + host + "Content-Length: 1048576\r\n\r\n" + strings.Repeat("u", 64<<10), 308, false, false},
		{"Expect", "POST /up HTTP/1.1\r\n" + host + "Content-Length: 1048576\r\nExpect: 100-continue\r\n\r\n", 308, false, false},
		{"method FOO", "FOO /a HTTP/1.1\r\n" + host + "\r\n", 308, false, false},
		{"head too large", "GET /a HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("b", 64<<10) + "\r\n\r\n", 431, false, false},
		{"stalled body", "POST /up HTTP/1.1\r\n" + host + "Content-Length: 10\r\n\r\nhal", 408, false, true},
		{"body cut", "POST /up HTTP/1.1\r\n" + host + "Content-Length: 10\r\n\r\nhal", 0, true, false},
		{"head cut", "GET /a HTTP/1.1\r\n" + host + "X-Half", 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ln := e, ln
			if tc.timesOut {
				e, ln = short, shortLn
			}
			before := e.scrape(t)
			lines0, spans0 := len(e.lines(t)), len(e.serverSpans())
			c := dialRaw(t, ln.Addr().String())
			leakSend(t, c, tc.send)
			if tc.cut {
				reset(c.(*net.TCPConn))
			} else {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				method := strings.Fields(tc.send)[0]
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("%v %v, want %d", resp, err, tc.status)
				}
				io.Copy(io.Discard, resp.Body)
				c.Close()
			}
			testenv.WaitFor(t, 5*time.Second, "a line", func() bool { return len(e.lines(t)) > lines0 })
			e.account(t, before, lines0, spans0)
		})
	}
}

// ledgerEarly are exchanges whose sandbox answered before the upload was
// all sent, and streams a kill cuts.
var ledgerEarly = []leakCase{
	{"sandbox refuses mid-upload, client closes", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Transfer-Encoding: chunked\r\n")+"5\r\nhello\r\n")
		// Raw: net/http reads the rest of the body before it writes a head.
		sc, sbr := e.next(t).raw(t)
		readUntil(t, sbr, "hello")
		io.WriteString(sc, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 8\r\n\r\nno token")
		io.Copy(io.Discard, leakResponse(t, br, "POST", 401).Body)
		c.Close()
		readEOF(t, sc)
	}},
	{"sandbox refuses mid-upload, client resets", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("POST", "/", "Transfer-Encoding: chunked\r\n")+"5\r\nhello\r\n")
		sc, sbr := e.next(t).raw(t)
		readUntil(t, sbr, "hello")
		io.WriteString(sc, "HTTP/1.1 413 Too Large\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ntoo much\r\n")
		readUntil(t, leakResponse(t, br, "POST", 413).Body, "too much")
		reset(c)
		readEOF(t, sc)
	}},
	{"SSE GET, sandbox killed", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		e.kill(t)
		io.Copy(io.Discard, resp.Body)
		s.end()
	}},
	{"chunked download, sandbox killed", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		s.write("piece one\n")
		resp := leakResponse(t, br, "GET", 200)
		readUntil(t, resp.Body, "piece one")
		e.kill(t)
		io.Copy(io.Discard, resp.Body)
		s.end()
	}},
	{"request waiting for its head, sandbox killed", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		leakSend(t, c, e.head("GET", "/", ""))
		s := e.next(t)
		e.kill(t)
		io.Copy(io.Discard, leakResponse(t, br, "GET", 410).Body)
		s.end()
		c.Close()
	}},
}

// And so is each of those.
func TestLedgerEarlyAnswersAndKills(t *testing.T) {
	e := newLedgerEnv(t, nil)
	runLedgerCases(t, e, ledgerEarly, 1)
}

// Over TLS, every end of an exchange is told apart as over plain TCP: a
// client that leaves with a close_notify, with a bare close or with a
// reset; a head left halfway; a tunnel closed.
//
// Only "head stalled" waits out client.read_timeout, so only it runs under
// a short one (on short): the timeout counts from the accept and bounds
// the handshake and the first head together, and at 300 ms for every case
// a loaded -race run's stall in either timed out a case that tests
// something else. e, addr and roots are the env of the case running.
func TestLedgerOverTLS(t *testing.T) {
	long := newLedgerEnv(t, nil)
	longAddr, longRoots := serveTLS(t, long.h)
	short := newLedgerEnv(t, func(o *harnessOpts) {
		o.srv.ClientReadTimeout = 300 * time.Millisecond
	})
	shortAddr, shortRoots := serveTLS(t, short.h)
	e, addr, roots := long, longAddr, longRoots
	dial := func(t *testing.T) (*tls.Conn, *net.TCPConn, *bufio.Reader) {
		raw := dialRaw(t, addr).(*net.TCPConn)
		c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: e.host})
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		return c, raw, bufio.NewReader(c)
	}
	for _, tc := range []struct {
		name     string
		run      func(t *testing.T)
		timesOut bool // waits out client.read_timeout: runs on short
	}{
		{"plain", func(t *testing.T) {
			c, _, br := dial(t)
			leakSend(t, c, e.head("GET", "/", ""))
			e.next(t).answer("hello")
			io.Copy(io.Discard, leakResponse(t, br, "GET", 200).Body)
			c.Close()
		}, false},
		{"SSE, client closes with close_notify", func(t *testing.T) {
			c, _, br := dial(t)
			s, _ := e.sseOpen(t, c, br, "GET")
			c.Close()
			e.openStreamsGone(t)
			s.end()
		}, false},
		{"SSE POST, client closes bare", func(t *testing.T) {
			c, raw, br := dial(t)
			s, _ := e.sseOpen(t, c, br, "POST")
			raw.Close()
			e.openStreamsGone(t)
			s.end()
		}, false},
		{"download, client resets", func(t *testing.T) {
			c, raw, br := dial(t)
			leakSend(t, c, e.head("GET", "/", ""))
			s := e.next(t)
			s.w.Header().Set("Content-Length", fmt.Sprint(3*wholeBody))
			s.write(strings.Repeat("d", wholeBody))
			resp := leakResponse(t, br, "GET", 200)
			io.ReadFull(resp.Body, make([]byte, 1024))
			reset(raw)
			s.write(strings.Repeat("d", 2*wholeBody))
			s.end()
		}, false},
		{"client closes while the sandbox thinks", func(t *testing.T) {
			c, _, _ := dial(t)
			leakSend(t, c, e.head("GET", "/", ""))
			s := e.next(t)
			c.Close()
			s.write("late")
			s.end()
		}, false},
		{"WebSocket, client closes", func(t *testing.T) {
			c, _, br := dial(t)
			leakSend(t, c, e.head("GET", "/ws", leakUpgrade))
			sc, sbr := e.next(t).raw(t)
			io.WriteString(sc, ws101)
			leakResponse(t, br, "GET", 101)
			leakEcho(t, c, br, sc, sbr)
			c.Close()
			readEOF(t, sc)
		}, false},
		{"head left halfway", func(t *testing.T) {
			c, raw, _ := dial(t)
			leakSend(t, c, "GET / HTTP/1.1\r\nHost: "+e.host+"\r\nX-Half")
			reset(raw)
		}, false},
		{"head stalled", func(t *testing.T) {
			c, _, br := dial(t)
			leakSend(t, c, "GET / HTTP/1.1\r\nHost: "+e.host+"\r\nX-Half")
			io.Copy(io.Discard, leakResponse(t, br, "GET", 408).Body)
			c.Close()
		}, true},
		{"head too large", func(t *testing.T) {
			c, _, br := dial(t)
			leakSend(t, c, e.head("GET", "/", "X-Big: "+strings.Repeat("b", 64<<10)+"\r\n"))
			io.Copy(io.Discard, leakResponse(t, br, "GET", 431).Body)
			c.Close()
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, addr, roots = long, longAddr, longRoots
			if tc.timesOut {
				e, addr, roots = short, shortAddr, shortRoots
			}
			before := e.scrape(t)
			lines0, spans0 := len(e.lines(t)), len(e.serverSpans())
			tc.run(t)
			e.noStep(t)
			for _, c := range e.conns {
				c.Close()
			}
			e.conns = nil
			e.waitEnded(t)
			testenv.WaitFor(t, 5*time.Second, "a line", func() bool { return len(e.lines(t)) > lines0 })
			e.account(t, before, lines0, spans0)
		})
	}
}

// ledgerStreamLimit are exchanges over max_streams_per_sandbox (1 here):
// refused after their wait, served once a slot frees, or left by their
// client while they wait.
var ledgerStreamLimit = []leakCase{
	{"refused after the wait", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		c2, br2 := e.dial(t)
		leakSend(t, c2, e.head("GET", "/", ""))
		io.Copy(io.Discard, leakResponse(t, br2, "GET", 429).Body)
		s.end()
		io.Copy(io.Discard, resp.Body)
	}},
	{"served once the slot frees", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		c2, br2 := e.dial(t)
		leakSend(t, c2, e.head("GET", "/", ""))
		s.end()
		io.Copy(io.Discard, resp.Body)
		e.next(t).answer("late")
		io.Copy(io.Discard, leakResponse(t, br2, "GET", 200).Body)
	}},
	{"client leaves while it waits", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		c2, _ := e.dial(t)
		leakSend(t, c2, e.head("GET", "/", ""))
		testenv.WaitFor(t, 5*time.Second, "the wait", func() bool { return e.h.proxy.limitWaiting.Load() == 1 })
		c2.Close()
		testenv.WaitFor(t, 5*time.Second, "the wait's end", func() bool { return e.h.proxy.limitWaiting.Load() == 0 })
		s.end()
		io.Copy(io.Discard, resp.Body)
	}},
}

// So is every exchange the stream limit holds back.
func TestLedgerStreamLimit(t *testing.T) {
	e := newLedgerEnv(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.StreamLimitWait = 300 * time.Millisecond
	})
	runLedgerCases(t, e, ledgerStreamLimit, 1)
}

// jsonrpcBody is a JSON-RPC message of n bytes or so: a response (the
// stream limit lets it through) or a request (it refuses it).
func jsonrpcBody(n int, request bool) string {
	pad := strings.Repeat("p", n)
	if request {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"pad":"` + pad + `"}}`
	}
	return `{"jsonrpc":"2.0","id":7,"result":{"pad":"` + pad + `"}}`
}

// ledgerHeldBodies are bodies read whole at the stream limit to be judged.
var ledgerHeldBodies = []leakCase{
	{"held response, admitted", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		body := jsonrpcBody(20<<10, false)
		c2, br2 := e.dial(t)
		leakSend(t, c2, e.head("POST", "/mcp", fmt.Sprintf("Content-Length: %d\r\nContent-Type: application/json\r\n", len(body)))+body)
		s2 := e.next(t)
		io.Copy(io.Discard, s2.r.Body)
		s2.w.WriteHeader(202)
		s2.end()
		io.Copy(io.Discard, leakResponse(t, br2, "POST", 202).Body)
		s.end()
		io.Copy(io.Discard, resp.Body)
	}},
	{"held request, refused", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		body := jsonrpcBody(20<<10, true)
		c2, br2 := e.dial(t)
		leakSend(t, c2, e.head("POST", "/mcp", fmt.Sprintf("Content-Length: %d\r\nContent-Type: application/json\r\n", len(body)))+body)
		io.Copy(io.Discard, leakResponse(t, br2, "POST", 429).Body)
		s.end()
		io.Copy(io.Discard, resp.Body)
	}},
	{"held body left halfway", func(t *testing.T, e *leakEnv) {
		c, br := e.dial(t)
		s, resp := e.sseOpen(t, c, br, "GET")
		body := jsonrpcBody(20<<10, false)
		c2, _ := e.dial(t)
		leakSend(t, c2, e.head("POST", "/mcp", fmt.Sprintf("Content-Length: %d\r\nContent-Type: application/json\r\n", len(body)))+body[:12<<10])
		testenv.WaitFor(t, 5*time.Second, "the read", func() bool { return e.h.proxy.heldBodies.used.Load() > 0 })
		reset(c2)
		testenv.WaitFor(t, 5*time.Second, "the read's end", func() bool { return e.h.proxy.heldBodies.used.Load() == 0 })
		s.end()
		io.Copy(io.Discard, resp.Body)
	}},
}

// So is every body held at the stream limit.
func TestLedgerHeldBodies(t *testing.T) {
	e := newLedgerEnv(t, func(o *harnessOpts) {
		o.cfg.MaxStreamsPerSandbox = 1
		o.cfg.MaxRequestBodySize = 1 << 20
	})
	runLedgerCases(t, e, ledgerHeldBodies, 1)
}
