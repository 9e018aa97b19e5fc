package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// A body with more than one bad member is refused naming the same one
// every time, the first by name, as routing.ParseRoute names the
// smallest bad route field. The admin API read the members in Go's map
// order, which is random: the same PUT, meta/upsert or /admin/tokens
// body was answered "field HostIP must be a string" one time and "field
// 3000 must be a string" the next, so a control plane's logged errors and
// an operator's retried curl disagreed about what was wrong.
func TestAdminBodyErrorsNameTheSameMemberEveryTime(t *testing.T) {
	h := newHarness(t)
	ln := listen(t, "127.0.0.1:0")
	srv := &fasthttp.Server{Handler: NewAdmin(AdminConfig{Routes: h.store, Signer: testSigner(t)}, h.proxy).Handler}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	for _, tc := range []struct {
		method, path, body string
		want               string // the whole error
	}{
		{"PUT", "/admin/routes/box", `{"HostIP":1,"3000":2,"SandboxIP":true}`,
			"field 3000 must be a string"},
		{"POST", "/admin/meta/upsert", `{"sandbox_id":"box","HostIP":null,"3000":[1],"SandboxIP":{}}`,
			"field 3000 must be a string, number or boolean"},
		{"POST", "/admin/tokens", `{"ttl":3,"sandbox_id":1,"port":"x","foo":1}`,
			`invalid JSON body: unknown field "foo"`},
		{"POST", "/admin/tokens", `{"ttl":3,"sandbox_id":1,"port":"x"}`,
			`invalid JSON body: field "port" has the wrong type`},
	} {
		// Map order differs from one iteration to the next: 40 answers
		// to one body all agree only when the order is fixed (by chance,
		// for three members, once in 3^39).
		got := map[string]int{}
		for range 40 {
			req, err := http.NewRequest(tc.method, "http://"+ln.Addr().String()+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var out struct {
				Error string `json:"error"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 400 {
				t.Fatalf("%s %s %s: %d %q (%v), want 400", tc.method, tc.path, tc.body, resp.StatusCode, out.Error, err)
			}
			got[out.Error]++
		}
		if len(got) != 1 || got[tc.want] != 40 {
			t.Errorf("%s %s %s: 40 answers said %v, want %q each time", tc.method, tc.path, tc.body, got, tc.want)
		}
	}
}
