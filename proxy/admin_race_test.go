package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// adminCall is one admin API call a test makes.
type adminCall struct{ method, path, body string }

// call makes c without the harness's t.Fatal, so that it can run outside
// the test's goroutine.
func (h *harness) call(c adminCall) (int, error) {
	r, err := http.NewRequest(c.method, "http://"+h.admin+c.path, strings.NewReader(c.body))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// Two admin changes of one sandbox made at once take effect one after the
// other, each whole. A change is a route store step and a sandbox state
// step; here the second change comes between the first one's two steps,
// and must wait for the first to finish. Interleaved, a DELETE forgot the
// pause set after a PUT that followed it had been answered (traffic went
// to a paused sandbox), a meta/delete killed the route a PUT had stored
// since (410 for an hour after the PUT's 200), and a PUT lifted the kill
// of a meta/delete that had removed its route (404, not 410).
func TestAdminChangesOfOneSandboxDoNotInterleave(t *testing.T) {
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	put := adminCall{"PUT", "/admin/routes/rc", `{"HostIP":"127.0.0.1","80":"` + itoa(port) + `"}`}
	for _, tc := range []struct {
		name   string
		first  adminCall
		then   []adminCall // made between first's two steps, one after the other
		route  bool        // whether the route exists after both
		status int         // of a request to the sandbox after both
	}{
		{"DELETE, then PUT and pause", adminCall{"DELETE", "/admin/routes/rc", ""},
			[]adminCall{put, {"POST", "/admin/state", `{"sandbox_id":"rc","state":"paused"}`}}, true, 503},
		{"meta/delete, then PUT", adminCall{"POST", "/admin/meta/delete", `{"sandbox_id":"rc"}`},
			[]adminCall{put}, true, 200},
		{"PUT, then meta/delete", put,
			[]adminCall{{"POST", "/admin/meta/delete", `{"sandbox_id":"rc"}`}}, false, 410},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.put("rc", map[string]string{"HostIP": "127.0.0.1", "80": itoa(port)})
			var fired atomic.Bool
			done := make(chan struct{})
			h.adm.afterStoreChange = func(id string) {
				if id != "rc" || !fired.CompareAndSwap(false, true) {
					return
				}
				go func() {
					defer close(done)
					for _, c := range tc.then {
						if st, err := h.call(c); err != nil || st != 200 {
							t.Errorf("%s %s: %d %v", c.method, c.path, st, err)
						}
					}
				}()
				// Until the calls are done, or the next one waits for
				// this change to finish.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					select {
					case <-done:
						return
					default:
					}
					if h.adm.locks.waiting(id) > 1 {
						return
					}
					if time.Now().After(deadline) {
						t.Error("the calls neither finished nor waited")
						return
					}
				}
			}
			if st, err := h.call(tc.first); err != nil || st != 200 {
				t.Fatalf("%s %s: %d %v", tc.first.method, tc.first.path, st, err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the calls made during the first did not finish")
			}
			if _, ok := h.store.Get("rc"); ok != tc.route {
				t.Errorf("route stored: %v, want %v", ok, tc.route)
			}
			if code, body, _ := h.get("80-rc.cube.test", "/"); code != tc.status {
				t.Errorf("request after both: %d %s, want %d", code, body, tc.status)
			}
			if n := h.adm.locks.waiting("rc"); n != 0 {
				t.Errorf("the sandbox's lock is still counted %d times after every change ended", n)
			}
		})
	}
}
