//lint:file-ignore SA1019 sampling and roots, deprecated by MCP 2026-07-28 (SEP-2577), stay in use for its deprecation window of at least a year, and the proxy must relay them.

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Most agents are not written in Go: the official TypeScript SDK client
// (@modelcontextprotocol/sdk, pinned in testdata/tsmcp/package-lock.json)
// talks through a real proxy to a go-sdk gateway. testdata/tsmcp/client.mjs
// is the agent; it prints what it saw as JSON lines.

// tsmcpDir is the directory of the Node client, its dependencies installed
// (npm ci) unless node_modules already matches package-lock.json. A file
// lock keeps test processes that run at once from installing over each
// other. Node and npm missing fail the test: make test installs them.
func tsmcpDir(t *testing.T) (dir, node string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: the TypeScript MCP SDK interop test needs Node.js >= 18 and npm (make test installs them: apt-get install nodejs npm)")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm not found: the TypeScript MCP SDK interop test installs its client with npm ci (make test installs it: apt-get install npm)")
	}
	dir, err = filepath.Abs(filepath.Join("testdata", "tsmcp"))
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("npm ci lock: %v", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatalf("npm ci lock: %v", err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	pkgLock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pkgLock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".cubeproxy-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return dir, node
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	t.Logf("npm ci took %v", time.Since(start).Round(time.Millisecond))
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, node
}

// tsGateway is the go-sdk gateway client.mjs talks to (see its header for
// the tools), with an event store (resumable streams). Its handler checks
// the credentials each request carries and records what the test asserts.
type tsGateway struct {
	bearer string
	sb     func() *sandboxState
	// jsonResponse: the gateway answers calls as plain JSON
	// (StreamableHTTPOptions.JSONResponse).
	jsonResponse bool
	// legacy: the HTTP+SSE transport, whose GET stream is the session
	// (no standalone stream for the gateway to notify after a cut).
	legacy bool

	// postCut is closed once the handler of the resume call's POST has
	// returned: the gateway saw the client's cut through the proxy.
	postCut     chan struct{}
	postCutOnce sync.Once
	// getCut is closed once the first standalone GET's handler has
	// returned (the client cut it) and the tool list changed after it.
	getCut     chan struct{}
	getCutOnce sync.Once
	// rootsChanged: the client's notifications/roots/list_changed came.
	rootsChanged     chan struct{}
	rootsChangedOnce sync.Once

	mu sync.Mutex
	// problems are failures seen in the handler, reported by the test.
	problems []string
	// seen is each request as "METHOD kind status".
	seen []string
	// answerInFlight is the sandbox's count of requests in flight when the
	// sampling answer reached the gateway (the answer's own included).
	answerInFlight int64
}

func (g *tsGateway) problem(format string, args ...any) {
	g.mu.Lock()
	g.problems = append(g.problems, fmt.Sprintf(format, args...))
	g.mu.Unlock()
}

// server is the MCP server behind the gateway.
func (g *tsGateway) server() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "gateway", Version: "v1"}, &mcp.ServerOptions{
		RootsListChangedHandler: func(context.Context, *mcp.RootsListChangedRequest) {
			g.rootsChangedOnce.Do(func() { close(g.rootsChanged) })
		},
	})
	progress := func(ctx context.Context, req *mcp.CallToolRequest, n float64, msg string) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: n, Message: msg})
	}
	textResult := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "ack"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		progress(ctx, req, 1, "waiting for roots/list_changed")
		select {
		case <-g.rootsChanged:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		progress(ctx, req, 2, "roots changed")
		return textResult("acked"), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "touch"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return textResult("late"), nil, nil
		})
		return textResult("touched"), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "sample"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10000,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "write a lot"}}}})
		if err != nil {
			return nil, nil, err
		}
		return textResult(fmt.Sprintf("sampled %d bytes from %s", len(res.Content.(*mcp.TextContent).Text), res.Model)), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "resume"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		progress(ctx, req, 1, "before the cut")
		select {
		case <-g.postCut:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		// Sent while the client has no stream open for this call: the
		// event store keeps it for the Last-Event-ID GET.
		progress(ctx, req, 2, "after the cut")
		return textResult("resumed"), nil, nil
	})
	return srv
}

// statusWriter records the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.ResponseWriter.(http.Flusher).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// handler wraps the go-sdk's streamable HTTP handler for srv.
func (g *tsGateway) handler(srv *mcp.Server) http.Handler {
	return g.wrap(srv, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil), DisableLocalhostProtection: true, JSONResponse: g.jsonResponse}))
}

