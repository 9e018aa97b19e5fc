package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// With shared ports (reuse_port) the next process serves the admin API
// from the drain's start, and it never sees this one's table: a change
// that still reached the draining process (its request under way at the
// SIGTERM, on a connection the listener's close did not end) was answered
// 200 and lost (drilled: admin writes every few milliseconds over a
// takeover, three acknowledged by the old process after its drain began).
// Such a change is refused 503 draining with Connection: close, so that
// its client sends it again, to the next process; reads are answered.
func TestSharedPortsDrainRefusesAdminChanges(t *testing.T) {
	h := newHarness(t, func(o *harnessOpts) {
		o.srv.DrainTimeout = 30 * time.Second
		o.srv.SharedPorts = true
	})
	h.route("kept", 9)
	const fields = `"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","3000":"9"`
	rows := []struct {
		method, path, body string
		status             int
	}{
		{"PUT", "/admin/routes/added", "{" + fields + "}", 503},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"upserted",` + fields + "}", 503},
		{"POST", "/admin/state", `{"sandbox_id":"kept","state":"paused"}`, 503},
		{"GET", "/admin/routes/kept", "x", 200},
	}
	// Each request's head is sent, and its 100 read, before the drain
	// begins, and its body after: the handler runs during the drain. The
	// 100 says the server holds the request; a head it had yet to read
	// (a loaded machine) was on a connection the drain closes as idle.
	conns := make([]net.Conn, len(rows))
	readers := make([]*bufio.Reader, len(rows))
	for i, r := range rows {
		c, err := net.DialTimeout("tcp", h.admin, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		write(t, c, fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", r.method, r.path, len(r.body)))
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("%s %s: %q %v, want a 100 before the drain", r.method, r.path, line, err)
		}
		if blank, err := br.ReadString('\n'); err != nil || blank != "\r\n" {
			t.Fatalf("%s %s: %q %v after the 100, want its blank line", r.method, r.path, blank, err)
		}
		conns[i], readers[i] = c, br
	}
	unblock, held := holdDrain(t, h, "handover")
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- h.server.Shutdown(context.Background()) }()
	testenv.WaitFor(t, 10*time.Second, "the drain began", h.server.draining.Load)
	for i, r := range rows {
		c := conns[i]
		write(t, c, r.body)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(readers[i], nil)
		if err != nil {
			t.Fatalf("%s %s during the drain: %v", r.method, r.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != r.status {
			t.Errorf("%s %s during the drain: %d %s, want %d", r.method, r.path, resp.StatusCode, body, r.status)
		}
		if r.status == 503 && (!resp.Close || !strings.Contains(string(body), `"code":"draining"`)) {
			t.Errorf("%s %s during the drain: close %v, body %s; want Connection: close and code draining", r.method, r.path, resp.Close, body)
		}
	}
	if _, ok := h.store.Get("added"); ok {
		t.Error("the refused PUT stored its route")
	}
	if _, ok := h.store.Get("upserted"); ok {
		t.Error("the refused meta/upsert stored its route")
	}
	unblock()
	<-held
	drainEnds(t, shutdownDone, 40*time.Second, "the drain outlived its deadline")
}

// write sends s on c, within a bound.
func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}
