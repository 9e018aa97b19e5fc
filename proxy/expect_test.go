package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// A client that sends "Expect: 100-continue" waits for the go-ahead before
// its body. A request the proxy refuses from its head (an unknown, paused
// or killed sandbox, a missing token, a declared size over the limit) is
// answered then, before the body is sent, as nginx answers it; one that
// passes gets 100, and its body reaches the sandbox, which never sees the
// expectation. Each client here sends its head alone and waits: without
// the check it reads "100 Continue" where the refusal should be.
func TestExpectContinueRefusedBeforeTheBody(t *testing.T) {
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.cfg.MaxRequestBodySize = 1 << 20 })
	var sawExpect atomic.Int64
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Expect") != "" {
			sawExpect.Add(1)
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	const token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	putAuthRoute(h, "expopen", "", port, 8080)
	putAuthRoute(h, "exptoken", token, port, 8080)
	putAuthRoute(h, "exppaused", "", port, 8080)
	putAuthRoute(h, "expkilled", "", port, 8080)
	if code, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"exppaused","state":"paused"}`, ""); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"expkilled"}`, ""); code != 200 {
		t.Fatalf("kill: %d %s", code, body)
	}

	for _, tc := range []struct {
		name, id, extra string
		size            int
		status          int
		code            string // error code; "" for the sandbox's answer
	}{
		{"unknown sandbox", "expnone", "", 4096, 404, CodeNotFound},
		{"token missing", "exptoken", "", 4096, 403, auth.CodeTrafficTokenMissing},
		{"token wrong", "exptoken", "cube-traffic-access-token: " + strings.Repeat("0", 64) + "\r\n", 4096, 403, auth.CodeTrafficTokenInvalid},
		{"paused", "exppaused", "", 4096, 503, CodeSandboxPausing},
		{"killed", "expkilled", "", 4096, 410, CodeSandboxKilled},
		{"port not mapped", "expopen", "", 4096, 404, CodePortNotMapped},
		{"declared size over the limit", "expopen", "", 2 << 20, 413, CodeBodyTooLarge},
		{"admitted", "expopen", "", 4096, 200, ""},
		{"admitted with its token", "exptoken", "cube-traffic-access-token: " + token + "\r\n", 4096, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := "8080-" + tc.id + ".cube.test"
			if tc.code == CodePortNotMapped {
				host = "9090-" + tc.id + ".cube.test"
			}
			reqID := "expect-" + strings.ReplaceAll(tc.name, " ", "-")
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "PUT /upload HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\n%sContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
				host, reqID, tc.extra, tc.size)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to the head: %v", err)
			}
			if tc.code != "" {
				// Refused: the answer came while the body was held back.
				b, _ := io.ReadAll(resp.Body)
				var e struct{ Error, Code string }
				if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || e.Code != tc.code {
					t.Fatalf("got %d %s, want %d with code %s before the body", resp.StatusCode, b, tc.status, tc.code)
				}
				if resp.Header.Get("X-Cube-Request-Id") != reqID {
					t.Errorf("X-Cube-Request-Id %q, want %q", resp.Header.Get("X-Cube-Request-Id"), reqID)
				}
				entry := buf.waitJSON(t, reqID)
				if entry["status"] != float64(tc.status) || entry["error_code"] != tc.code || entry["bytes_in"] != float64(0) {
					t.Errorf("access log %v: want status %d, error_code %s, bytes_in 0", entry, tc.status, tc.code)
				}
				return
			}
			if resp.StatusCode != http.StatusContinue {
				t.Fatalf("got %d, want 100 Continue", resp.StatusCode)
			}
			if _, err := c.Write(make([]byte, tc.size)); err != nil {
				t.Fatal(err)
			}
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprintf("got %d bytes", tc.size); resp.StatusCode != 200 || string(b) != want {
				t.Fatalf("got %d %q, want 200 %q", resp.StatusCode, b, want)
			}
			entry := buf.waitJSON(t, reqID)
			if entry["status"] != float64(200) || entry["bytes_in"] != float64(tc.size) {
				t.Errorf("access log %v: want status 200, bytes_in %d", entry, tc.size)
			}
			// The head judged alone is not a request of its own.
			// The log is written in order: once a later request's line is
			// there, so is every line of this one.
			later := h.req("GET", "8080-expopen.cube.test", "/", nil)
			later.Header.Set("X-Cube-Request-Id", reqID+"-later")
			resp = h.do(later)
			resp.Body.Close()
			buf.waitJSON(t, reqID+"-later")
			if n := strings.Count(buf.String(), `"x_cube_request_id":"`+reqID+`"`); n != 1 {
				t.Errorf("%d access log lines for the request, want 1", n)
			}
		})
	}
	if n := sawExpect.Load(); n != 0 {
		t.Errorf("the sandbox saw Expect on %d requests", n)
	}
}

// A client that stops waiting for 100 and sends its body anyway still
// reads the refusal: the proxy reads and drops what comes (a lingering
// close) rather than closing on unread bytes, which the client would get
// as a reset, failing its upload's write and the read of the answer.
func TestExpectContinueRefusalWhileTheBodyComes(t *testing.T) {
	h := newHarness(t)
	c := dialRaw(t, h.addr)
	const size = 14 << 20 // more than the socket buffers hold, under lingerLimit
	fmt.Fprintf(c, "PUT /upload HTTP/1.1\r\nHost: 8080-expgone.cube.test\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", size)
	// The whole body first, the answer after: as a client that sends
	// before it reads.
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatalf("sending the body: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer after the body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(b), CodeNotFound) {
		t.Fatalf("got %d %s, want 404 %s", resp.StatusCode, b, CodeNotFound)
	}
}

