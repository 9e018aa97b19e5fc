package proxy

import (
	"net/http"
	"testing"
	"time"
)

// Every answer carries the proxy's Date, as nginx dates every answer it
// relays (the sandbox's own Date is replaced, as nginx replaces it): an
// undated sandbox answer (a hand-written server's) would otherwise reach
// clients and caches undated, which RFC 9110 6.6.1 asks a proxy not to
// forward, and a micro-VM resumed from a snapshot may run on a stale clock.
// The differential lab (bench/differ, ans.server-date and every undated
// ans.* case) found it.
func TestAnswersCarryTheProxysDate(t *testing.T) {
	h := newHarness(t)
	bare := h.route("bare", rawBackend(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	stale := h.route("stale", rawBackend(t, "HTTP/1.1 200 OK\r\nDate: Tue, 01 Jan 2030 00:00:00 GMT\r\nContent-Length: 2\r\n\r\nok"))
	empty := h.route("empty", rawBackend(t, "HTTP/1.1 204 No Content\r\n\r\n"))
	chunked := h.route("chunked", rawBackend(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"))
	for _, tc := range []struct{ name, host string }{
		{"no Date", bare},
		{"sandbox's Date", stale},
		{"204", empty},
		{"chunked", chunked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now().Add(-time.Second).Truncate(time.Second)
			resp := h.do(h.req("GET", tc.host, "/", nil))
			resp.Body.Close()
			dates := resp.Header.Values("Date")
			if len(dates) != 1 {
				t.Fatalf("Date lines %q, want one", dates)
			}
			d, err := http.ParseTime(dates[0])
			if err != nil || d.Before(before) || d.After(time.Now()) {
				t.Errorf("Date %q (%v), want the time of the answer", dates[0], err)
			}
		})
	}
}
