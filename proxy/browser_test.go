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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The browser-facing auth (signed link, its cookie, the frame preview's
// partitioned cookie, the Origin and Referer rules) is argued in README
// from what browsers send. These tests run it in real browsers (Chromium
// and Firefox), so that a browser that sends or keeps something else than
// the argument assumes fails here: a page opened from a signed link, in a tab and in another
// site's iframe, must load, fetch, stream events and open a WebSocket
// through the proxy on the cookie alone, and a page of another sandbox
// must reach none of it with the browser's cookie; an MCP client in a
// page of another site, with the token in a header, must stream.

// browserPage is the sandbox app's page: it runs each check in turn and
// posts what it saw to the platform server (not through the proxy, so a
// refused credential is reported rather than lost).
const browserPage = `<!doctype html><script>
const report = (r) => fetch(%[1]q, {method: 'POST', mode: 'no-cors', body: JSON.stringify(r)});
async function run() {
  const r = {};
  r.fetch = (await fetch('/api')).status;
  await new Promise((resolve) => {
    const es = new EventSource('/events');
    const seen = [];
    es.onmessage = async (e) => {
      seen.push(e.data);
      if (seen.length === 1) { await fetch('/ack'); return; }
      r.events = seen; es.close(); resolve();
    };
    es.onerror = () => { r.events = seen.concat('error'); es.close(); resolve(); };
  });
  await new Promise((resolve) => {
    const ws = new WebSocket('wss://' + location.host + '/ws');
    ws.onopen = () => ws.send('ping'.repeat(4096));
    ws.onmessage = (e) => { r.ws = e.data === 'ping'.repeat(4096) ? 'echo' : e.data.length; r.deflate = ws.extensions.startsWith('permessage-deflate'); ws.close(); resolve(); };
    ws.onerror = () => { r.ws = 'error'; resolve(); };
  });
  return r;
}
run().then(report, (e) => report({error: String(e)}));
</script>`

// attackPage is another sandbox's page: it tries the victim sandbox with
// the browser's cookie in every way a page can, then reports that it is
// done. What reaches the victim is counted there.
const attackPage = `<!doctype html><img src="%[2]s/api?from=img"><script>
const report = (r) => fetch(%[1]q, {method: 'POST', mode: 'no-cors', body: JSON.stringify(r)});
const settle = (p) => p.then(() => 'ok', () => 'failed');
async function run() {
  const r = {};
  r.cors = await settle(fetch(%[2]q + '/api?from=cors', {credentials: 'include'}));
  r.nocors = await settle(fetch(%[2]q + '/api?from=nocors', {credentials: 'include', mode: 'no-cors'}));
  r.post = await settle(fetch(%[2]q + '/api?from=post', {method: 'POST', credentials: 'include', mode: 'no-cors', body: 'x'}));
  r.ws = await new Promise((resolve) => {
    const ws = new WebSocket(%[3]q + '/ws?from=ws');
    ws.onopen = () => { ws.close(); resolve('open'); };
    ws.onerror = () => resolve('error');
  });
  return r;
}
window.onload = () => run().then(report, (e) => report({error: String(e)}));
</script>`

// siblingPage is served on another port of the victim's sandbox: the
// cookie of the victim's port counts for its requests (a preflighted JSON
// POST, answered by the proxy, and an image whose Referer is the sibling).
const siblingPage = `<!doctype html><img src="%[2]s/api?from=siblingimg"><script>
const report = (r) => fetch(%[1]q, {method: 'POST', mode: 'no-cors', body: JSON.stringify(r)});
window.onload = () => fetch(%[2]q + '/api?from=sibling', {method: 'POST', credentials: 'include',
    headers: {'Content-Type': 'application/json'}, body: '{}'})
  .then((r) => report({status: r.status}), (e) => report({error: String(e)}));
</script>`

// agentPage is a browser-based MCP client on another site (the platform's
// UI): it posts to the sandbox's gateway with the traffic token and the
// gateway's bearer in headers, so every call is preflighted, and reads the
// answer's event stream as it comes; then it opens an event stream and a
// WebSocket of the sandbox's app with a signed token in their URLs.
const agentPage = `<!doctype html><script>
const report = (r) => fetch(%[1]q, {method: 'POST', mode: 'no-cors', body: JSON.stringify(r)});
const call = (path) => fetch(%[2]q + path, {method: 'POST', headers: {
  'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream',
  'cube-traffic-access-token': %[3]q, 'Authorization': 'Bearer gateway-secret'},
  body: '{"jsonrpc":"2.0","id":1,"method":"tools/call"}'});
async function run() {
  const resp = await call('/mcp');
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let text = '';
  const until = async (s) => { while (!text.includes(s)) { const {value, done} = await reader.read(); if (done) return; text += value; } };
  await until('progress');
  const ack = await call('/ack');
  await until('result');
  const r = {status: resp.status, ack: ack.status, session: resp.headers.get('Mcp-Session-Id'), text: text};
  // A terminal or log view of the sandbox's app, with a signed token in
  // the URL (neither EventSource nor WebSocket can send a header).
  const tok = '?cube_token=' + %[5]q;
  r.events = await new Promise((resolve) => {
    const es = new EventSource(%[4]q + '/events' + tok);
    const seen = [];
    es.onmessage = async (e) => {
      seen.push(e.data);
      if (seen.length === 1) { await fetch(%[4]q + '/ack' + tok, {mode: 'no-cors'}); return; }
      es.close(); resolve(seen);
    };
    es.onerror = () => { es.close(); resolve(seen.concat('error')); };
  });
  r.ws = await new Promise((resolve) => {
    const ws = new WebSocket(%[4]q.replace('https:', 'wss:') + '/ws' + tok);
    ws.onopen = () => ws.send('ping');
    ws.onmessage = (e) => { ws.close(); resolve(e.data); };
    ws.onerror = () => resolve('error');
  });
  return r;
}
run().then(report, (e) => report({error: String(e)}));
</script>`

// browserSandbox is the victim sandbox's app: the page, an API, an event
// stream whose second event waits for the page's acknowledgement of the
// first, and a WebSocket echo. from records every request an attack page
// got through.
type browserSandbox struct {
	port   uint16
	ack    chan struct{}
	mu     sync.Mutex
	from   []string
	report string // where the page reports
}

func startBrowserSandbox(t *testing.T, report string) *browserSandbox {
	s := &browserSandbox{ack: make(chan struct{}, 1), report: report}
	s.port = backend(t, "127.0.0.1", http.HandlerFunc(s.serve))
	return s
}

func (s *browserSandbox) serve(w http.ResponseWriter, r *http.Request) {
	if from := r.URL.Query().Get("from"); from != "" {
		s.mu.Lock()
		s.from = append(s.from, from)
		s.mu.Unlock()
	}
	switch r.URL.Path {
	case "/app":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, browserPage, s.report)
	case "/api":
		// The app's own CORS answer, which lets a sibling port's page read
		// it; whether the request got here is the proxy's decision.
		if o := r.Header.Get("Origin"); o != "" {
			w.Header().Set("Access-Control-Allow-Origin", o)
			w.Header().Set("Access-Control-Allow-Credentials", "true")
		}
		io.WriteString(w, "api")
	case "/ack":
		s.ack <- struct{}{}
	case "/events":
		if o := r.Header.Get("Origin"); o != "" {
			w.Header().Set("Access-Control-Allow-Origin", o)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-s.ack: // the page has the first event while this stream is open
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case "/ws":
		// Compressed, as Chromium offers: the frames pass the proxy's
		// tunnel with their RSV1 bit.
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true,
			CompressionMode: websocket.CompressionContextTakeover, CompressionThreshold: 512})
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return
		}
		_ = c.Write(r.Context(), typ, msg)
		_, _, _ = c.Read(r.Context()) // until the page closes
	}
}

