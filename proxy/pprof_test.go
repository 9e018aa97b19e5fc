package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

const pprofToken = "pprof-test-admin-token"

// pprofGet sends method path to addr over a connection of its own, with
// the admin token when token is set, and returns the status and body.
func pprofGet(t *testing.T, method, addr, host, path, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if token != "" {
		req.Header.Set("X-Cube-Admin-Token", token)
	}
	req.Close = true
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// gunzipProfile checks that b is a gzip'd profile, as go tool pprof reads
// one, and returns the protobuf inside.
func gunzipProfile(t *testing.T, what string, b []byte) []byte {
	t.Helper()
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("%s: not gzip (%d bytes: %q)", what, len(b), b[:min(len(b), 80)])
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	pb, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(pb) == 0 {
		t.Fatalf("%s: an empty profile", what)
	}
	return pb
}

// With admin_pprof on, an operator holding the admin token profiles the
// running proxy in place: the heap, the goroutines (ours among them) and
// a CPU profile. A CPU profile holds its own connection for its seconds
// only: the health checks, which a load balancer probes every few seconds,
// are answered meanwhile.
func TestPprofServesProfilesWithToken(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) { o.token, o.pprof = pprofToken, true })

	st, heap := pprofGet(t, "GET", h.admin, "", "/debug/pprof/heap", pprofToken)
	if st != 200 {
		t.Fatalf("heap: %d %s", st, heap)
	}
	// The sample types a heap profile names in its string table.
	if pb := gunzipProfile(t, "heap", heap); !bytes.Contains(pb, []byte("inuse_space")) || !bytes.Contains(pb, []byte("alloc_space")) {
		t.Errorf("heap: the profile names no inuse_space and alloc_space samples")
	}

	st, dump := pprofGet(t, "GET", h.admin, "", "/debug/pprof/goroutine?debug=1", pprofToken)
	if st != 200 || !strings.Contains(string(dump), "github.com/cube-sandbox/cubeproxy/proxy.(*Server).janitor") {
		t.Errorf("goroutine?debug=1: %d, the dump does not name the proxy's janitor goroutine:\n%.2000s", st, dump)
	}

	type answer struct {
		status int
		body   []byte
	}
	cpu := make(chan answer, 1)
	go func() {
		// Not pprofGet: its t.Fatal must not run off the test's goroutine.
		req, _ := http.NewRequest("GET", "http://"+h.admin+"/debug/pprof/profile?seconds=2", nil)
		req.Header.Set("X-Cube-Admin-Token", pprofToken)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			cpu <- answer{body: []byte(err.Error())}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cpu <- answer{resp.StatusCode, b}
	}()
	testenv.WaitFor(t, 10*time.Second, "the CPU profile running", func() bool {
		for _, s := range testenv.Stacks() {
			if strings.Contains(s, "net/http/pprof.Profile(") {
				return true
			}
		}
		return false
	})
	if st, body := pprofGet(t, "GET", h.admin, "", "/admin/healthz", ""); st != 200 {
		t.Errorf("healthz during a CPU profile: %d %s", st, body)
	}
	select {
	case a := <-cpu:
		t.Fatalf("the CPU profile (%d) ended before healthz was answered: healthz waited for it", a.status)
	default:
	}
	a := <-cpu
	if a.status != 200 {
		t.Fatalf("CPU profile: %d %s", a.status, a.body)
	}
	if pb := gunzipProfile(t, "CPU profile", a.body); !bytes.Contains(pb, []byte("nanoseconds")) {
		t.Errorf("CPU profile: no cpu/nanoseconds sample type")
	}
}

// localIPv4 is one of the machine's own non-loopback IPv4 addresses, ""
// when it has none.
func localIPv4() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && hasLocalAddr(n.IP.String()) {
			return n.IP.String()
		}
	}
	return ""
}

