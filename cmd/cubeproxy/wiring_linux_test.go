package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// upstream.connect_timeout reaches the proxy: a sandbox that never
// accepts is a 504 after the connect and its one retry, each bounded by
// the configured 200 ms, not by the 3 s default (6 s in all).
func TestServeWiresConnectTimeout(t *testing.T) {
	port := testenv.FrozenListener(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, fmt.Appendf(nil, "routes:\n  frozen:\n    HostIP: \"127.0.0.1\"\n    \"80\": \"%d\"\n", port), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--drain-timeout", "1s", "--upstream-connect-timeout", "200ms"}, noEnv)
	req, err := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "80-frozen.cube.test"
	start := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != 504 || !strings.Contains(string(body), "upstream_connect_timeout") {
		t.Fatalf("frozen sandbox: %d %s, want 504 upstream_connect_timeout", resp.StatusCode, body)
	}
	// Half the default's 6 s: far from both the configured 400 ms and
	// what an unwired setting would take.
	if took >= 3*time.Second {
		t.Errorf("504 after %v: the 200 ms connect timeout was not applied", took)
	}
}