// reached returns, sorted, the from parameters of the requests that
// reached the sandbox since the last call.
func (s *browserSandbox) reached() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := s.from
	s.from = nil
	slices.Sort(from)
	return strings.Join(from, ",")
}

// browserGateway is an MCP gateway's streaming answer as a browser client
// needs it: CORS headers for the page's origin, and a second event that
// waits for the client's acknowledgement of the first.
type browserGateway struct {
	port uint16
	ack  chan struct{}
	mu   sync.Mutex
	auth string
}

func startBrowserGateway(t *testing.T) *browserGateway {
	g := &browserGateway{ack: make(chan struct{}, 1)}
	g.port = backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
		w.Header().Set("Access-Control-Expose-Headers", "Mcp-Session-Id")
		if r.Method != http.MethodPost {
			http.Error(w, "preflight reached the gateway", http.StatusMethodNotAllowed)
			return
		}
		switch r.URL.Path {
		case "/ack":
			g.ack <- struct{}{}
		case "/mcp":
			g.mu.Lock()
			g.auth = r.Header.Get("Authorization")
			g.mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Mcp-Session-Id", "s1")
			io.WriteString(w, "data: progress\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-g.ack:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "data: result\n\n")
		}
	}))
	return g
}

func (g *browserGateway) authorization() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.auth
}

