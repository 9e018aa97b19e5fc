package proxy

import (
	"bufio"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// sizingKindConns is how many connections of each kind the sizing test
// measures.
const sizingKindConns = 200

// README's figures for connections whose sandbox went silent after a
// burst (sizingKind.figure), at the default head limit: the first group
// is HTTP's, the second HTTPS's (the parenthesis after it); of a range,
// the last number is the one held to.
const (
	quietFigure    = `a download whose sandbox went\s+silent mid-body ≈ (\d+) KiB\s+\(HTTPS ≈ \d+–(\d+)\)`
	chunkedFigure  = `a chunked or\s+read-to-close\s+download\s+from\s+a\s+silent\s+sandbox\s+≈\s+(\d+) KiB\s+\(HTTPS\s+≈\s+(\d+)\)`
	detachedFigure = `a\s+detached\s+stream\s+from\s+a\s+silent\s+sandbox\s+≈\s+\d+–(\d+) KiB\s+\(HTTPS\s+≈\s+(\d+)\)`
	tunnelFigure   = `a\s+WebSocket\s+silent\s+after\s+a\s+burst\s+≈\s+\d+–\d+ KiB,\s+up\s+to\s+(\d+)\s+in\s+about\s+one\s+run\s+in\s+ten\s+\(HTTPS\s+≈\s+\d+–\d+,\s+up\s+to\s+(\d+)\s+in\s+about\s+one\s+run\s+in\s+eight\)`
	uploadFigure   = `a\s+Content-Length\s+upload\s+whose\s+client\s+went\s+silent\s+mid-body\s+≈\s+(\d+) KiB\s+\(HTTPS\s+≈\s+(\d+)\)`
	chunkedUpload  = `a\s+chunked\s+upload\s+whose\s+client\s+stopped\s+between\s+two\s+chunks\s+≈\s+(\d+) KiB\s+\(HTTPS\s+≈\s+(\d+)\)`
	chunkCRLF      = `whose\s+client\s+stops\s+between\s+a\s+chunk's\s+data\s+and\s+the\s+CRLF\s+after\s+it[^≈]*≈\s+(\d+) KiB\s+\(HTTPS\s+≈\s+(\d+)`
)

// sizingKind is a kind of connection a client without credentials can
// hold open on a public route, as the child process holds it.
type sizingKind struct {
	name string
	// lingers: the proxy refused the request and reads what the client
	// still sends; the parent waits for every connection to linger.
	lingers bool
	// moving: a body or message is being copied, and the copy holds its
	// 64 KiB buffer; README gives such connections their own allowance.
	moving bool
	// quiet: the copy waits bulkHold for its peer's next byte before it
	// gives its 64 KiB buffer back; the parent measures until then, and
	// holds the connection to README's figure for it (figure) too.
	quiet  bool
	figure string
	// uploaded: at rest after an upload, which over HTTPS README gives an
	// allowance of its own (crypto/tls keeps the read buffer it grew).
	uploaded bool
}

// sizingKinds are the kinds README's sizing must cover.
var sizingKinds = []sizingKind{
	{name: "idle keep-alive"},
	// fasthttp keeps a response header's parsed lines from one answer to
	// the next, and from one connection to the next: until the proxy let
	// go of them after such an answer (headDrop), ≈ 285 KiB a connection.
	{name: "idle after an answer of many header lines"},
	{name: "idle after an 8 KiB answer"},
	// crypto/tls grows its read buffer to ≈ 40 KiB on a burst of full
	// 16 KiB records and keeps it: an HTTPS connection idle after such an
	// upload counts ≈ 109 KiB, over the 84 README allows at rest.
	{name: "idle after a 64 KiB upload", uploaded: true},
	// The same for a request head of many lines, within maxHeaderLines:
	// ≈ 140 KiB a connection until headDrop.
	{name: "idle after a request of many header lines"},
	{name: "mid-head"},
	{name: "mid-upload", moving: true},
	// The client went silent mid-body, after a burst: until the copy
	// gave its 64 KiB buffer back after bulkHold, it held it until
	// client.body_timeout, ≈ 130 KiB (1,000 on the built binary).
	{name: "upload from a silent client", moving: true, quiet: true, figure: uploadFigure},
	// The same between two chunks: until the copy read the next chunk's
	// size line apart from its 64 KiB buffer (clientBody.nextChunk), it
	// held it until client.body_timeout, ≈ 120 KiB (HTTPS ≈ 172; 1,000
	// on the built binary).
	{name: "chunked upload from a silent client", moving: true, quiet: true, figure: chunkedUpload},
	// The same between a chunk's data and the CRLF after it: fasthttp's
	// reader returns a chunk's last bytes only with that CRLF, so the
	// copy's read waits for it in its 64 KiB buffer, with those bytes,
	// until client.body_timeout (nginx ≈ 18 KiB of RSS, and the sandbox
	// has every byte of the chunk).
	{name: "chunked upload stopped before a chunk's CRLF", moving: true, figure: chunkCRLF},
	{name: "waiting on a slow sandbox"},
	{name: "download to a slow reader", moving: true},
	// The sandbox went silent mid-body: until WriteTo gave its 64 KiB
	// buffer back after bulkHold, ≈ 132 KiB (1,000 on the built binary).
	{name: "download from a silent sandbox", moving: true, quiet: true, figure: quietFigure},
	// The other body paths, their sandbox silent after a burst as above.
	// fasthttp copies a body of unknown length in 4 KiB pieces.
	{name: "chunked download from a silent sandbox", moving: true, quiet: true, figure: chunkedFigure},
	{name: "read-to-close download from a silent sandbox", moving: true, quiet: true, figure: chunkedFigure},
	// Detached streams: until copyEvents read a chunk's closing CRLF,
	// which came apart from its data, with the 64 KiB buffer and waited in
	// it for the next chunk, ≈ 78 KiB.
	{name: "HTTP 1.0 download from a silent sandbox", moving: true, quiet: true, figure: detachedFigure},
	{name: "SSE from a silent sandbox", moving: true, quiet: true, figure: detachedFigure},
	{name: "WebSocket from a silent sandbox", moving: true, quiet: true, figure: tunnelFigure},
	{name: "SSE idle"},
	{name: "SSE to a slow reader", moving: true},
	{name: "WebSocket idle"},
	{name: "WebSocket mid-message", moving: true},
	{name: "lingering after a refusal", lingers: true},
}

// sizingSetup is a listener the sizing test measures every kind on.
type sizingSetup struct {
	scheme string
	useTLS bool
	// headLimit is client.max_header_size; 0: the default, 32 KiB.
	headLimit int
	// The README's words, with the KiB allowed: at rest, moving a body,
	// and at rest after an upload ("": rest's).
	rest, moving, uploaded string
}

// sizingMoving is README's allowance for a connection moving a body.
const sizingMoving = `for a connection moving a body allow (\d+) KiB`

// sizingSetups are the listeners README's sizing gives an allowance for.
var sizingSetups = []sizingSetup{
	{"HTTP", false, 0, `Allow about (\d+) KiB per connection`, sizingMoving, ""},
	{"HTTPS", true, 0, `where\s+clients mostly use HTTPS, allow (\d+) KiB`, `moving a body allow \d+ KiB, about [\d,]+ for 1 GiB \(over HTTPS (\d+) KiB`,
		`where\s+clients\s+can\s+upload\s+over\s+HTTPS[^:]*?,\s+allow\s+(\d+) KiB`},
	// The smaller reader of README's smaller allowance: it covered an
	// idle connection only (36 KiB), not one waiting on a slow sandbox
	// (≈ 47 KiB).
	{"HTTP at a 16 KiB head limit", false, 16 << 10, "(?s)With\\s+`client\\.max_header_size:\\s+16384`[^:]*?:\\s+allow\\s+(\\d+) KiB", sizingMoving, ""},
}

// README's sizing ("Allow about N KiB per connection", HTTPS's allowance
// and client.max_header_size 16384's beside it) must cover what the Go
// runtime counts against GOMEMLIMIT for every kind of connection a client
// without credentials can hold open, not only an idle keep-alive one: a
// slow upload, a stalled download, an SSE stream, a WebSocket, a lingering
// refusal, one waiting on a slow sandbox, one idle after an answer its
// response buffer kept, and one idle after a sandbox's answer of thousands
// of header lines. The clients and the sandbox run in a child process, so
// that only the proxy's memory is counted.
//
// Each kind is measured in a proxy process of its own, as the built binary
// counts it. What the Go runtime keeps of connections that have closed is
// reused by the next ones and never given back: a socket's poll descriptor
// (≈ 0.5 KiB), a goroutine's descriptor and its 2 KiB stack, fasthttp's
// idle workers with their grown stacks (for 10 s). Measured one after
// another in one process, each kind found those of the kinds before it
// and counted less than a fresh process does (an idle SSE stream 2.9 KiB
// against 7.3 alone, a download to a slow reader 129 against 138, over
// README's 136), so the test passed figures the binary exceeded. A node
// holds them for its largest count of connections, so the fresh figure is
// the one to size by. The proxy is wired as the binary is, with its access
// log and telemetry: a stream keeps its access log entry until it ends.
func TestREADMESizingCoversEveryKindOfConnection(t *testing.T) {
	if kind := os.Getenv("CUBE_TEST_SIZING_KIND"); kind != "" {
		holdSizingKind(t, kind, os.Getenv("CUBE_TEST_SIZING_TLS") == "1")
		return
	}
	if which := os.Getenv("CUBE_TEST_SIZING_PROXY"); which != "" {
		scheme, kind, _ := strings.Cut(which, "|")
		i := slices.IndexFunc(sizingSetups, func(s sizingSetup) bool { return s.scheme == scheme })
		j := slices.IndexFunc(sizingKinds, func(k sizingKind) bool { return k.name == kind })
		if i < 0 || j < 0 {
			t.Fatalf("no sizing setup %q or kind %q", scheme, kind)
		}
		measureSizingKind(t, sizingSetups[i], sizingKinds[j])
		return
	}
	if testing.Short() {
		t.Skip("opens thousands of connections")
	}
	if raceDetectorOn {
		// Its instrumentation grows every goroutine and allocation (an HTTPS
		// download to a slow reader: 188 KiB against 160 without it); the
		// README sizes the binary as shipped. make test runs it again
		// without -race.
		t.Skip("the race detector's instrumentation is counted too; make test runs this without -race")
	}
	for _, setup := range sizingSetups {
		for _, k := range sizingKinds {
			t.Run(setup.scheme+", "+k.name, func(t *testing.T) {
				t.Parallel() // each measures in processes of its own
				cmd := exec.Command(os.Args[0], "-test.run=^TestREADMESizingCoversEveryKindOfConnection$", "-test.count=1", "-test.v", "-test.timeout=120s")
				cmd.Env = append(os.Environ(), "CUBE_TEST_SIZING_PROXY="+setup.scheme+"|"+k.name)
				out, err := cmd.CombinedOutput()
				// The child's figure, without its file and line.
				for line := range strings.Lines(string(out)) {
					if _, msg, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && strings.Contains(msg, "KiB counted") {
						t.Log(msg)
					}
				}
				if err != nil {
					t.Errorf("%s, %s: the proxy's process: %v\n%s", setup.scheme, k.name, err, out)
				}
			})
		}
	}
}

// measureSizingKind is the proxy's process of the sizing test: it serves
// setup's listener, has a child process hold sizingKindConns connections
// of kind k, and holds what they count to README's figure for them.
func measureSizingKind(t *testing.T, setup sizingSetup, k sizingKind) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// figure is the KiB README gives in re's group'th group.
	figure := func(t *testing.T, re string, group int) int64 {
		t.Helper()
		m := regexp.MustCompile(re).FindSubmatch(readme)
		if m == nil {
			t.Fatalf("README: no %q (Client connections and memory, Sizing)", re)
		}
		kib, _ := strconv.Atoi(string(m[group]))
		return int64(kib)
	}
	allowance := func(t *testing.T, re string) int64 {
		t.Helper()
		return figure(t, re, 1)
	}
	scheme, useTLS := setup.scheme, setup.useTLS
	allowed := allowance(t, setup.rest)
	if k.moving {
		allowed = allowance(t, setup.moving)
	}
	if k.uploaded && setup.uploaded != "" {
		allowed = allowance(t, setup.uploaded)
	}
	access, err := accesslog.New(accesslog.Config{Format: accesslog.FormatJSON, Output: io.Discard}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = access.Close() })
	tel := obsTelemetry(t, nil)
	h := newHarness(t, func(o *harnessOpts) {
		o.cfg.AccessLog, o.cfg.Telemetry = access, tel
		if setup.headLimit > 0 {
			o.srv.MaxRequestHeaderSize = setup.headLimit
		}
	})
	addr := h.addr
	if useTLS {
		addr, _ = serveTLS(t, h)
	}
	warmUp(t, addr, useTLS)
	child := startSizingChild(t, k.name, addr, useTLS)
	putAuthRoute(h, "sizing", "", child.port, 3000)
	before := limitCounted()
	child.start()
	testenv.WaitFor(t, 10*time.Second, "every connection accepted", func() bool { return h.proxy.clientConns.Load() >= sizingKindConns })
	if k.lingers {
		testenv.WaitFor(t, 10*time.Second, "every connection lingering", func() bool { return h.proxy.held.len() == sizingKindConns })
	}
	per := (int64(limitCounted()) - int64(before)) / sizingKindConns
	if k.figure != "" && setup.headLimit == 0 {
		// An eighth over README's figure for measurement's sake, and a
		// few KiB over a figure of a few KiB, which varies from run to
		// run by as much. Over HTTPS too: its allowance for a
		// connection moving a body (180 KiB) takes a silent sandbox's
		// download that never gave its 64 KiB buffer back (≈ 150 KiB),
		// so only the figure shows the buffer given back under TLS.
		fig := figure(t, k.figure, map[bool]int{false: 1, true: 2}[useTLS])
		allowed = min(allowed, max(fig*9/8, fig+4))
	}
	// The hold ends within bulkHold: wait for it, until the
	// connection counts about what one at rest does and the
	// count has stopped falling (holds end one by one). Up to ten
	// holds: on a machine at load 10, a thousand of them had not all
	// ended after five (75.9 KiB counted against 73 allowed).
	settled := min(allowed, allowance(t, setup.rest)*9/8)
	for end, prev := time.Now().Add(10*bulkHold), int64(-1); k.quiet && (per > settled<<10 || prev-per > 1<<10) && time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		prev, per = per, (int64(limitCounted())-int64(before))/sizingKindConns
	}
	// Any other kind is measured again while its count still falls by over
	// a KiB, as a quiet kind's is: each measurement collects, and a
	// collection can shrink the stacks a connection's burst grew and no
	// longer uses, so one taken just after the last connection stalled
	// may count some of those. An HTTP download to a slow reader counted
	// 144.4 KiB in one run of four against 137-138 in the others, over
	// README's 144; settled, 135-136 in six runs on a loaded machine.
	for end := time.Now().Add(10 * bulkHold); !k.quiet && time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		next := (int64(limitCounted()) - int64(before)) / sizingKindConns
		fell := per-next > 1<<10
		per = next
		if !fell {
			break
		}
	}
	// Over the allowance after that, a quiet kind is given one more such
	// window: the same code counted 26-29 KiB for an HTTPS WebSocket from
	// a silent sandbox in most runs and 35-45 KiB in about one in eight,
	// which the window did not bring down (38.4 and 38.5 against 38 failed
	// clean-clone CIs); README now gives that outlier, as it gives plain
	// HTTP's. A tunnel that kept its 64 KiB buffer stays over either.
	for end := time.Now().Add(10 * bulkHold); k.quiet && per > allowed<<10 && time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		per = (int64(limitCounted()) - int64(before)) / sizingKindConns
	}
	t.Logf("%s, %s: %.1f KiB counted against GOMEMLIMIT per connection; the README allows %d KiB", scheme, k.name, float64(per)/1024, allowed)
	if per > allowed<<10 {
		t.Errorf("%s, %s: a connection counts %.1f KiB against GOMEMLIMIT, over the %d KiB per connection README's sizing allows",
			scheme, k.name, float64(per)/1024, allowed)
	}
}