// wrap is the gateway's checks and records around hd, the go-sdk's handler
// for srv.
func (g *tsGateway) wrap(srv *mcp.Server, hd http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, name := range []string{"Cube-Traffic-Access-Token", "E2b-Traffic-Access-Token"} {
			if r.Header.Get(name) != "" {
				g.problem("%s %s reached the gateway with the proxy's credential %s", r.Method, r.URL, name)
			}
		}
		if r.URL.Query().Has("cube_token") {
			g.problem("%s reached the gateway with the signed URL's cube_token", r.Method)
		}
		if r.Header.Get("Authorization") != g.bearer {
			g.problem("%s reached the gateway with Authorization %q", r.Method, r.Header.Get("Authorization"))
			http.Error(w, "gateway says no", http.StatusUnauthorized)
			return
		}
		kind := r.Method
		var body []byte
		if r.Method == http.MethodPost {
			var err error
			if body, err = io.ReadAll(r.Body); err != nil {
				g.problem("reading a POST body at the gateway: %v", err)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			switch {
			case bytes.Contains(body, []byte(`"name":"resume"`)):
				kind = "call:resume"
			case bytes.Contains(body, []byte(`"model":"ts-model"`)):
				kind = "sampling-answer"
				g.mu.Lock()
				g.answerInFlight = g.sb().inFlight()
				g.mu.Unlock()
			}
		}
		if eid := r.Header.Get("Last-Event-ID"); r.Method == http.MethodGet && eid != "" {
			// The go-sdk refuses a resumption (409) while the stream's
			// first request still runs at the gateway; waiting here for
			// the gateway to see the cut makes the first attempt the one
			// that counts. A standalone stream's event ids start with "_".
			cut := g.postCut
			kind = "GET resume"
			if strings.HasPrefix(eid, "_") {
				kind, cut = "GET resume standalone", g.getCut
			}
			select {
			case <-cut:
			case <-time.After(20 * time.Second):
				g.problem("%s: the cut stream still ran at the gateway 20s after the client's Last-Event-ID GET", kind)
			}
		}
		sw := &statusWriter{ResponseWriter: w}
		hd.ServeHTTP(sw, r)
		switch {
		case kind == "call:resume":
			g.postCutOnce.Do(func() { close(g.postCut) })
		case kind == http.MethodGet && !g.legacy:
			g.getCutOnce.Do(func() {
				// Sent while the client has no GET stream: the event
				// store keeps it for the Last-Event-ID GET.
				mcp.AddTool(srv, &mcp.Tool{Name: "later"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
					return &mcp.CallToolResult{}, nil, nil
				})
				close(g.getCut)
			})
		}
		g.mu.Lock()
		g.seen = append(g.seen, fmt.Sprintf("%s %d", kind, sw.status))
		g.mu.Unlock()
	})
}

// tsLine is one line client.mjs printed.
type tsLine struct {
	Ev              string         `json:"ev"`
	Kind            string         `json:"kind"`
	Method          string         `json:"method"`
	Status          int            `json:"status"`
	OpenWith        int            `json:"openWith"`
	ContentType     string         `json:"contentType"`
	ProtocolVersion string         `json:"protocolVersion"`
	SessionID       string         `json:"sessionId"`
	Names           []string       `json:"names"`
	Progress        []string       `json:"progress"`
	Result          string         `json:"result"`
	Requests        int            `json:"requests"`
	MaxOpen         int            `json:"maxOpen"`
	Connections     int            `json:"connections"`
	Heartbeats      int            `json:"heartbeats"`
	Kinds           map[string]int `json:"kinds"`
	Errors          []string       `json:"errors"`
	Error           string         `json:"error"`
	Resumes         []tsGet        `json:"resumes"`
	Gets            []tsGet        `json:"gets"`
	// legacy.mjs: the POST endpoint the SSE stream announced (its
	// sessionid and token values masked), whether a POST URL carried the
	// signed URL's token, and its POSTs.
	Endpoint string   `json:"endpoint"`
	Token    bool     `json:"token"`
	Posts    []tsPost `json:"posts"`
}

// tsPost is a POST of legacy.mjs: its status and what its URL carried.
type tsPost struct {
	Status    int  `json:"status"`
	ToSession bool `json:"toSession"`
	Token     bool `json:"token"`
}

