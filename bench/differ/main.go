// Command differ is the differential lab: it sends one corpus of raw HTTP/1.x
// requests to nginx (running a copy of configs/bench/nginx-platform.conf, the
// model of the platform's proxy) and to CubeProxy, both in front of one echo
// sandbox, and compares request by request what the client got and what the
// sandbox saw. A difference not listed as expected (cases.go, with its reason)
// makes the exit status 1.
//
//	go run ./bench/differ [-run prefix] [-v] [-keep] [-bin path/to/cubeproxy]
//
// Run it from the repository root: it builds ./cmd/cubeproxy and reads
// configs/bench/nginx-platform.conf. It needs nginx on PATH (Debian package).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	run := flag.String("run", "", "only cases whose name starts with this")
	verbose := flag.Bool("v", false, "print both sides of every case, not only of differing ones")
	keep := flag.Bool("keep", false, "keep the work dir (configs, logs, CubeProxy's access log)")
	bin := flag.String("bin", "", "a cubeproxy binary to run instead of building ./cmd/cubeproxy (an older build, to compare)")
	flag.Parse()
	os.Exit(lab(*run, *bin, *verbose, *keep))
}

func lab(only, bin string, verbose, keep bool) int {
	start := time.Now()
	work, err := os.MkdirTemp("", "differ-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "differ:", err)
		return 2
	}
	// nginx's worker (nobody, when started as root) writes request bodies
	// under the work dir.
	if err := os.Chmod(work, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "differ:", err)
		return 2
	}
	if keep {
		fmt.Println("work dir:", work)
	} else {
		defer os.RemoveAll(work)
	}
	sb, err := startSandbox()
	if err != nil {
		fmt.Fprintln(os.Stderr, "differ: sandbox:", err)
		return 2
	}
	defer sb.ln.Close()

	// CubeProxy is built and started while the cases run against nginx: the
	// build alone took 5 to 15 s of the test on a busy machine. It picks its
	// ports once nginx has its own, so that the two cannot pick the same.
	var cube struct {
		addr string
		stop func()
		err  error
	}
	cubeReady, nginxStarted := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(cubeReady)
		b := bin
		if b == "" {
			if b, cube.err = buildCube(work); cube.err != nil {
				return
			}
		}
		<-nginxStarted
		cube.addr, cube.stop, cube.err = startCube(work, b, sb.port)
	}()
	defer func() {
		<-cubeReady
		if cube.err == nil {
			cube.stop()
		}
	}()

	nginxAddr, stopNginx, err := startNginx(work, sb.port, freePort)
	close(nginxStarted)
	if err != nil {
		fmt.Fprintln(os.Stderr, "differ: nginx:", err)
		return 2
	}
	defer stopNginx()

	env := caseEnv{host: fmt.Sprintf("%d-lab.cube.test", sb.port), port: sb.port}
	var cases []tcase
	for _, c := range corpus(env) {
		if strings.HasPrefix(c.name, only) {
			cases = append(cases, c)
		}
	}
	// Each subject takes 32 cases at a time, started in corpus order; the
	// sandbox tells their requests apart by tag. Most of a case's time is
	// waiting (300 ms to see whether its connection stays open, a client's
	// 4 s deadline, a 200 ms pause), not CPU: eight cases at a time, both
	// subjects one after the other, took 35 s of the test's 45. A case's
	// nginx run does not wait for CubeProxy's build; its CubeProxy run
	// waits for CubeProxy to answer.
	// A case marked alone holds its subject's lock for writing (tcase.alone).
	type outcome struct{ n, p result }
	outs := make([]chan outcome, len(cases))
	nginxSem, cubeSem := make(chan struct{}, 32), make(chan struct{}, 32)
	var nginxMu, cubeMu sync.RWMutex
	for i, c := range cases {
		outs[i] = make(chan outcome, 1)
		nginxSem <- struct{}{}
		go func() {
			n := exchangeLocked(&nginxMu, c, nginxAddr, sb, "nginx")
			<-nginxSem
			<-cubeReady
			var p result
			if cube.err == nil {
				cubeSem <- struct{}{}
				p = exchangeLocked(&cubeMu, c, cube.addr, sb, "cube")
				<-cubeSem
			}
			outs[i] <- outcome{n, p}
		}()
	}
	<-cubeReady
	if cube.err != nil {
		fmt.Fprintln(os.Stderr, "differ: cubeproxy:", cube.err)
		return 2
	}
	bad, same, expected := 0, 0, 0
	for i, c := range cases {
		o := <-outs[i]
		n, p := o.n, o.p
		diffs := compare(c, n, p)
		var unexplained, explained []string
		for _, d := range diffs {
			if why := c.explain(d); why != "" {
				explained = append(explained, d+"\n        expected: "+why)
			} else {
				unexplained = append(unexplained, d)
			}
		}
		switch {
		case len(unexplained) > 0:
			bad++
			fmt.Printf("%-34s DIFFERS\n", c.name)
			for _, d := range unexplained {
				fmt.Printf("    %s\n", d)
			}
			for _, d := range explained {
				fmt.Printf("    %s\n", d)
			}
		case len(explained) > 0:
			expected++
			fmt.Printf("%-34s expected differences\n", c.name)
			for _, d := range explained {
				fmt.Printf("    %s\n", d)
			}
		default:
			same++
			fmt.Printf("%-34s same\n", c.name)
		}
		if verbose || len(unexplained) > 0 {
			fmt.Printf("      nginx: %s\n      cube:  %s\n", n.brief(), p.brief())
		}
	}
	fmt.Printf("\n%d same, %d with expected differences, %d DIFFER (%.1fs)\n", same, expected, bad, time.Since(start).Seconds())
	if bad > 0 {
		return 1
	}
	return 0
}

