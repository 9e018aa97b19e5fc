package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/sandbox"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// Demo sandbox: id, ports and the MCP gateway's bearer token.
const (
	demoID      = "demo"
	demoMCPPort = 50005
	demoSSEPort = 3000
	demoToken   = "demo-mcp-token"
	demoDomain  = "cube.localhost" // unless domains is set
)

// demo runs the proxy (memory store) plus a local demo sandbox: the MCP
// gateway on one port and an SSE ticker on another, registers their route
// and prints curl commands that go through the proxy.
func demo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := config.LoadCommandContext(ctx, "cubeproxy demo", shownDefaults(), args, getenv, stderr)
	if stoppedLoading(ctx, "cubeproxy demo", err, stderr) {
		return nil
	}
	if err != nil {
		return err
	}
	// Checked before anything starts: build would open listeners (and
	// Redis) that these returns would leave behind.
	switch {
	case cfg.Store != "memory" && cfg.Store != "":
		return errors.New("demo needs store: memory (its route goes into the embedded store)")
	case cfg.HTTPAddr == "":
		return errors.New("demo needs http_addr: its curl commands go through the plain HTTP listener")
	case cfg.PersistRoutes:
		// The demo's route names ports that close with it: written into
		// the routes file, it would outlive the demo and send a later
		// serve's requests to whatever listens there then.
		return fmt.Errorf("demo needs persist_routes off: its route would be written into %s and outlive the demo", cfg.Routes)
	}
	mcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sseLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", sandbox.MCPHandler(sandbox.MCPOptions{Token: demoToken}))
	mcpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	sseSrv := &http.Server{Handler: sandbox.TickerHandler(time.Second, 0), ReadHeaderTimeout: 10 * time.Second}
	go mcpSrv.Serve(mcpLn)
	go sseSrv.Serve(sseLn)
	defer mcpSrv.Close()
	defer sseSrv.Close()

	// The route names the node (127.0.0.1) and the host ports the demo
	// backends got, as a control plane would for a real sandbox.
	r, err := routing.ParseRouteStrict(demoID, map[string]string{
		routing.FieldHostIP:       "127.0.0.1",
		routing.FieldSandboxIP:    "127.0.0.1",
		routing.FieldCreatedAt:    strconv.FormatInt(time.Now().UnixNano(), 10),
		strconv.Itoa(demoMCPPort): portOf(mcpLn.Addr()),
		strconv.Itoa(demoSSEPort): portOf(sseLn.Addr()),
	})
	if err != nil {
		return err
	}
	a, err := build(ctx, cfg, stderr, stdout)
	if errors.Is(err, errStoppedStarting) {
		return nil
	}
	if err != nil {
		return cfg.NameOrigins(err)
	}
	warnUnknownEnv(a.log, os.Environ())
	if err := a.routes.Put(r); err != nil {
		a.close()
		return err
	}
	domain := demoDomain
	if len(cfg.Domains) > 0 {
		// A host under any other domain would be refused (400
		// domain_not_allowed) by the very proxy the commands go through.
		domain = domainOfHosts(cfg.Domains[0])
	}
	return a.run(ctx, func(a *app) { printDemo(stdout, a, domain, cfg.AdminToken != "") })
}

// domainOfHosts is the domain sandbox host names go under for a domains
// entry, which may be written "*.cube.app" or ".cube.app": a URL built on
// the entry as written ("8080-box.*.cube.app") reaches nothing.
func domainOfHosts(entry string) string {
	return strings.TrimPrefix(strings.TrimPrefix(entry, "*."), ".")
}

func portOf(addr net.Addr) string { return strconv.Itoa(addr.(*net.TCPAddr).Port) }

// dialable is where a local curl reaches a listener: its own address,
// or loopback when it listens on every interface.
func dialable(addr net.Addr) string {
	tcp := addr.(*net.TCPAddr)
	if tcp.IP.IsUnspecified() {
		return "127.0.0.1:" + strconv.Itoa(tcp.Port)
	}
	return tcp.String()
}

// printDemo writes the copy-paste commands for sandbox hosts under domain.
// With an admin token configured the admin command sends it, named by its
// environment variable rather than printed: the token is a secret.
func printDemo(w io.Writer, a *app, domain string, adminToken bool) {
	px := dialable(a.httpLn.Addr())
	admin := dialable(a.adminLn.Addr())
	mcpHost := fmt.Sprintf("%d-%s.%s", demoMCPPort, demoID, domain)
	sseHost := fmt.Sprintf("%d-%s.%s", demoSSEPort, demoID, domain)
	adminHeader, adminNote := "", ""
	if adminToken {
		// The variable is in this shell only when the demo was started
		// from it with the token exported; a token given by flag or file
		// (or from another terminal) is not, and the command got a 403.
		adminHeader = ` -H "X-Cube-Admin-Token: $` + config.EnvPrefix + `ADMIN_TOKEN"`
		adminNote = "\n# (sends $" + config.EnvPrefix + "ADMIN_TOKEN: in this shell, export " + config.EnvPrefix + "ADMIN_TOKEN=<the demo's admin_token> first)"
	}
	fmt.Fprintf(w, `
CubeProxy demo is running. Proxy: http://%[1]s  Admin: http://%[2]s
Sandbox %[3]q exposes an MCP gateway (port %[4]d, bearer token %[5]q) and an SSE ticker (port %[6]d).
Copy-paste these (clients without DNS send the sandbox hostname in the Host header):

# 1. SSE: one event per second, streamed as it happens (Ctrl-C to stop)
curl -N http://%[1]s/events -H 'Host: %[7]s'

# 2. MCP: initialize, keep the session id
SID=$(curl -s -D - -o /dev/null http://%[1]s/mcp -H 'Host: %[8]s' \
  -H 'Authorization: Bearer %[5]s' -H 'Content-Type: application/json' \
  -H 'Accept: application/json, text/event-stream' \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}' \
  | awk 'tolower($1)=="mcp-session-id:"{print $2}' | tr -d '\r'); echo "session: $SID"
curl -s http://%[1]s/mcp -H 'Host: %[8]s' -H 'Authorization: Bearer %[5]s' \
  -H "Mcp-Session-Id: $SID" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  -d '{"jsonrpc":"2.0","method":"notifications/initialized"}'

# 3. MCP tools/call: progress notifications stream in before the result
curl -N http://%[1]s/mcp -H 'Host: %[8]s' -H 'Authorization: Bearer %[5]s' \
  -H "Mcp-Session-Id: $SID" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  -d '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"count","arguments":{"n":5},"_meta":{"progressToken":"p1"}}}'

# 4. Without the bearer token the gateway's own 401 comes back through the proxy
curl -i http://%[1]s/mcp -H 'Host: %[8]s' -H 'Content-Type: application/json' -d '{}'

# 5. Unknown sandbox: the proxy's 404 JSON
curl -i http://%[1]s/ -H 'Host: 50005-nosuch.%[9]s'

# 6. Routes through the admin API%[11]s
curl -s http://%[2]s/admin/routes%[10]s

`, px, admin, demoID, demoMCPPort, demoToken, demoSSEPort, sseHost, mcpHost, domain, adminHeader, adminNote)
}
