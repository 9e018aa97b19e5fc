package proxy

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// GET /admin/routes without a limit answers the whole table. It went
// through a map of every route's fields and encoding/json (reflection, a
// sort of every id, the encoder's buffer grown by doubling and copied
// twice more): at 100k routes one listing of the 12 MB answer took
// ≈ 150 MB of the proxy's RSS and a second of CPU, and three at once
// carried a proxy of 80 MB steady to 670 MB: 11 bytes allocated for each
// byte of the answer. The answer is written directly now, and the JSON is
// the same, byte for byte; what it allocates is the answer and each
// route's Fields map (≈ 5.7 bytes a byte).
func TestAdminRoutesListingAtScale(t *testing.T) {
	h := newHarness(t)
	a := NewAdmin(AdminConfig{Routes: h.store}, h.proxy)
	const n = 20000
	for i := range n {
		fields := map[string]string{
			"HostIP": "10.0.0.5", "SandboxIP": "192.168.0.7", "CreatedAt": "1764460000000000000",
			"3000": "30001", "50005": "30002", "8080": "30003",
		}
		if i%2 == 0 {
			fields["AllowPublicTraffic"] = "false"
			fields["TrafficAccessToken"] = fmt.Sprintf("%064x", i)
		}
		r, err := routing.ParseRouteStrict("sbx-"+strconv.Itoa(i), fields)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, query := range []string{"", "?limit=3&after=sbx-5"} {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/admin/routes" + query)
		a.listRoutes(&ctx) // warm
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ctx.Response.Reset()
		a.listRoutes(&ctx)
		runtime.ReadMemStats(&after)
		body := ctx.Response.Body()
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("GET /admin/routes%s: %d %s", query, ctx.Response.StatusCode(), body)
		}
		// What encoding/json writes for the same answer.
		page, more := h.store.Page(string(ctx.QueryArgs().Peek("after")), func() int {
			l, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("limit")))
			return l
		}())
		want := map[string]any{"count": len(page)}
		routes := make(map[string]map[string]string, len(page))
		for _, r := range page {
			routes[r.ID] = r.Fields()
		}
		want["routes"] = routes
		if more {
			want["next"] = page[len(page)-1].ID
		}
		wantBody, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != string(wantBody)+"\n" {
			t.Fatalf("GET /admin/routes%s: answer differs from encoding/json's:\n got %.300s\nwant %.300s", query, body, wantBody)
		}
		if query != "" {
			continue
		}
		allocated := after.TotalAlloc - before.TotalAlloc
		if allocated > uint64(7*len(body)) {
			t.Errorf("listing %d routes (%d bytes): allocated %d bytes (%.1f a byte), want at most 7 a byte", n, len(body), allocated, float64(allocated)/float64(len(body)))
		}
	}
}