// freePort returns a loopback port nothing listens on now. nginx takes its
// port from its config file, so the port is chosen before it starts.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitDial waits until addr accepts a connection or the process exits.
func waitDial(addr string, exited <-chan struct{}) error {
	return waitReady(exited, "listening on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// waitNginx waits until nginx answers at addr (its Server header says
// so) or exits. A dial alone is not enough: a listener of another program
// on the port would take the connection while nginx, unable to bind it,
// retries for two seconds and exits.
func waitNginx(addr string, exited <-chan struct{}) error {
	client := &http.Client{Timeout: time.Second}
	return waitReady(exited, "nginx answering on "+addr, func() bool {
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return strings.HasPrefix(resp.Header.Get("Server"), "nginx")
	})
}

// waitReady asks ready every 50 ms for up to 60 s, until it says yes or
// the process exits; what names the wait in its errors.
func waitReady(exited <-chan struct{}, what string, ready func() bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ready() {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not %s after 60s", what)
}

// startProc starts cmd in its own process group and returns a stop function
// that ends that group (nginx's master and worker) and waits for it.
func startProc(cmd *exec.Cmd) (exited chan struct{}, stop func(), err error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	exited = make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop = func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
	return exited, stop, nil
}

// nginxPath is nginx on PATH, or Debian's /usr/sbin/nginx, which a PATH
// without the sbin directories (some CI shells) does not reach.
func nginxPath() string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	return "/usr/sbin/nginx"
}

// startNginx writes the platform config with only its ports changed: the
// listener, and one upstream block for the sandbox's port in place of the
// bench's two.
func startNginx(work string, sandboxPort int, pickPort func() (int, error)) (addr string, stop func(), err error) {
	// The port is free when freePort closes it, and another socket of the
	// machine (a test's client connection) can take it before nginx binds
	// it: nginx then exits with "Address already in use", and a new port
	// is tried.
	for range 5 {
		var inUse bool
		addr, stop, inUse, err = startNginxOnce(work, sandboxPort, pickPort)
		if !inUse {
			break
		}
	}
	return addr, stop, err
}

// startNginxOnce is one try of startNginx on a port pickPort picks;
// inUse says that nginx could not bind that port.
func startNginxOnce(work string, sandboxPort int, pickPort func() (int, error)) (string, func(), bool, error) {
	raw, err := os.ReadFile("configs/bench/nginx-platform.conf")
	if err != nil {
		return "", nil, false, fmt.Errorf("run from the repository root: %w", err)
	}
	port, err := pickPort()
	if err != nil {
		return "", nil, false, err
	}
	conf := string(raw)
	listen := regexp.MustCompile(`listen 127\.0\.0\.1:18082`)
	if !listen.MatchString(conf) {
		return "", nil, false, fmt.Errorf("nginx-platform.conf: no `listen 127.0.0.1:18082` to replace")
	}
	conf = listen.ReplaceAllString(conf, fmt.Sprintf("listen 127.0.0.1:%d", port))
	ups := regexp.MustCompile(`(?s)    upstream sandbox_port_20001 \{.*?\n    \}\n    upstream sandbox_port_20002 \{.*?\n    \}\n`)
	if !ups.MatchString(conf) {
		return "", nil, false, fmt.Errorf("nginx-platform.conf: the two upstream blocks changed shape")
	}
	block := ups.FindString(conf)
	one := block[:strings.Index(block, "    upstream sandbox_port_20002")]
	one = strings.ReplaceAll(one, "20001", strconv.Itoa(sandboxPort))
	conf = ups.ReplaceAllLiteralString(conf, one)
	dir := filepath.Join(work, "nginx")
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return "", nil, false, err
	}
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return "", nil, false, err
	}
	cmd := exec.Command(nginxPath(), "-p", dir+"/", "-e", filepath.Join(dir, "logs", "error.log"), "-c", confPath)
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return "", nil, false, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	exited, stop, err := startProc(cmd)
	if err != nil {
		return "", nil, false, fmt.Errorf("start nginx (apt-get install -y nginx): %w", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitNginx(addr, exited); err != nil {
		stop()
		log, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
		inUse := bytes.Contains(log, []byte("Address already in use"))
		return "", nil, inUse, fmt.Errorf("%w\n%s", err, log)
	}
	return addr, stop, false, nil
}

// buildCube builds ./cmd/cubeproxy into work and returns the binary's path.
func buildCube(work string) (string, error) {
	bin := filepath.Join(work, "cubeproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/cubeproxy")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/cubeproxy: %w", err)
	}
	return bin, nil
}

// startCube serves the sandbox with the binary bin from the embedded store,
// access log on.
func startCube(work, bin string, sandboxPort int) (string, func(), error) {
	httpPort, err := freePort()
	if err != nil {
		return "", nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return "", nil, err
	}
	routes := fmt.Sprintf("routes:\n  lab:\n    HostIP: \"127.0.0.1\"\n    SandboxIP: \"127.0.0.1\"\n    CreatedAt: \"1\"\n    \"%d\": \"%d\"\n", sandboxPort, sandboxPort)
	if err := os.WriteFile(filepath.Join(work, "routes.yaml"), []byte(routes), 0o644); err != nil {
		return "", nil, err
	}
	conf := fmt.Sprintf("http_addr: \"127.0.0.1:%d\"\nadmin_addr: \"127.0.0.1:%d\"\nstore: memory\nroutes: %s\naccess_log:\n  format: json\n  path: %s\n",
		httpPort, adminPort, filepath.Join(work, "routes.yaml"), filepath.Join(work, "access.log"))
	confPath := filepath.Join(work, "cubeproxy.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", confPath)
	out, err := os.Create(filepath.Join(work, "cubeproxy.log"))
	if err != nil {
		return "", nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	exited, stop, err := startProc(cmd)
	if err != nil {
		return "", nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	if err := waitDial(addr, exited); err != nil {
		stop()
		log, _ := os.ReadFile(filepath.Join(work, "cubeproxy.log"))
		return "", nil, fmt.Errorf("%w\n%s", err, log)
	}
	return addr, stop, nil
}

// result is one subject's run of a case.
type result struct {
	client clientView
	seen   []seenReq
}

func (r result) brief() string {
	b, _ := json.Marshal(struct {
		Client clientView `json:"client"`
		Seen   []seenReq  `json:"sandbox"`
	}{r.client, r.seen})
	return string(b)
}

// exchangeLocked is exchange under mu: for reading, beside the subject's
// other cases, or for writing when c must run alone.
func exchangeLocked(mu *sync.RWMutex, c tcase, addr string, sb *sandbox, subject string) result {
	if c.alone {
		mu.Lock()
		defer mu.Unlock()
	} else {
		mu.RLock()
		defer mu.RUnlock()
	}
	return exchange(c, addr, sb, subject)
}

// exchange runs case c against the proxy at addr and collects what the
// sandbox saw of it (requests tagged with the case's X-Lab-Case value).
func exchange(c tcase, addr string, sb *sandbox, subject string) result {
	tag := c.name + "/" + subject
	cv := runClient(c, addr, tag)
	// A request the client gave up on may reach the sandbox late.
	wait := time.Duration(0)
	if strings.Contains(cv.Err, "timeout") {
		wait = 3 * time.Second
	}
	return result{client: cv, seen: sb.end(tag, wait)}
}

// compare lists the differences between nginx's run (n) and CubeProxy's (p),
// each as "field: nginx=… cube=…".
func compare(c tcase, n, p result) []string {
	var d []string
	add := func(field string, a, b any) {
		as, bs := show(a), show(b)
		if as != bs {
			d = append(d, fmt.Sprintf("%s: nginx=%s cube=%s", field, as, bs))
		}
	}
	add("client.err", n.client.Err, p.client.Err)
	add("client.responses", len(n.client.Resps), len(p.client.Resps))
	for i := 0; i < len(n.client.Resps) && i < len(p.client.Resps); i++ {
		a, b := n.client.Resps[i], p.client.Resps[i]
		f := fmt.Sprintf("client[%d].", i)
		add(f+"status", a.Status, b.Status)
		add(f+"from", a.from(), b.from())
		add(f+"interim", a.Interim, b.Interim)
		if a.from() == "sandbox" && b.from() == "sandbox" {
			// Error pages are each proxy's own (nginx HTML, CubeProxy JSON):
			// only a sandbox's answer is compared field by field.
			add(f+"framing", a.Framing, b.Framing)
			add(f+"headers", clientHeaders(a, c.v10), clientHeaders(b, c.v10))
			add(f+"body", string(a.Body), string(b.Body))
			add(f+"trailers", a.Trailers, b.Trailers)
			add(f+"err", a.Err, b.Err)
		}
	}
	add("client.conn", n.client.Conn, p.client.Conn)
	add("sandbox.requests", len(n.seen), len(p.seen))
	for i := 0; i < len(n.seen) && i < len(p.seen); i++ {
		a, b := n.seen[i], p.seen[i]
		f := fmt.Sprintf("sandbox[%d].", i)
		add(f+"line", a.Line, b.Line)
		add(f+"headers", sandboxHeaders(a), sandboxHeaders(b))
		add(f+"framing", a.Framing, b.Framing)
		add(f+"body", string(a.Body), string(b.Body))
		add(f+"trailers", a.Trailers, b.Trailers)
		add(f+"err", a.Err, b.Err)
	}
	return d
}

func show(v any) string {
	switch x := v.(type) {
	case string:
		if len(x) > 300 {
			x = x[:300] + fmt.Sprintf("…(%d bytes)", len(x))
		}
		return strconv.Quote(x)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// ignoredSandboxHeaders are left out of the comparison of what the sandbox
// saw: the lab's own tag, and what CubeProxy adds by design (README,
// Forwarding behaviour: X-Cube-Request-Id is sent to the sandbox,
// X-Forwarded-Proto: http is set when absent; nginx-platform.conf sets
// neither). A client's own X-Forwarded-Proto is compared.
var ignoredSandboxHeaders = map[string]bool{"x-lab-case": true, "x-cube-request-id": true, "x-forwarded-proto": true}

// sandboxHeaders is what the sandbox saw, names lower-cased (CubeProxy sends
// names in canonical case, nginx as the client wrote them: README,
// Forwarding behaviour; HTTP compares names without case), sorted stably by
// name: nginx sends its proxy_set_header fields first, CubeProxy keeps the
// client's order, and only the order of one name's lines carries meaning.
func sandboxHeaders(s seenReq) []string {
	var out []hdr
	for _, h := range s.Headers {
		n := strings.ToLower(h.Name)
		if ignoredSandboxHeaders[n] && !(n == "x-forwarded-proto" && h.Value != "http") {
			continue
		}
		out = append(out, hdr{n, tokenCase(n, h.Value)})
	}
	return sortedLines(out)
}

// clientHeaders is a sandbox's answer as the client got it, with whether it
// is dated but not the date, without nginx's own Server, X-Cube-Request-Id
// and X-Cube-Retcode (CubeProxy's, as the platform's proxy adds them; the
// lab's nginx is plain nginx),
// the framing fields (compared as framing) and an HTTP/1.1 answer's
// "Connection: keep-alive", which nginx adds and which says what HTTP/1.1
// implies (whether the connection stayed open is compared by itself).
func clientHeaders(r resp, v10 bool) []string {
	var out []hdr
	for _, h := range r.Headers {
		n := strings.ToLower(h.Name)
		switch n {
		case "x-cube-request-id", "x-cube-retcode", "content-length", "transfer-encoding":
			continue
		case "date":
			out = append(out, hdr{n, "(a date)"})
			continue
		case "server":
			if strings.HasPrefix(h.Value, "nginx/") {
				continue
			}
		case "connection":
			if !v10 && strings.EqualFold(h.Value, "keep-alive") {
				continue
			}
		}
		out = append(out, hdr{n, tokenCase(n, h.Value)})
	}
	return sortedLines(out)
}

// tokenCase lower-cases the value of a field whose tokens compare without
// case (nginx-platform.conf sends "Connection: upgrade", CubeProxy the
// client's "Upgrade").
func tokenCase(name, value string) string {
	if name == "connection" || name == "upgrade" {
		return strings.ToLower(value)
	}
	return value
}

func sortedLines(hs []hdr) []string {
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Name < hs[j].Name })
	lines := make([]string, len(hs))
	for i, h := range hs {
		lines[i] = h.Name + ": " + h.Value
	}
	return lines
}

// hdr is one header line as received.
type hdr struct {
	Name  string `json:"n"`
	Value string `json:"v"`
}

func (h hdr) MarshalJSON() ([]byte, error) { return json.Marshal(h.Name + ": " + h.Value) }

func getAll(hs []hdr, name string) []string {
	var v []string
	for _, h := range hs {
		if strings.EqualFold(h.Name, name) {
			v = append(v, h.Value)
		}
	}
	return v
}

func hasToken(hs []hdr, name, token string) bool {
	for _, v := range getAll(hs, name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
