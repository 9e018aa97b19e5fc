package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Ports are shared only when both processes ask for it: a proxy started
// by mistake next to a running one still fails on the port in use.
func TestReusePortNeedsBothSides(t *testing.T) {
	routes := boxRoutes(t, t.TempDir(), 9)
	for _, tc := range []struct {
		name          string
		first, second bool
		shared        bool
	}{
		{"both", true, true, true},
		{"only the first", true, false, false},
		{"only the second", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := runServe(t, reuseArgs(tc.first, "127.0.0.1:0", "127.0.0.1:0", routes, "first"), noEnv)
			args := reuseArgs(tc.second, first.a.httpLn.Addr().String(), first.a.adminLn.Addr().String(), routes, "second")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			started := false
			err := serve(ctx, args, noEnv, io.Discard, io.Discard, func(*app) { started = true; cancel() })
			if started != tc.shared {
				t.Fatalf("second proxy started: %v, want %v (serve: %v)", started, tc.shared, err)
			}
			if !tc.shared && (err == nil || !strings.Contains(err.Error(), "address already in use")) {
				t.Fatalf("serve = %v, want the port in use", err)
			}
		})
	}
}

// A new proxy started with reuse_port next to a running one shares its
// traffic and admin ports; once the old one has drained, the new one
// answers every new connection.
func TestReusePortTakeover(t *testing.T) {
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi from sandbox") })}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bln)
	defer backend.Close()
	port := bln.Addr().(*net.TCPAddr).Port
	routes := boxRoutes(t, t.TempDir(), port)

	old := runServe(t, reuseArgs(true, "127.0.0.1:0", "127.0.0.1:0", routes, "old"), noEnv)
	httpAddr, adminAddr := old.a.httpLn.Addr().String(), old.a.adminLn.Addr().String()
	runServe(t, reuseArgs(true, httpAddr, adminAddr, routes, "new"), noEnv)

	// Every connection below is new, so the kernel picks a listener for
	// each by its source port: both proxies are seen.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	seen := map[string]bool{}
	for i := 0; i < 200 && len(seen) < 2; i++ {
		seen[instanceAt(t, client, adminAddr)] = true
	}
	if !seen["old"] || !seen["new"] {
		t.Fatalf("instances answering on the shared admin port: %v, want old and new", seen)
	}

	old.stop() // SIGTERM's drain
	for i := range 50 {
		if id := instanceAt(t, client, adminAddr); id != "new" {
			t.Fatalf("connection %d after the drain answered by %q", i, id)
		}
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/", nil)
		req.Host = fmt.Sprintf("%d-box.cube.test", port)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d after the drain: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hi from sandbox" {
			t.Fatalf("request %d after the drain: %d %q", i, resp.StatusCode, body)
		}
	}
}

func reuseArgs(reuse bool, httpAddr, adminAddr, routes, instance string) []string {
	return []string{fmt.Sprintf("--reuse-port=%v", reuse), "--http-addr", httpAddr, "--admin-addr", adminAddr,
		"--routes", routes, "--instance-id", instance, "--drain-timeout", "2s", "--access-log-format", "off"}
}

// instanceAt asks the admin API behind addr which instance answered.
func instanceAt(t *testing.T, client *http.Client, addr string) string {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/admin/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		InstanceID string `json:"instance_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	return h.InstanceID
}