// warmUp makes one exchange with the proxy, so that what the server sets
// up once (for TLS, its session ticket keys) is no connection's.
func warmUp(t *testing.T, addr string, useTLS bool) {
	t.Helper()
	c := dialRaw(t, addr)
	if useTLS {
		c = tls.Client(c, &tls.Config{InsecureSkipVerify: true})
	}
	if resp, _ := rawExchange(t, c, addr, "GET /p HTTP/1.1\r\nHost: 3000-nosuchbox.cube.test\r\nConnection: close\r\n\r\n"); resp.StatusCode != 404 {
		t.Fatalf("warm-up: %d, want 404", resp.StatusCode)
	}
}

// sizingChild is the child process of the sizing test: its sandbox
// listens on port; start makes it open its connections.
type sizingChild struct {
	t     *testing.T
	port  uint16
	stdin io.WriteCloser
	sc    *bufio.Scanner
	out   *strings.Builder
}

// startSizingChild starts the child process holding connections of kind
// to addr and returns once its sandbox listens.
func startSizingChild(t *testing.T, kind, addr string, useTLS bool) *sizingChild {
	t.Helper()
	out := &strings.Builder{}
	stdin, stdout := startChild(t, "TestREADMESizingCoversEveryKindOfConnection", out,
		"CUBE_TEST_SIZING_KIND="+kind, "CUBE_TEST_SIZING_ADDR="+addr, "CUBE_TEST_SIZING_TLS="+map[bool]string{true: "1"}[useTLS])
	c := &sizingChild{t: t, stdin: stdin, sc: bufio.NewScanner(stdout), out: out}
	line := c.line("sandbox ")
	p, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("child's sandbox port %q: %v", line, err)
	}
	c.port = uint16(p)
	return c
}