// tsTLS serves h's proxy on a TLS listener with a certificate for
// 127.0.0.1 (client.mjs addresses the proxy by IP) from a test CA. It
// returns the base URL and the environment that makes Node trust the CA.
func tsTLS(t *testing.T, h *harness) (base string, env []string) {
	t.Helper()
	addr, ca := serveTLSFor(t, h, "127.0.0.1")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return "https://" + addr, []string{"NODE_EXTRA_CA_CERTS=" + caFile}
}

// tsGet is a GET of client.mjs: its status and Last-Event-ID.
type tsGet struct {
	Status      int    `json:"status"`
	LastEventID string `json:"lastEventId"`
}

// runTSClient runs client.mjs against the proxy at base (its scheme and
// address), with env added to its environment, for sandbox id and
// returns its lines by event, and its "http" lines (one per request) in
// order. heartbeats makes it wait for the
// proxy's heartbeats on the GET stream and inside a call's stream.
func runTSClient(t *testing.T, base, id, query, traffic, bearer string, sampleBytes int, heartbeats bool, env ...string) (map[string]tsLine, []tsLine) {
	t.Helper()
	env = append(env, fmt.Sprintf("TSMCP_SAMPLE_BYTES=%d", sampleBytes))
	if heartbeats {
		env = append(env, "TSMCP_HEARTBEATS=1")
	}
	return runTSScript(t, "client.mjs", base, id, query, traffic, bearer, env...)
}

// runTSScript runs script (in testdata/tsmcp) against the proxy at base
// for sandbox id, with the route's traffic token (empty: none sent), the
// gateway's bearer and env added to its environment, and returns its lines
// by event, and its "http" lines in order.
func runTSScript(t *testing.T, script, base, id, query, traffic, bearer string, env ...string) (map[string]tsLine, []tsLine) {
	t.Helper()
	dir, node := tsmcpDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), bulkMCPTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, base+"/mcp"+query)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"TSMCP_SANDBOX_ID="+id, "TSMCP_SANDBOX_PORT=50005",
		"TSMCP_TRAFFIC_TOKEN="+traffic, "TSMCP_BEARER="+bearer)
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	byEv := map[string]tsLine{}
	var exchanges []tsLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l tsLine
		if jerr := json.Unmarshal(sc.Bytes(), &l); jerr != nil {
			t.Fatalf("%s printed %q: %v", script, sc.Text(), jerr)
		}
		if l.Ev == "http" {
			exchanges = append(exchanges, l)
			continue
		}
		byEv[l.Ev] = l
	}
	if err != nil || byEv["done"].Ev == "" {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", script, err, out, stderr.Bytes())
	}
	t.Logf("%s:\n%s", script, out)
	return byEv, exchanges
}