// platformServer stands in for the platform's UI, another site than the
// sandboxes: it serves the page that frames a sandbox, the attack page's
// host is a sandbox, and it collects the pages' reports.
type platformServer struct {
	addr    string
	reports chan string
	mu      sync.Mutex
	pages   map[string]string
}

func startPlatformServer(t *testing.T, cert tls.Certificate) *platformServer {
	p := &platformServer{reports: make(chan string, 4), pages: map[string]string{}}
	ln := tls.NewListener(listen(t, "127.0.0.1:0"), &tls.Config{Certificates: []tls.Certificate{cert}})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/report" {
			b, _ := io.ReadAll(r.Body)
			p.reports <- string(b)
			return
		}
		p.mu.Lock()
		page, ok := p.pages[r.URL.Path]
		p.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, page)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p.addr = ln.Addr().String()
	return p
}

func (p *platformServer) page(path, html string) {
	p.mu.Lock()
	p.pages[path] = html
	p.mu.Unlock()
}

// browser is a headless browser the auth test drives. Opening a page is
// all it needs: each page reports what it saw by itself.
type browser interface {
	navigate(ctx context.Context, url string) error
}

// chromium is a headless Chromium driven over the Chrome DevTools
// Protocol, a JSON exchange on a WebSocket as firefox's WebDriver BiDi is.
// The test needs three commands of it (open a tab, attach to it, navigate),
// so this is all of the client: chromedp and its generated cdproto cost
// about a minute of compiling on a cold build cache, in go vet and again
// in go test -race.
type chromium struct {
	ws      *browserConn
	session string // the tab's, on the browser's connection (flatten mode)
}

// newChromium starts a headless Chromium that resolves every *.cube.test
// and *.platform.test name to loopback and accepts the tests' certificates.
// A missing Chromium fails the test: make test installs it.
func newChromium(t *testing.T) browser {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (make test installs it with apt): %v", err)
	}
	cmd := exec.Command(bin,
		// chromedp's defaults (after Puppeteer's), which the test ran with
		// before: headless, and nothing in the background that reaches out
		// or slows a page down.
		"--headless", "--hide-scrollbars", "--mute-audio",
		"--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update",
		"--enable-features=NetworkService,NetworkServiceInProcess",
		"--disable-background-timer-throttling", "--disable-backgrounding-occluded-windows",
		"--disable-breakpad", "--disable-client-side-phishing-detection",
		"--disable-default-apps", "--disable-dev-shm-usage", "--disable-extensions",
		"--disable-features=Translate,BlinkGenPropertyTrees", "--disable-hang-monitor",
		"--disable-ipc-flooding-protection", "--disable-popup-blocking",
		"--disable-prompt-on-repost", "--disable-renderer-backgrounding", "--disable-sync",
		"--force-color-profile=srgb", "--metrics-recording-only",
		"--safebrowsing-disable-auto-update", "--enable-automation",
		"--password-store=basic", "--use-mock-keychain",
		"--no-sandbox", // root in CI
		"--ignore-certificate-errors",
		"--host-resolver-rules=MAP *.cube.test 127.0.0.1, MAP *.platform.test 127.0.0.1",
		"--user-data-dir="+t.TempDir(),
		"--remote-debugging-port=0",
		"about:blank",
	)
	// Its temporary files too (shared memory, with --disable-dev-shm-usage,
	// and the singleton socket's directory, which a killed Chromium leaves)
	// go where the test removes them.
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	addr := startBrowser(t, cmd, "DevTools listening on ")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &chromium{ws: dialBrowser(ctx, t, addr)}
	raw, err := c.call(ctx, "Target.createTarget", map[string]any{"url": "about:blank"})
	if err != nil {
		t.Fatal(err)
	}
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := json.Unmarshal(raw, &target); err != nil || target.TargetID == "" {
		t.Fatalf("chromium's new target %s: %v", raw, err)
	}
	raw, err = c.call(ctx, "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true})
	if err != nil {
		t.Fatal(err)
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(raw, &attached); err != nil || attached.SessionID == "" {
		t.Fatalf("chromium's session %s: %v", raw, err)
	}
	c.session = attached.SessionID
	return c
}

// call sends one command, to the tab once attached to it, and returns its
// result.
func (c *chromium) call(ctx context.Context, method string, params map[string]any) (json.RawMessage, error) {
	raw, err := c.ws.exchange(ctx, c.session, method, params)
	if err != nil {
		return nil, fmt.Errorf("chromium %s: %w", method, err)
	}
	var answer struct {
		Error *struct {
			Code    int
			Message string
		}
		Result json.RawMessage
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return nil, fmt.Errorf("chromium %s: answer %s: %w", method, raw, err)
	}
	if answer.Error != nil {
		return nil, fmt.Errorf("chromium %s: %s (%s)", method, answer.Error.Message, raw)
	}
	return answer.Result, nil
}

// navigate returns once the page's document has come (or failed); the
// page reports by itself when it has run.
func (c *chromium) navigate(ctx context.Context, url string) error {
	raw, err := c.call(ctx, "Page.navigate", map[string]any{"url": url})
	if err != nil {
		return err
	}
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	if err := json.Unmarshal(raw, &nav); err != nil {
		return fmt.Errorf("chromium Page.navigate: answer %s: %w", raw, err)
	}
	if nav.ErrorText != "" {
		return fmt.Errorf("chromium Page.navigate: %s", nav.ErrorText)
	}
	return nil
}

// startBrowser starts cmd, a browser told to listen for automation on a
// port of its choosing, and returns the address it prints on stderr after
// prefix. The browser is killed with its process group when the test
// ends: Chromium's children (zygotes, network service, renderers) outlive
// a killed main process and write into its user data directory, which
// then fails t.TempDir's removal.
func startBrowser(t *testing.T, cmd *exec.Cmd, prefix string) string {
	t.Helper()
	name := filepath.Base(cmd.Path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})

	found := make(chan string, 1)
	go func() {
		var log []string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if addr, ok := strings.CutPrefix(line, prefix); ok {
				found <- strings.TrimSpace(addr)
				for sc.Scan() { // keep the pipe drained
				}
				return
			}
			log = append(log, line)
		}
		found <- strings.Join(log, "\n") // exited without listening
	}()
	select {
	case addr := <-found:
		if !strings.HasPrefix(addr, "ws://") {
			t.Fatalf("%s exited without printing %q; its stderr:\n%s", name, prefix, addr)
		}
		return addr
	case <-time.After(time.Minute):
		t.Fatalf("%s did not print %q within a minute", name, prefix)
		return ""
	}
}

