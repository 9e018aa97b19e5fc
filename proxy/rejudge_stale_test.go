package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// A re-read's answer is the route as the store had it when the re-read
// read it. The re-read a kill's invalidation starts reads "no route"; on a
// loaded machine it judged only after the route was stored again and a
// WebSocket had been let through on the new route, and cut that WebSocket
// (502 route_changed) for a deletion that came before it. So the leak
// test's "WebSocket, sandbox killed before its 101" answered 502, not
// 410, once in a full -race run: the previous repetition's kill re-read
// cut the next repetition's upgrade before the kill it was waiting for.
// An exchange that read its route after the re-read began is judged by
// the next re-read, or by its own look at the checkout (judgeLate).
func TestStaleRereadSparesAnExchangeLetThroughAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill bool // the sandbox is killed after the re-read judged; else it answers 101
		want int
		code string
	}{
		{"the sandbox answers its upgrade", false, 101, ""},
		{"the sandbox is killed before its 101", true, 410, CodeSandboxKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const id = "stale"
			port, arrived := silentBackend(t)
			h := newHarness(t, func(o *harnessOpts) {
				// The janitor's look (rejudgeOpen) comes each 30 s: every
				// judgement below is the re-reads'.
				o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute
			})
			host := h.route(id, port)

			// A request of the sandbox in flight across the kill, held
			// before its pool lookup (the kill cuts no connection of its):
			// the kill's invalidation then starts a re-read.
			var held atomic.Bool
			holding, letGo := make(chan struct{}), make(chan struct{})
			h.proxy.beforePool = func() {
				if held.CompareAndSwap(false, true) {
					close(holding)
					<-letGo
				}
			}
			first := h.goStatus(h.req("GET", host, "/", nil))
			wait(t, holding, "the first request at its pool lookup")

			// The re-read waits once it has read "no route", before it
			// judges.
			var judging atomic.Bool
			entered, judge := make(chan struct{}), make(chan struct{})
			release := sync.OnceFunc(func() { close(judge) })
			t.Cleanup(release) // before Shutdown's wait for the re-read
			h.proxy.beforeRejudge = func(string) {
				if judging.CompareAndSwap(false, true) {
					close(entered)
					<-judge
				}
			}
			if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"`+id+`"}`, ""); st != 200 {
				t.Fatalf("kill: %d %s", st, body)
			}
			wait(t, entered, "the kill's re-read")
			close(letGo)
			if st := <-first; st != 410 {
				t.Fatalf("request across the kill: %d, want 410", st)
			}

			// The sandbox stored again, and an upgrade let through on
			// its new route, while the re-read still holds "no route".
			route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
			if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
				t.Fatalf("store the route again: %d %s", st, body)
			}
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\n"+leakUpgrade+"\r\n"); err != nil {
				t.Fatal(err)
			}
			var sc net.Conn
			select {
			case sc = <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the upgrade did not reach the sandbox")
			}
			release()
			rereadsDone(t, h, id)

			if tc.kill {
				if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"`+id+`"}`, ""); st != 200 {
					t.Fatalf("kill: %d %s", st, body)
				}
			} else if _, err := io.WriteString(sc, ws101); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
			if err != nil {
				t.Fatal(err)
			}
			body := ""
			if resp.StatusCode != 101 {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
				body = string(b)
			}
			if resp.StatusCode != tc.want || !strings.Contains(body, tc.code) {
				t.Fatalf("upgrade let through on the route stored again: %d %s, want %d %s", resp.StatusCode, body, tc.want, tc.code)
			}
		})
	}
}

// wait waits for ch to close.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("waiting for %s: 10 s", what)
	}
}

// A kill through the admin API (meta/delete, the memory store) removed the
// route before it killed: a look at the route in between (the janitor's,
// once the cached route's TTL was over) found it gone and cut what the
// sandbox had open 502 route_changed, before the kill came to mark it
// 410 sandbox_killed. The kill comes first now: what it has open is the
// kill's.
func TestKillsOwnRouteRemovalIsNoRouteChange(t *testing.T) {
	for _, tc := range []struct {
		name string
		head string
	}{
		{"WebSocket before its 101", "GET /ws HTTP/1.1\r\nHost: %s\r\n" + leakUpgrade + "\r\n"},
		{"request waiting for its answer", "GET / HTTP/1.1\r\nHost: %s\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const id = "killrm"
			port, arrived := silentBackend(t)
			// The cache's clock moves where the test moves it.
			var now atomic.Int64
			now.Store(time.Now().UnixNano())
			h := newHarness(t, func(o *harnessOpts) {
				o.cache.Now = func() time.Time { return time.Unix(0, now.Load()) }
				// The janitor's own look comes each 30 s: the one below
				// is the test's.
				o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute
			})
			host := h.route(id, port)
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, strings.Replace(tc.head, "%s", host, 1)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the request did not reach the sandbox")
			}
			answered := make(chan string, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
				if err != nil {
					answered <- err.Error()
					return
				}
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
				answered <- fmt.Sprint(resp.StatusCode, " ", string(b))
			}()
			now.Add(int64(routing.DefaultTTLMax + time.Second)) // the cached route's TTL over
			// A janitor round between the kill's two steps, the answer
			// given before the second.
			var fired atomic.Bool
			h.adm.afterStoreChange = func(string) {
				if fired.CompareAndSwap(false, true) {
					h.proxy.rejudgeOpen(context.Background(), make(chan struct{}))
					select {
					case a := <-answered:
						answered <- a // for the test's check below
					case <-time.After(300 * time.Millisecond):
						// Not cut by the round: answered once killed.
					}
				}
			}
			if st, body := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"`+id+`"}`, ""); st != 200 {
				t.Fatalf("kill: %d %s", st, body)
			}
			if !fired.Load() {
				t.Fatal("the kill made no store change: the case tests nothing")
			}
			got := <-answered
			if !strings.HasPrefix(got, "410 ") || !strings.Contains(got, CodeSandboxKilled) {
				t.Fatalf("answer across the kill: %s, want 410 %s", got, CodeSandboxKilled)
			}
		})
	}
}

// silentBackend is a sandbox that answers nothing: it hands each request's
// connection, its head read, to the test through arrived.
func silentBackend(t *testing.T) (uint16, chan net.Conn) {
	arrived := make(chan net.Conn, 4)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		arrived <- c
	}))
	return port, arrived
}