// line returns the rest of the child's next line that starts with prefix.
func (c *sizingChild) line(prefix string) string {
	c.t.Helper()
	for c.sc.Scan() {
		if s, ok := strings.CutPrefix(c.sc.Text(), prefix); ok {
			return s
		}
		fmt.Fprintln(c.out, c.sc.Text())
	}
	c.t.Fatalf("client process ended before %q:\n%s", prefix, c.out)
	return ""
}

// start has the child open its connections and returns once they are in
// their state.
func (c *sizingChild) start() {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		c.t.Fatal(err)
	}
	c.line("ready")
}

// holdSizingKind is the child: it runs the sandbox, opens the connections
// of kind once its stdin says so, says "ready" once every one is in its
// state (acknowledged by the sandbox or the answer where one can be), and
// holds them until its stdin closes.
func holdSizingKind(t *testing.T, kind string, useTLS bool) {
	var (
		reached  atomic.Int64 // requests that reached the sandbox
		received atomic.Int64 // body or tunnel bytes the sandbox read
		lastMu   sync.Mutex
		last     = map[int]time.Time{} // when each streaming answer last wrote
		nextID   atomic.Int64
		done     = make(chan struct{})
	)
	const part = 16 << 10 // body or message bytes a client sends before it stalls
	// The body a silent sandbox sends first: enough for the copy's bulk.
	const silentPart = 192 << 10
	// The body a silent client sends first: enough for the copy's bulk.
	const uploadBurst = 64 << 10
	// A chunked one's, in one chunk: with its size line and CRLF, 64 KiB
	// less a byte, so that over TLS the last 16 KiB record, and the last
	// read of the chunk's data, is a full one.
	const chunkBurst = uploadBurst - 9
	// An event stream's burst of silentPart bytes, in 4 KiB events.
	sseBurst := strings.Repeat("data: "+strings.Repeat("x", 4088)+"\n\n", silentPart/4096)
	stream := func(w http.ResponseWriter, sse bool) {
		id := int(nextID.Add(1))
		chunk := []byte(strings.Repeat("x", 4096))
		if sse {
			chunk = []byte("data: " + strings.Repeat("x", 4088) + "\n\n")
		}
		f := w.(http.Flusher)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			f.Flush()
			lastMu.Lock()
			last[id] = time.Now()
			lastMu.Unlock()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		switch kind {
		case "mid-upload", "upload from a silent client", "chunked upload from a silent client", "chunked upload stopped before a chunk's CRLF":
			_, _ = io.Copy(countWriter{&received}, r.Body)
		case "waiting on a slow sandbox":
			<-done
		case "download to a slow reader":
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
			stream(w, false)
		case "download from a silent sandbox", "HTTP 1.0 download from a silent sandbox", "chunked download from a silent sandbox":
			if kind == "download from a silent sandbox" {
				w.Header().Set("Content-Length", strconv.Itoa(1<<20))
			} // else chunked: no length, flushed
			w.Write(make([]byte, silentPart))
			w.(http.Flusher).Flush()
			<-done
		case "SSE from a silent sandbox":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, sseBurst)
			w.(http.Flusher).Flush()
			<-done
		case "read-to-close download from a silent sandbox", "WebSocket from a silent sandbox":
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			// The head and the burst in one write: the proxy's reader of
			// the head holds the burst's first 16 KiB with it (for a
			// WebSocket, what its tunnel writes first), as it does from a
			// sandbox that sent them together or under load. Until
			// runTunnel let go of those bytes once written, each tunnel
			// held them for its life (12-16 KiB, over README's figure).
			var head string
			if kind == "WebSocket from a silent sandbox" {
				sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
				head = fmt.Sprintf("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
			} else {
				// Neither a length nor chunks: the body ends with the connection.
				head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
			}
			c.Write(append([]byte(head), make([]byte, silentPart)...))
			<-done
		case "SSE idle":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: hello\n\n")
			w.(http.Flusher).Flush()
			<-done
		case "SSE to a slow reader":
			w.Header().Set("Content-Type", "text/event-stream")
			stream(w, true)
		case "WebSocket idle", "WebSocket mid-message":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
			brw.Flush()
			_, _ = io.Copy(countWriter{&received}, brw)
		case "idle after a 64 KiB upload":
			_, _ = io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok")
		case "idle after an 8 KiB answer":
			// keptBody: the largest answer read into the response's own
			// buffer, which fasthttp keeps with the connection.
			w.Header().Set("Content-Length", strconv.Itoa(keptBody))
			w.Write(make([]byte, keptBody))
		case "idle after an answer of many header lines":
			// 2,500 lines of "A: b", 15 KB: within upstream.max_header_size.
			w.Header()["A"] = slices.Repeat([]string{"b"}, 2500)
			io.WriteString(w, "ok")
		default:
			io.WriteString(w, "ok")
		}
	})}
	go srv.Serve(ln)
	fmt.Printf("sandbox %d\n", ln.Addr().(*net.TCPAddr).Port)
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	addr, host := os.Getenv("CUBE_TEST_SIZING_ADDR"), "3000-sizing.cube.test"
	conns := make([]net.Conn, 0, sizingKindConns)
	for i := range sizingKindConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// A small receive buffer: a slow reader's stalls come soon and
		// the kernel holds little of what it has not read. Not for a
		// client that reads: on loopback, whose segments run to 64 KiB,
		// so small a window stalled the proxy's sends on the persist
		// timer's probes, for minutes.
		if !strings.HasSuffix(kind, "from a silent sandbox") {
			_ = c.(*net.TCPConn).SetReadBuffer(8 << 10)
		}
		if useTLS {
			// crypto/tls sends its first 128 KiB in records of about
			// 1 KiB, which no read of the proxy's fills its small buffer
			// from; other clients (curl's OpenSSL) send 16 KiB records.
			c = tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}, DynamicRecordSizingDisabled: strings.HasSuffix(kind, "upload from a silent client") || strings.HasSuffix(kind, "CRLF") || kind == "idle after a 64 KiB upload"})
		}
		conns = append(conns, c)
		br := bufio.NewReaderSize(c, 1024)
		head := func(extra string) {
			if _, err := fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: %s\r\nX-Cube-Request-Id: sizing-%d\r\n%s\r\n", host, i, extra); err != nil {
				t.Fatal(err)
			}
		}
		answer := func(want int) *http.Response {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != want {
				t.Fatalf("%s: answer %d, want %d", kind, resp.StatusCode, want)
			}
			return resp
		}
		switch kind {
		case "idle keep-alive", "idle after an answer of many header lines", "idle after an 8 KiB answer":
			head("")
			resp := answer(200)
			io.Copy(io.Discard, resp.Body)
		case "idle after a 64 KiB upload":
			// Head and body in one write: over TLS, four full records.
			if _, err := fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, 64<<10, make([]byte, 64<<10)); err != nil {
				t.Fatal(err)
			}
			resp := answer(200)
			io.Copy(io.Discard, resp.Body)
		case "idle after a request of many header lines":
			head(strings.Repeat("A: b\r\n", 990))
			resp := answer(200)
			io.Copy(io.Discard, resp.Body)
		case "download from a silent sandbox", "chunked download from a silent sandbox", "read-to-close download from a silent sandbox", "SSE from a silent sandbox":
			if kind == "SSE from a silent sandbox" {
				head("Accept: text/event-stream\r\n")
			} else {
				head("")
			}
			resp := answer(200)
			if _, err := io.ReadFull(resp.Body, make([]byte, silentPart)); err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		case "HTTP 1.0 download from a silent sandbox":
			fmt.Fprintf(c, "GET /p HTTP/1.0\r\nHost: %s\r\n\r\n", host)
			resp := answer(200)
			if _, err := io.ReadFull(resp.Body, make([]byte, silentPart)); err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		case "WebSocket from a silent sandbox":
			head("Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
			answer(101)
			if _, err := io.ReadFull(br, make([]byte, silentPart)); err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		case "mid-head":
			fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: %s\r\nX-Half: ", host)
		case "mid-upload":
			fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", host, 1<<20, strings.Repeat("u", part))
		case "upload from a silent client":
			// The head alone, then the burst in one write: the proxy's
			// last read of it fills its small buffer (a TLS record of
			// 16 KiB, or what fasthttp's reader left of a loopback
			// segment), and its copy is in bulk when the client stops.
			fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", host, 1<<20)
			if _, err := c.Write(make([]byte, uploadBurst)); err != nil {
				t.Fatal(err)
			}
		case "chunked upload from a silent client":
			// As above, the copy in bulk when the client stops, after the
			// chunk's CRLF, before the next chunk's size line.
			fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", host)
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", chunkBurst, make([]byte, chunkBurst)); err != nil {
				t.Fatal(err)
			}
		case "chunked upload stopped before a chunk's CRLF":
			// The head alone: the chunk follows once every request is
			// at the sandbox (below), so that its data comes apart from
			// the head, as a client streaming its upload sends it.
			fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", host)
		case "waiting on a slow sandbox", "download to a slow reader", "SSE to a slow reader":
			head("")
		case "SSE idle":
			head("Accept: text/event-stream\r\n")
			resp := answer(200)
			ev := make([]byte, len("data: hello\n\n"))
			if _, err := io.ReadFull(resp.Body, ev); err != nil || string(ev) != "data: hello\n\n" {
				t.Fatalf("SSE: %q, %v", ev, err)
			}
		case "WebSocket idle", "WebSocket mid-message":
			head("Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
			answer(101)
			if kind == "WebSocket mid-message" {
				// A masked binary frame of 1 MiB, its first 16 KiB sent.
				frame := append([]byte{0x82, 0xff, 0, 0, 0, 0, 0, 0x10, 0, 0, 1, 2, 3, 4}, make([]byte, part)...)
				if _, err := c.Write(frame); err != nil {
					t.Fatal(err)
				}
			}
		case "lingering after a refusal":
			fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: 3000-nosuchbox.cube.test\r\nContent-Length: 1048576\r\n\r\n%s", strings.Repeat("x", 9000))
			resp := answer(404)
			io.Copy(io.Discard, resp.Body)
			io.WriteString(c, strings.Repeat("y", 100))
		default:
			t.Fatalf("unknown kind %q", kind)
		}
	}
	waitFor := func(what string, ok func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not %s in 30 s", kind, what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	switch kind {
	case "mid-upload":
		waitFor("every upload's first part at the sandbox", func() bool { return received.Load() == sizingKindConns*part })
	case "upload from a silent client":
		waitFor("every upload's burst at the sandbox", func() bool { return received.Load() == sizingKindConns*uploadBurst })
	case "chunked upload from a silent client":
		waitFor("every upload's chunk at the sandbox", func() bool { return received.Load() == sizingKindConns*chunkBurst })
	case "chunked upload stopped before a chunk's CRLF":
		waitFor("every request at the sandbox", func() bool { return reached.Load() == sizingKindConns })
		for _, c := range conns {
			// A chunk of 64 KiB, without the CRLF after its data.
			if _, err := fmt.Fprintf(c, "%x\r\n%s", uploadBurst, make([]byte, uploadBurst)); err != nil {
				t.Fatal(err)
			}
		}
		// What of each chunk the proxy passes on before its CRLF
		// depends on how its reads fell: ready once the sandbox has had
		// it all, its count unchanged for half a second.
		waitFor("the chunks' bytes passed on", func() bool {
			n := received.Load()
			time.Sleep(500 * time.Millisecond)
			return n > 0 && received.Load() == n
		})
	case "WebSocket mid-message":
		waitFor("every message's first part at the sandbox", func() bool { return received.Load() == sizingKindConns*(part+14) })
	case "waiting on a slow sandbox", "SSE idle", "WebSocket idle":
		waitFor("every request at the sandbox", func() bool { return reached.Load() == sizingKindConns })
	case "download to a slow reader", "SSE to a slow reader":
		// Stalled: no answer has written for half a second.
		waitFor("every answer stalled", func() bool {
			lastMu.Lock()
			defer lastMu.Unlock()
			if len(last) < sizingKindConns {
				return false
			}
			for _, w := range last {
				if time.Since(w) < 500*time.Millisecond {
					return false
				}
			}
			return true
		})
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, in)
	close(done)
	for _, c := range conns {
		c.Close()
	}
}

// countWriter adds what is written to it to n.
type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}
