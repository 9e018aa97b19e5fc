package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// Spans the collector did not take at shutdown are said to be lost. The
// export warnings are throttled (one a kind per 10 s): a collector that
// failed an export shortly before, as a down one does, had its failure at
// shutdown, the last spans of the process, suppressed, and nothing said
// that they were gone.
func TestShutdownSaysSpansWereLost(t *testing.T) {
	// Parallel: the settings go to the child's environment, not this
	// process's, and it waits on that child.
	t.Parallel()
	bin := buildBinary(t)
	port := sandboxServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	routes := boxRoutes(t, t.TempDir(), port)
	collector := testenv.RefusingAddr(t)
	env := []string{
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + collector,
		// A request to the sandbox (a server and a client span) fills a
		// batch, exported at once; a 404 (one span) waits for shutdown.
		"OTEL_BSP_MAX_EXPORT_BATCH_SIZE=2",
		"OTEL_BSP_SCHEDULE_DELAY=600000",
	}
	cmd, logs, exited := startBinaryEnv(t, bin, env, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--routes", routes, "--access-log-format", "off")
	traffic, _ := waitListening(t, logs, exited)
	get := func(host string, want int) {
		req, _ := http.NewRequest("GET", "http://"+traffic+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	get(fmt.Sprintf("%d-box.cube.test", port), 200)
	testenv.WaitFor(t, 10*time.Second, "the failed export's warning", func() bool {
		return strings.Contains(logs.String(), `"msg":"traces export:`)
	})
	get("8080-nosuchbox.cube.test", 404)
	sigtermAndWait(t, cmd, exited, logs)
	var warned bool
	for _, line := range strings.Split(logs.String(), "\n") {
		warned = warned || strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "spans may be lost")
	}
	if !warned {
		t.Errorf("no warning that the spans left at shutdown were lost:\n%s", logs)
	}
}