// holdStore holds the lookup of one sandbox id until release is closed,
// telling entered when it starts; other ids pass straight through.
type holdStore struct {
	routing.Store
	id      string
	entered chan struct{}
	release chan struct{}
}

func (s *holdStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if id == s.id {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.Lookup(ctx, id)
}

// An Expect request is one request in every record, whether its head is
// refused or admitted: its access log line, its server span and the cache
// lookup metric say what the request met. The head's lookup is the one
// that went to the store: an admitted upload to a sandbox not yet cached
// is a miss (its second lookup, once the body comes, finds what the first
// cached); a refused head is the connection's request it is, not the one
// before; and its span covers the lookup that decided it.
func TestExpectContinueObserved(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := obsTelemetry(t, exp)
	hold := &holdStore{Store: routing.NewMemoryStore(), id: "expslow", entered: make(chan struct{}, 1), release: make(chan struct{})}
	h, buf := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) {
		o.cfg.Telemetry = tel
		o.store = hold
	})
	admin := obsMetricsAdmin(t, h, tel)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	// Written in the store alone: the cache has not seen them.
	for _, id := range []string{"expcold", "expwarm"} {
		r, err := routing.ParseRouteStrict(id, map[string]string{"HostIP": "127.0.0.1", "8080": itoa(port)})
		if err != nil {
			t.Fatal(err)
		}
		if err := hold.Store.(*routing.MemoryStore).Put(r); err != nil {
			t.Fatal(err)
		}
	}

	if st, b, _ := h.get("8080-expwarm.cube.test", "/"); st != 200 {
		t.Fatalf("warming expwarm: %d %s", st, b)
	}

	for i, tc := range []struct {
		name   string
		before string // a request sent first on the connection, answered 200
		id     string
		hold   bool // the head's lookup waits until the test lets it go
		status int
		cache  string
		conn   float64 // connection_requests
	}{
		{name: "admitted, route not cached yet", id: "expcold", status: 200, cache: "miss", conn: 1},
		{name: "admitted, second on its connection", before: "expwarm", id: "expwarm", status: 200, cache: "hit", conn: 2},
		{name: "refused, second on its connection", before: "expwarm", id: "expnone", status: 404, cache: "miss", conn: 2},
		{name: "refused after a slow lookup", id: "expslow", hold: true, status: 404, cache: "miss", conn: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqID := fmt.Sprintf("expect-observed-%d", i)
			traceID := fmt.Sprintf("%032x", 0xe0+i)
			tid, err := trace.TraceIDFromHex(traceID)
			if err != nil {
				t.Fatal(err)
			}
			c := dialRaw(t, h.addr)
			br := bufio.NewReader(c)
			if tc.before != "" {
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 8080-%s.cube.test\r\n\r\n", tc.before)
				if resp, b := readExpectAnswer(t, br); resp.StatusCode != 200 {
					t.Fatalf("first request: %d %s", resp.StatusCode, b)
				}
			}
			before := scrapeMetrics(t, admin)
			sent := time.Now()
			fmt.Fprintf(c, "PUT /up HTTP/1.1\r\nHost: 8080-%s.cube.test\r\nX-Cube-Request-Id: %s\r\nTraceparent: 00-%s-00f067aa0ba902b7-01\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
				tc.id, reqID, traceID)
			released := sent
			if tc.hold {
				<-hold.entered
				// The lookup is under way; what the span says started
				// before this.
				released = time.Now()
				close(hold.release)
			}
			resp, b := readExpectAnswer(t, br)
			if resp.StatusCode == http.StatusContinue {
				io.WriteString(c, "hello")
				resp, b = readExpectAnswer(t, br)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, b, tc.status)
			}

			entry := buf.waitJSON(t, reqID)
			if entry["cache_result"] != tc.cache || entry["connection_requests"] != tc.conn {
				t.Errorf("access log cache_result %v, connection_requests %v; want %s, %v", entry["cache_result"], entry["connection_requests"], tc.cache, tc.conn)
			}
			var server tracetest.SpanStub
			testenv.WaitFor(t, 5*time.Second, "the request's server span", func() bool {
				s := spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)
				if len(s) > 0 {
					server = s[0]
				}
				return len(s) > 0
			})
			checkAttrs(t, "server span", server.Attributes, map[attribute.Key]string{
				telemetry.AttrCacheResult:   tc.cache,
				"http.response.status_code": fmt.Sprint(tc.status),
			})
			if tc.hold && !server.StartTime.Before(released) {
				t.Errorf("server span starts at %v, after the lookup it waited for (released at %v)", server.StartTime, released)
			}
			// The log is written in order and a span ends before its
			// line: the next request's line means no other span of
			// this one is left to come.
			later := h.req("GET", "8080-expwarm.cube.test", "/", nil)
			later.Header.Set("X-Cube-Request-Id", reqID+"-after")
			h.do(later).Body.Close()
			buf.waitJSON(t, reqID+"-after")
			if n := len(spanByKind(exp.GetSpans(), tid, trace.SpanKindServer)); n != 1 {
				t.Errorf("%d server spans, want 1", n)
			}
			after := scrapeMetrics(t, admin)
			// The barrier's own lookup is a hit.
			want := []metricDelta{
				{"cubeproxy_route_cache_lookups_total", nil, 2},
				{"cubeproxy_route_cache_lookups_total", map[string]string{"result": tc.cache}, map[bool]float64{true: 2, false: 1}[tc.cache == "hit"]},
			}
			for _, d := range checkDeltas(before, after, want) {
				t.Error(d)
			}
		})
	}
}

// readExpectAnswer reads one response (an interim 100 too) and its body.
func readExpectAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