// browserConn is the exchange both browsers' protocols make on their
// WebSocket: a command is a JSON object with an id, and its answer is the
// message with the same id.
type browserConn struct {
	conn *websocket.Conn
	id   int
}

// dialBrowser connects to a browser's automation WebSocket; the connection
// is closed when the test ends. The default read limit (32 KiB) is left:
// the largest message the test gets is Firefox's session.new answer, about
// 500 bytes.
func dialBrowser(ctx context.Context, t *testing.T, url string) *browserConn {
	t.Helper()
	conn, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("connect to the browser at %s: %v", url, err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &browserConn{conn: conn}
}

// exchange sends one command and returns the message that answers it.
// Messages without its id are events (CDP sends some unasked, such as
// Target.attachedToTarget), and are skipped. session is the DevTools
// protocol's target session, empty for the browser itself and in WebDriver
// BiDi. ctx bounds the exchange; when it ends the connection is closed.
func (c *browserConn) exchange(ctx context.Context, session, method string, params map[string]any) ([]byte, error) {
	c.id++
	msg, err := json.Marshal(struct {
		ID        int            `json:"id"`
		SessionID string         `json:"sessionId,omitempty"`
		Method    string         `json:"method"`
		Params    map[string]any `json:"params"`
	}{c.id, session, method, params})
	if err != nil {
		return nil, err
	}
	if err := c.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, err
	}
	for {
		_, raw, err := c.conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		var answer struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal(raw, &answer); err != nil {
			return nil, fmt.Errorf("message %s: %w", raw, err)
		}
		if answer.ID == c.id {
			return raw, nil
		}
	}
}

// open navigates the browser to url and returns the report its page posts.
func open(t *testing.T, b browser, p *platformServer, url string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.navigate(ctx, url); err != nil {
		t.Fatalf("navigate to %s: %v", url, err)
	}
	select {
	case raw := <-p.reports:
		var r map[string]any
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatalf("report %q: %v", raw, err)
		}
		return r
	case <-ctx.Done():
		// A refused credential shows as the proxy's error page, which
		// reports nothing.
		t.Fatalf("no report from the page at %s within 30 s", url)
		return nil
	}
}

