package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// An exchange a route change cut stays listed in its pool until its
// goroutine ends it. A second change in between (here the route deleted
// after its token was rotated) judged it again: it was counted twice in
// the "route change cut open exchanges" lines, and the second cause
// replaced the first, so that a request the rotation cut got 502
// route_changed instead of 403 credential_revoked, and a WebSocket was
// logged route_changed; a kill in between made them 410 sandbox_killed.
// The first cut says why it ended, and counts once.
func TestRouteChangeCutIsNotCutAgain(t *testing.T) {
	const id, host = "rc", "8080-rc.cube.test"
	for _, tc := range []struct {
		name string
		ws   bool // a WebSocket past its 101; else a request waiting for its answer
		kill bool // the second change is a kill (meta/delete); else the route's deletion
	}{
		{"request waiting for its answer, route deleted", false, false},
		{"WebSocket, route deleted", true, false},
		{"request waiting for its answer, sandbox killed", false, true},
		{"WebSocket, sandbox killed", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plog := new(testenv.LogBuffer)
			h, access := logHarness(t, "json", func(o *harnessOpts) {
				o.cfg.Logger = slog.New(slog.NewJSONHandler(plog, nil))
				// The janitor's look comes each 30 s: every judgement
				// below is the changes' own.
				o.cfg.UpstreamIdleConnTimeout = 2 * time.Minute
			})
			// The cut exchange is held as it begins to end, still listed.
			var held atomic.Bool
			holding, letGo := make(chan struct{}), make(chan struct{})
			release := sync.OnceFunc(func() { close(letGo) })
			t.Cleanup(release) // before the harness's shutdown waits for it
			h.proxy.beforeCutEnd = func() {
				if held.CompareAndSwap(false, true) {
					close(holding)
					<-letGo
				}
			}

			var answered chan string
			if tc.ws {
				b := newRJBackend(t)
				putRJ(t, h, id, rjFields(b.port, "1", rjTokenA, ""))
				ws := dialRJ(t, h, host, "WebSocket", rjCreds{token: rjTokenA})
				putRJ(t, h, id, rjFields(b.port, "1", rjTokenB, ""))
				wait(t, holding, "the tunnel the rotation cut")
				defer wsCut(t, ws, "WebSocket")
			} else {
				port, arrived := silentBackend(t)
				putRJ(t, h, id, rjFields(port, "1", rjTokenA, ""))
				answered = make(chan string, 1)
				go func() {
					req := h.req("GET", host, "/", nil)
					req.Header.Set(auth.HeaderE2BTrafficToken, rjTokenA)
					resp, err := h.client.Do(req)
					if err != nil {
						answered <- err.Error()
						return
					}
					defer resp.Body.Close()
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
					answered <- fmt.Sprint(resp.StatusCode, " ", string(body))
				}()
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the request did not reach the sandbox")
				}
				putRJ(t, h, id, rjFields(port, "1", rjTokenB, ""))
				wait(t, holding, "the request the rotation cut")
			}
			// The second change, judged while the first cut is listed.
			if tc.kill {
				if st, out := h.adminDo("POST", "/admin/meta/delete", `{"sandbox_id":"`+id+`"}`, ""); st != 200 {
					t.Fatalf("kill: %d %s", st, out)
				}
			} else if st, out := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 {
				t.Fatalf("DELETE route: %d %s", st, out)
			}
			rereadsDone(t, h, id)
			release()

			if !tc.ws {
				got := <-answered
				if !strings.HasPrefix(got, "403 ") || !strings.Contains(got, CodeCredentialRevoked) {
					t.Errorf("request cut by the rotation, then the route deleted: %s, want 403 %s", got, CodeCredentialRevoked)
				}
			}
			testenv.WaitFor(t, 10*time.Second, "the access log line of the cut exchange", func() bool {
				return strings.Contains(access.String(), `"error_code":"`)
			})
			if s := access.String(); !strings.Contains(s, `"error_code":"`+CodeCredentialRevoked+`"`) || strings.Contains(s, CodeRouteChanged) || strings.Contains(s, CodeSandboxKilled) {
				t.Errorf("access log, want the cut logged %s only:\n%s", CodeCredentialRevoked, s)
			}
			if n := cutCount(t, plog.String()); n != 1 {
				t.Errorf("exchanges counted in the route change cut lines: %d, want 1:\n%s", n, plog.String())
			}
		})
	}
}

// cutCount sums the exchanges of the "route change cut open exchanges"
// lines of a JSON process log.
func cutCount(t *testing.T, log string) int {
	t.Helper()
	n := 0
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var l struct {
			Msg       string `json:"msg"`
			Exchanges int    `json:"exchanges"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("process log line %q: %v", sc.Text(), err)
		}
		if l.Msg == "route change cut open exchanges" {
			n += l.Exchanges
		}
	}
	return n
}