// The whole agent flow of the TypeScript SDK through the proxy, on a
// restricted route (traffic token) to a gateway with its own Bearer: the
// connect and its standalone GET stream, tools/list, progress that the
// client answers while the call waits, a notification on the GET stream,
// the GET stream and a call's answer stream each cut by the client and
// resumed with Last-Event-ID (the gateway must see each cut through the
// proxy), a sampling answer over 8 KiB, and the session's DELETE. Without
// a stream limit; at max_streams_per_sandbox 2, where the session's GET and
// one call fill the sandbox, so that the client's roots notification and
// its sampling answer (read whole by the proxy: a held body) must pass it;
// with a signed URL in place of the traffic token header; with heartbeats;
// over TLS; and against a gateway that answers calls as plain JSON
// (JSONResponse: its progress and requests on the GET stream, no call
// stream to resume), also at the limit 2.
func TestMCPTypeScriptSDKClient(t *testing.T) {
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const bearer = "Bearer gw-token/with+odd=chars"
	const sampleBytes = 20 << 10
	signer := testSigner(t)
	for _, tc := range []struct {
		name   string
		limit  int
		signed bool // a signed URL (?cube_token=) in place of the traffic token header
		// heartbeat: the proxy's heartbeat interval, short enough for the
		// client to see heartbeats in the GET stream and between a call's
		// events (0: the default 30s, which the flow never waits for).
		heartbeat time.Duration
		// tls: over the proxy's HTTPS listener, where it watches the
		// socket under tls.Conn for the client's cuts.
		tls bool
		// json: the gateway answers calls as plain JSON (JSONResponse),
		// its progress and requests on the standalone GET stream; no
		// call's answer to resume.
		json bool
	}{
		{name: "max_streams=0"},
		{name: "max_streams=2", limit: 2},
		{name: "signed_url", signed: true},
		{name: "heartbeats", heartbeat: 20 * time.Millisecond},
		{name: "tls", tls: true},
		{name: "json_response", json: true},
		{name: "json_response_max_streams=2", limit: 2, json: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			limit := tc.limit
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.MaxStreamsPerSandbox = limit
				// The SDK sends its next request as soon as it reads a
				// result's event, before the proxy has seen that answer's
				// stream end: at the limit the request waits for the slot
				// (StreamLimitWait; without the wait, 429 in 6 runs of 80
				// under -race). Long here: the slot frees within a
				// millisecond or so, but a loaded test machine may take
				// longer than the default's 100 ms.
				o.cfg.StreamLimitWait = 10 * time.Second
				o.cfg.Signer = signer
				o.cfg.HeartbeatInterval = tc.heartbeat
			})
			id := "ts-" + strings.NewReplacer("=", "", "_", "").Replace(tc.name)
			query, token := tsCredentials(t, signer, id, tc.signed, traffic)
			g := &tsGateway{bearer: bearer, jsonResponse: tc.json, postCut: make(chan struct{}), getCut: make(chan struct{}), rootsChanged: make(chan struct{}),
				sb: func() *sandboxState { return h.proxy.sandboxes.get([]byte(id)) }}
			port := backend(t, "127.0.0.1", g.handler(g.server()))
			h.put(id, map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
				"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})

			base, env := "http://"+h.addr, []string(nil)
			if tc.tls {
				base, env = tsTLS(t, h)
			}
			if tc.json {
				env = append(env, "TSMCP_JSON=1")
			}
			ev, exchanges := runTSClient(t, base, id, query, token, bearer, sampleBytes, tc.heartbeat > 0, env...)

			g.mu.Lock()
			problems, seen, answerInFlight := g.problems, g.seen, g.answerInFlight
			g.mu.Unlock()
			for _, p := range problems {
				t.Error(p)
			}
			t.Logf("the gateway saw: %v", seen)
			if c := ev["connected"]; c.SessionID == "" || c.ProtocolVersion == "" {
				t.Errorf("connect: %+v", c)
			}
			if got := ev["tools"].Names; !slices.Equal(got, []string{"ack", "resume", "sample", "touch"}) {
				t.Errorf("tools/list: %v", got)
			}
			wantProgress := []string{"waiting for roots/list_changed", "roots changed"}
			if tc.json {
				// The call's progress comes on the GET stream, its result
				// on the POST's answer: two connections, whose order the
				// proxy cannot keep (the gateway writes the last progress
				// first; directly the client saw it in 20 of 20 runs,
				// through the proxy in 6 of 8). The SDK handles a result at
				// once and a notification a microtask later: a progress
				// read with or after the result finds the call's handler
				// gone ("Received a progress notification for an unknown
				// token", in onerror).
				wantProgress = wantProgress[:1]
			}
			if a := ev["ack"]; a.Result != "acked" || len(a.Progress) < len(wantProgress) || !slices.Equal(a.Progress[:len(wantProgress)], wantProgress) {
				t.Errorf("ack call: %+v", a)
			}
			if r := ev["list-changed"].Result; r != "touched" {
				t.Errorf("touch call: %q", r)
			}
			if gets := ev["standalone-resumed"].Gets; len(gets) < 2 || gets[0].LastEventID != "" ||
				gets[len(gets)-1].Status != 200 || !strings.HasPrefix(gets[len(gets)-1].LastEventID, "_") {
				t.Errorf("the standalone GET stream and its resumption: %+v", gets)
			}
			if s := ev["sample"]; s.Requests != 1 || s.Result != fmt.Sprintf("sampled %d bytes from ts-model", sampleBytes) {
				t.Errorf("sampling: %+v", s)
			}
			wantSeen := []string{"sampling-answer 202", "GET resume standalone 200"}
			if !tc.json {
				r := ev["resume"]
				if r.Result != "resumed" || !slices.Equal(r.Progress, []string{"before the cut", "after the cut"}) {
					t.Errorf("resumed call: %+v", r)
				}
				if len(r.Resumes) == 0 || r.Resumes[len(r.Resumes)-1].Status != 200 || r.Resumes[0].LastEventID == "" {
					t.Errorf("the client's Last-Event-ID GETs: %+v", r.Resumes)
				}
				wantSeen = append(wantSeen, "call:resume 200", "GET resume 200")
			}
			for _, want := range wantSeen {
				if !slices.Contains(seen, want) {
					t.Errorf("the gateway never saw %q: %v", want, seen)
				}
			}
			if !slices.Contains(seen, "DELETE 204") && !slices.Contains(seen, "DELETE 200") {
				t.Errorf("the session's DELETE never reached the gateway (or failed there): %v", seen)
			}
			for _, x := range exchanges {
				if x.Status >= 400 && x.Kind != "get-resume" {
					t.Errorf("%s %s got %d", x.Method, x.Kind, x.Status)
				}
				if x.Kind != "initialize" && x.ProtocolVersion != ev["connected"].ProtocolVersion {
					t.Errorf("%s %s sent Mcp-Protocol-Version %q", x.Method, x.Kind, x.ProtocolVersion)
				}
				// Every request's answer is one JSON document, or one
				// event stream, as the gateway chose.
				if x.Method == http.MethodPost && (x.Kind == "initialize" || x.Kind == "tools/list" || strings.HasPrefix(x.Kind, "call:")) {
					want := "text/event-stream"
					if tc.json {
						want = "application/json"
					}
					if !strings.HasPrefix(x.ContentType, want) {
						t.Errorf("%s %s answered with Content-Type %q, want %s", x.Method, x.Kind, x.ContentType, want)
					}
				}
			}
			p := ev["pattern"]
			t.Logf("TS client: at most %d requests open at once, %d TCP connections, %d heartbeats; %v; errors: %v", p.MaxOpen, p.Connections, p.Heartbeats, p.Kinds, p.Errors)
			if tc.heartbeat > 0 && p.Heartbeats == 0 {
				t.Error("the client counted no heartbeat")
			}
			if limit > 0 && answerInFlight <= int64(limit) {
				t.Errorf("the sampling answer reached the gateway with %d requests in flight, want more than the limit %d (the answer passing it)", answerInFlight, limit)
			}
			testenv.WaitFor(t, 10*time.Second, "every slot given back", func() bool { return g.sb().inFlight() == 0 })
			testenv.WaitFor(t, 10*time.Second, "the held-body budget given back", func() bool { return heldBytes(h.proxy) == 0 })
		})
	}
}

