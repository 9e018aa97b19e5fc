package main

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The README's Admin API table is the control plane's contract: each
// answer it shows ({"ok":true,"deleted":N} and the like) has exactly the
// keys the running proxy sends, and every error is {"error":"…"}. A key
// renamed or added on either side fails here.
func TestREADMEAdminAnswersMatch(t *testing.T) {
	shapes := readmeAdminShapes(t)
	dir := t.TempDir()
	routes := boxRoutes(t, dir, 9)
	r := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", routes,
		"--auth-signing-keys", "0123456789abcdef0123456789abcdef-docs"}, noEnv)
	admin := "http://" + r.a.adminLn.Addr().String()
	// A proxy whose store never answered: /readyz's 503. Its Redis address
	// is held refusing: a port merely free a moment ago could be bound by
	// another test's redis-server, which would answer (and say ready).
	unready := runServe(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--store", "redis", "--redis-addr", testenv.RefusingAddr(t)}, noEnv)
	unreadyAdmin := "http://" + unready.a.adminLn.Addr().String()

	for _, tc := range []struct {
		row    string // the endpoint cell of the README's row
		shape  int    // which {…} of the row's answer cell
		base   string
		method string
		path   string
		body   string
		status int
	}{
		{"`GET /admin/healthz`", 0, admin, "GET", "/admin/healthz", "", 200},
		{"`GET /readyz`", 0, admin, "GET", "/readyz", "", 200},
		{"`GET /readyz`", 1, unreadyAdmin, "GET", "/readyz", "", 503},
		{"`POST /admin/tokens` `{\"sandbox_id\",\"port\",\"ttl\"}`", 0, admin, "POST", "/admin/tokens", `{"sandbox_id":"box","port":9,"ttl":"1m"}`, 200},
		{"`GET /admin/routes[?limit=N][&after=<id>]`", 0, admin, "GET", "/admin/routes", "", 200},
		{"`GET/PUT/DELETE /admin/routes/<id>`", 0, admin, "PUT", "/admin/routes/two", `{"HostIP":"127.0.0.1","9":"9"}`, 200},
		{"`GET/PUT/DELETE /admin/routes/<id>`", 1, admin, "DELETE", "/admin/routes/two", "", 200},
		{"`POST /admin/backend_cache/delete` `{\"sandbox_id\"}`", 0, admin, "POST", "/admin/backend_cache/delete", `{"sandbox_id":"box"}`, 200},
		{"`POST /admin/meta/upsert` `{\"sandbox_id\",…fields}`", 0, admin, "POST", "/admin/meta/upsert", `{"sandbox_id":"three","HostIP":"127.0.0.1"}`, 200},
		{"`POST /admin/meta/delete` `{\"sandbox_id\"}`", 0, admin, "POST", "/admin/meta/delete", `{"sandbox_id":"three"}`, 200},
		{"`POST /admin/state` `{\"sandbox_id\",\"state\"}`", 0, admin, "POST", "/admin/state", `{"sandbox_id":"box","state":"running"}`, 200},
		{"`GET /admin/last_active?since=<ms>`", 0, admin, "GET", "/admin/last_active?since=0", "", 200},
	} {
		row, ok := shapes[tc.row]
		if !ok || tc.shape >= len(row) {
			t.Errorf("README's Admin API table: no answer %d in the row %s (rows: %v)", tc.shape, tc.row, slices.Sorted(maps.Keys(shapes)))
			continue
		}
		status, got := adminAnswerKeys(t, tc.method, tc.base+tc.path, tc.body)
		if status != tc.status || !slices.Equal(got, row[tc.shape]) {
			t.Errorf("%s %s: %d with keys %v; the README shows %v (want %d)", tc.method, tc.path, status, got, row[tc.shape], tc.status)
		}
	}
	// Errors: {"error":"…"} and nothing else.
	for _, e := range []struct {
		base, method, path, body string
		status                   int
	}{
		{admin, "POST", "/admin/state", `{"sandbox_id":"box","state":"frozen"}`, 400},
		{admin, "GET", "/admin/routes/nosuch", "", 404},
		{admin, "GET", "/admin/state", "", 405},
		// The route API is the memory store's: with Redis, 404.
		{unreadyAdmin, "GET", "/admin/routes", "", 404},
		{unreadyAdmin, "PUT", "/admin/routes/box", `{"HostIP":"127.0.0.1"}`, 404},
	} {
		if status, got := adminAnswerKeys(t, e.method, e.base+e.path, e.body); status != e.status || !slices.Equal(got, []string{"error"}) {
			t.Errorf("%s %s: %d with keys %v, want %d with the key error alone", e.method, e.path, status, got, e.status)
		}
	}
	// Past the admin listener's limits the answer comes before any
	// endpoint, in the traffic errors' shape (README).
	if status, got := adminAnswerKeys(t, "POST", admin+"/admin/state", strings.Repeat("x", 1<<20+1)); status != 413 || !slices.Equal(got, []string{"code", "error"}) {
		t.Errorf("admin body over 1 MiB: %d with keys %v, want 413 with code and error", status, got)
	}
	// The prose's other shapes: the 413 to an Expect head over the limit,
	// in place of the 100; the 403 of a loopback caller that is a web
	// page (Origin) when no token is configured; and the 503 of a change
	// whose invalidation could not be published (Redis refusing).
	for _, e := range []struct {
		name, base, path, body string
		hdr                    []string
		status                 int
		keys                   []string
	}{
		{"Expect head over 1 MiB", admin, "/admin/state", strings.Repeat("x", 1<<20+1), []string{"Expect", "100-continue"}, 413, []string{"code", "error"}},
		{"web page on loopback", admin, "/admin/state", `{"sandbox_id":"box","state":"running"}`, []string{"Origin", "http://evil.test"}, 403, []string{"error"}},
		{"invalidation not published", unreadyAdmin, "/admin/backend_cache/delete", `{"sandbox_id":"box"}`, nil, 503, []string{"code", "error"}},
	} {
		if status, got := adminAnswerKeys(t, "POST", e.base+e.path, e.body, e.hdr...); status != e.status || !slices.Equal(got, e.keys) {
			t.Errorf("%s: %d with keys %v, want %d with %v", e.name, status, got, e.status, e.keys)
		}
	}
}