// TestBrowserAuth runs the browser rules in Chromium and in Firefox, whose
// cookie partitioning (Total Cookie Protection) and SameSite defaults are
// its own.
func TestBrowserAuth(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(*testing.T) browser
	}{
		{"chromium", newChromium},
		{"firefox", func(t *testing.T) browser { return newFirefox(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testBrowserAuth(t, tc.start)
		})
	}
}

func testBrowserAuth(t *testing.T, start func(*testing.T) browser) {
	key, traffic := authRandomHex(t, 32), authRandomHex(t, 32)
	s, sign := authSigner(t, key)
	h := newHarness(t, func(o *harnessOpts) { o.cfg.Signer = s })
	tlsAddr, ca := serveTLSFor(t, h, "*.cube.test")
	_, port, _ := net.SplitHostPort(tlsAddr)
	cert := ca.Certificate(t, "*.platform.test")
	platform := startPlatformServer(t, cert)
	_, pport, _ := net.SplitHostPort(platform.addr)
	reportURL := "https://ui.platform.test:" + pport + "/report"

	victim := startBrowserSandbox(t, reportURL)
	victimOrigin := "https://3000-box.cube.test:" + port
	sibling := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, siblingPage, reportURL, victimOrigin)
	}))
	gateway := startBrowserGateway(t)
	h.put("box", map[string]string{
		"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "42",
		"AllowPublicTraffic": "false", "TrafficAccessToken": traffic,
		"3000": itoa(victim.port), "3001": itoa(sibling), "50005": itoa(gateway.port),
	})
	attacker := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, attackPage, reportURL, victimOrigin, "wss://3000-box.cube.test:"+port)
	}))
	putAuthRoute(h, "other", "", attacker, 3001) // a public sandbox anyone can make

	want := map[string]any{"fetch": float64(200), "events": []any{"one", "two"}, "ws": "echo", "deflate": true}
	check := func(name string, got map[string]any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the page saw %v, want %v", name, got, want)
		}
	}
	b := start(t)

	// A preview in another site's iframe: its cookie is partitioned.
	link := victimOrigin + "/app?cube_token=" + sign("box", 3000, 10*time.Minute)
	platform.page("/preview", fmt.Sprintf(`<!doctype html><iframe src=%q></iframe>`, link))
	platform.page("/agent", fmt.Sprintf(agentPage, reportURL, "https://50005-box.cube.test:"+port, traffic,
		victimOrigin, sign("box", 3000, 10*time.Minute)))
	check("cross-site iframe", open(t, b, platform, "https://ui.platform.test:"+pport+"/preview"))

	// The same link in a tab: a first-party cookie.
	check("tab", open(t, b, platform, link))

	// A page on another port of the same sandbox, opened from its own
	// link: the victim port's cookie counts for it.
	victim.reached()
	got := open(t, b, platform, "https://3001-box.cube.test:"+port+"/?cube_token="+sign("box", 3001, 10*time.Minute))
	if fmt.Sprint(got) != "map[status:200]" {
		t.Errorf("the sibling port's preflighted POST: the page saw %v, want status 200", got)
	}
	// The preflight is the proxy's to answer: had it gone to the sandbox,
	// it would show here (and fail: the app does not answer preflights).
	if r := victim.reached(); r != "sibling,siblingimg" {
		t.Errorf("from the sibling port's page the victim got %q, want the POST and the image", r)
	}

	// A browser-based MCP client on the platform's site, with headers:
	// the proxy answers its preflights, and the gateway's stream comes
	// through as it is written.
	got = open(t, b, platform, "https://ui.platform.test:"+pport+"/agent")
	wantAgent := map[string]any{"status": float64(200), "ack": float64(200), "session": "s1",
		"text": "data: progress\n\ndata: result\n\n", "events": []any{"one", "two"}, "ws": "ping"}
	if fmt.Sprint(got) != fmt.Sprint(wantAgent) {
		t.Errorf("the browser MCP client saw %v, want %v", got, wantAgent)
	}
	if auth := gateway.authorization(); auth != "Bearer gateway-secret" {
		t.Errorf("the gateway got Authorization %q, want the page's bearer untouched", auth)
	}

	// Another sandbox's page, with the cookies in the browser.
	got = open(t, b, platform, "https://3001-other.cube.test:"+port+"/")
	if got["ws"] != "error" {
		t.Errorf("the other sandbox's page opened a WebSocket to the victim: %v", got)
	}
	if r := victim.reached(); r != "" {
		t.Errorf("the other sandbox's page reached the victim with the browser's cookie: %s", r)
	}
}