// The profiles are behind exactly the admin API's credential (the token,
// or a loopback caller when none is configured), read at most a minute of
// CPU (a trace ten seconds) so one request cannot hold a connection and
// its buffer for hours, and never hand out the command line, which may
// carry a secret given as a flag. Off, /debug/pprof/ is the 404 of a path
// the admin API lacks. Every refusal is the admin API's JSON error.
func TestPprofRefusals(t *testing.T) {
	withToken := newHarness(t, func(o *harnessOpts) { o.token, o.pprof = pprofToken, true })
	off := newHarness(t, func(o *harnessOpts) { o.token = pprofToken })
	open := newHarness(t, func(o *harnessOpts) { o.pprof = true })
	type row struct {
		name         string
		addr         string
		method, path string
		token        string
		status       int
		says         string
	}
	rows := []row{
		{"on, the token", withToken.admin, "GET", "/debug/pprof/heap", pprofToken, 200, ""},
		{"on, no token sent", withToken.admin, "GET", "/debug/pprof/heap", "", 403, "admin token missing or wrong"},
		{"on, a wrong token", withToken.admin, "GET", "/debug/pprof/goroutine?debug=1", "not-the-token", 403, "admin token missing or wrong"},
		{"on, no token configured, loopback", open.admin, "GET", "/debug/pprof/heap", "", 200, ""},
		{"off", off.admin, "GET", "/debug/pprof/heap", pprofToken, 404, "profiling is off: set admin_pprof"},
		{"off, the index", off.admin, "GET", "/debug/pprof/", pprofToken, 404, "profiling is off"},
		{"on, CPU past the cap", withToken.admin, "GET", "/debug/pprof/profile?seconds=61", pprofToken, 400, "seconds must be a whole number from 1 to 60"},
		{"on, a delta heap past the cap", withToken.admin, "GET", "/debug/pprof/heap?seconds=3600", pprofToken, 400, "from 1 to 60"},
		{"on, trace past the cap", withToken.admin, "GET", "/debug/pprof/trace?seconds=10.5", pprofToken, 400, "at most 10 for a trace"},
		{"on, seconds twice", withToken.admin, "GET", "/debug/pprof/profile?seconds=1&seconds=600", pprofToken, 400, "given twice"},
		{"on, the command line", withToken.admin, "GET", "/debug/pprof/cmdline", pprofToken, 404, "may carry secrets"},
		{"on, POST", withToken.admin, "POST", "/debug/pprof/heap", pprofToken, 405, "takes GET, HEAD"},
	}
	if ip := localIPv4(); ip != "" {
		remote := newHarness(t, func(o *harnessOpts) { o.pprof, o.listen = true, ip })
		rows = append(rows, row{"on, no token configured, another host", remote.admin, "GET", "/debug/pprof/heap", "", 403, "no admin token is configured"})
	} else {
		t.Log("this machine has no non-loopback IPv4 address: the tokenless refusal of another host is left out")
	}
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			st, body := pprofGet(t, tc.method, tc.addr, "", tc.path, tc.token)
			if st != tc.status {
				t.Fatalf("%s %s: %d %.300s, want %d", tc.method, tc.path, st, body, tc.status)
			}
			if st == 200 {
				gunzipProfile(t, tc.path, body)
				return
			}
			var e map[string]string
			if err := json.Unmarshal(body, &e); err != nil || len(e) != 1 || !strings.Contains(e["error"], tc.says) {
				t.Errorf("%s %s: %d %s, want the admin API's {\"error\"} saying %q", tc.method, tc.path, st, body, tc.says)
			}
		})
	}
}

// The profiles are the admin listener's alone: the traffic listener sends
// /debug/pprof/ to the sandbox (or answers its routing error), and the
// metrics listener (metrics_addr), which anyone reaching it may call, has
// only the scrape, whatever token is sent.
func TestPprofNeverOnTrafficOrMetricsListener(t *testing.T) {
	h, metrics := metricsHarness(t, pprofToken, func(o *harnessOpts) { o.pprof = true })
	host := h.route("box", backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "sandbox saw "+r.URL.Path)
	})))
	if st, body := pprofGet(t, "GET", h.admin, "", "/debug/pprof/heap", pprofToken); st != 200 {
		t.Fatalf("admin listener: %d %s, want the heap profile", st, body)
	}
	if st, body := pprofGet(t, "GET", h.addr, host, "/debug/pprof/heap", pprofToken); st != 200 || string(body) != "sandbox saw /debug/pprof/heap" {
		t.Errorf("traffic listener, sandbox host: %d %.200q, want the sandbox's answer", st, body)
	}
	for _, tc := range []struct{ name, addr, host string }{
		{"traffic listener, no sandbox named", h.addr, ""},
		{"traffic listener, localhost", h.addr, "localhost"},
		{"metrics listener", metrics, ""},
	} {
		st, body := pprofGet(t, "GET", tc.addr, tc.host, "/debug/pprof/heap", pprofToken)
		var e map[string]string
		if st < 400 || json.Unmarshal(body, &e) != nil || e["error"] == "" {
			t.Errorf("%s: %d %.200q, want a JSON error, never a profile", tc.name, st, body)
		}
	}
}