// The TypeScript SDK's older HTTP+SSE transport (SSEClientTransport,
// testdata/tsmcp/legacy.mjs) through the proxy to the go-sdk's SSE handler:
// the GET stream and its endpoint event, the POSTs to the endpoint it
// names, tools/list, progress that the client answers while the call
// waits (every answer on the GET stream), and the client's close, which
// the gateway must see end the GET. With the traffic token header; with a
// signed URL, whose token the announced endpoint lacks (the client, as
// given, gets the proxy's 403 on its first POST; with a fetch that puts
// the token back it works); and with heartbeats in the GET stream,
// before the calls and between a call's progress events.
func TestMCPTypeScriptSDKLegacySSE(t *testing.T) {
	const traffic = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const bearer = "Bearer gw-token/with+odd=chars"
	signer := testSigner(t)
	for _, tc := range []struct {
		name      string
		signed    bool
		heartbeat time.Duration
		// limit: max_streams_per_sandbox. The GET stream holds a slot
		// for the session's life and each POST one until its 202, so 2
		// is the least the transport works at: a request POST at 1 finds
		// the GET's slot taken for good, and gets the 429 after the wait.
		limit int
	}{
		{name: "headers"},
		{name: "signed_url", signed: true},
		{name: "heartbeats", heartbeat: 20 * time.Millisecond},
		{name: "max_streams=2", limit: 2},
		// Two GETs: the client as given, and the one with the token kept,
		// which may come before the proxy has seen the first one's end.
		{name: "signed_url_max_streams=2", signed: true, limit: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(o *harnessOpts) {
				o.cfg.Signer = signer
				o.cfg.HeartbeatInterval = tc.heartbeat
				o.cfg.MaxStreamsPerSandbox = tc.limit
				// As in TestMCPTypeScriptSDKClient: the SDK sends its next
				// POST as soon as it has the last one's 202, before the
				// proxy may have seen that answer end; long, for a loaded
				// test machine.
				o.cfg.StreamLimitWait = 10 * time.Second
			})
			id := "tsl-" + strings.NewReplacer("=", "", "_", "").Replace(tc.name)
			query, token := tsCredentials(t, signer, id, tc.signed, traffic)
			g := &tsGateway{bearer: bearer, legacy: true, postCut: make(chan struct{}), getCut: make(chan struct{}), rootsChanged: make(chan struct{}),
				sb: func() *sandboxState { return h.proxy.sandboxes.get([]byte(id)) }}
			srv := g.server()
			port := backend(t, "127.0.0.1", g.wrap(srv, mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return srv },
				&mcp.SSEOptions{DisableLocalhostProtection: true})))
			h.put(id, map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "50005": itoa(port),
				"AllowPublicTraffic": "false", "TrafficAccessToken": traffic})
			var env []string
			if tc.heartbeat > 0 {
				env = append(env, "TSMCP_HEARTBEATS=1")
			}
			ev, _ := runTSScript(t, "legacy.mjs", "http://"+h.addr, id, query, token, bearer, env...)

			if tc.signed {
				if p := ev["plain"]; p.Status != http.StatusForbidden || p.Token || !strings.Contains(p.Error, `"code":"traffic_token_missing"`) {
					t.Errorf("the signed URL's client as given: %+v, want its first POST, without the token, refused with 403 traffic_token_missing", p)
				}
			}
			if got, want := ev["connected"].Endpoint, "/mcp?sessionid=S"; got != want && !(tc.signed && got == want+"&cube_token=T") {
				t.Errorf("the endpoint the client POSTs to: %q", got)
			}
			if got := ev["tools"].Names; !slices.Equal(got, []string{"ack", "resume", "sample", "touch"}) {
				t.Errorf("tools/list: %v", got)
			}
			// The tool's last progress and its result come on the GET
			// stream in that order, usually in one read; the SDK handles a
			// result at once but a notification a microtask later, by
			// when the call's progress handler is gone: the last progress
			// lands in onerror ("Received a progress notification for an
			// unknown token"), directly to the gateway too (10 of 10 runs).
			if a := ev["ack"]; a.Result != "acked" || len(a.Progress) == 0 || a.Progress[0] != "waiting for roots/list_changed" {
				t.Errorf("ack call: %+v", a)
			}
			p := ev["pattern"]
			t.Logf("TS client: %d heartbeats; POSTs %+v; errors: %v", p.Heartbeats, p.Posts, p.Errors)
			for _, e := range p.Errors {
				if !strings.HasPrefix(e, "Received a progress notification for an unknown token") {
					t.Errorf("the client's onerror: %s", e)
				}
			}
			if tc.heartbeat > 0 && p.Heartbeats < 2 {
				t.Errorf("the client counted %d heartbeats, want 2 or more", p.Heartbeats)
			}
			// initialize, notifications/initialized, tools/list, the call
			// and the roots notification.
			if len(p.Posts) != 5 {
				t.Errorf("the client's POSTs: %+v, want 5", p.Posts)
			}
			for _, x := range p.Posts {
				if x.Status != http.StatusAccepted || !x.ToSession || x.Token != tc.signed {
					t.Errorf("a POST: %+v, want 202 at the announced endpoint", x)
				}
			}
			// The client's close ends the GET stream at the gateway (its
			// session).
			wantGets := 1
			if tc.signed {
				wantGets = 2 // the client as given, and with the token kept
			}
			testenv.WaitFor(t, 10*time.Second, "the GET stream ended at the gateway", func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				n := 0
				for _, s := range g.seen {
					if s == "GET 200" {
						n++
					}
				}
				return n == wantGets
			})
			g.mu.Lock()
			problems, seen := g.problems, g.seen
			g.mu.Unlock()
			for _, p := range problems {
				t.Error(p)
			}
			t.Logf("the gateway saw: %v", seen)
			testenv.WaitFor(t, 10*time.Second, "every slot given back", func() bool { return g.sb().inFlight() == 0 })
		})
	}
}

// tsCredentials returns the query and the traffic token header a client
// script is given for sandbox id's MCP port: a signed URL (?cube_token=)
// and no header when signed, else no query and traffic.
func tsCredentials(t *testing.T, signer *auth.Signer, id string, signed bool, traffic string) (query, token string) {
	t.Helper()
	if !signed {
		return "", traffic
	}
	tok, err := signer.Sign(id, 50005, time.Now().Add(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return "?cube_token=" + tok, ""
}