// adminAnswerKeys calls the admin API, with the header lines hdr (name,
// value, ...), and returns the status and the answer's top-level JSON
// keys, sorted.
func adminAnswerKeys(t *testing.T, method, url, body string, hdr ...string) (int, []string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	// A connection each: a 413 lingers only on a connection's first request.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d %q: %v", method, url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, slices.Sorted(maps.Keys(out))
}

// readmeAdminShapes reads the README's Admin API table: for each row's
// endpoint cell, the top-level keys of each {…} code span in its answer
// cell, sorted.
func readmeAdminShapes(t *testing.T) map[string][][]string {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Admin API\n")
	if !ok {
		t.Fatal("README has no ## Admin API section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string][][]string{}
	for _, line := range strings.Split(section, "\n") {
		line = strings.ReplaceAll(line, `\|`, "/") // an escaped bar inside a cell
		cells := strings.Split(line, "|")
		if len(cells) != 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a row, or the header and separator rows
		}
		endpoint, answer := strings.TrimSpace(cells[1]), cells[2]
		for span := range strings.SplitSeq(answer, "`") {
			if strings.HasPrefix(span, "{") {
				out[endpoint] = append(out[endpoint], topKeys(span))
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no rows read from the README's Admin API table")
	}
	return out
}

// topKeys returns the keys of a README answer template such as
// {"now","since","count","entries":{"<id>":<ms>}}: the quoted names at
// the outer level that open an entry (after { or ,), sorted.
func topKeys(tmpl string) []string {
	var keys []string
	depth := 0
	for i := 0; i < len(tmpl); i++ {
		switch c := tmpl[i]; c {
		case '{':
			depth++
		case '}':
			depth--
		case '"':
			end := strings.IndexByte(tmpl[i+1:], '"')
			if end < 0 {
				return keys
			}
			if depth == 1 && i > 0 && (tmpl[i-1] == '{' || tmpl[i-1] == ',') {
				keys = append(keys, tmpl[i+1:i+1+end])
			}
			i += end + 1
		}
	}
	slices.Sort(keys)
	return keys
}
