package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// After an answer of more than keptHeadLines header lines, or a request
// of as many, the proxy gives the request and the response fresh headers
// (headDrop); the exchanges that follow on the same keep-alive connection
// still carry what every answer does (Date, the request id, no
// Content-Type the sandbox did not send) and only their own lines, and the
// sandbox gets only each request's own lines.
func TestAnswersAfterAManyLineAnswer(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/many":
			w.Header()["A"] = slices.Repeat([]string{"b"}, 2500)
		case "/plain":
			w.Header().Set("X-Own", "1")
		}
		w.Header().Set("X-Got-B", fmt.Sprint(len(r.Header["B"])))
		w.Header()["Content-Type"] = nil // none: the proxy must not add one
		io.WriteString(w, "ok")
	}))
	putAuthRoute(h, "lines", "", port, 3000)
	c := dialRaw(t, h.addr)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i, step := range []struct {
		path  string
		lines int // extra request lines "B: c"
	}{{"/plain", 0}, {"/many", 0}, {"/plain", 0}, {"/plain", 200}, {"/plain", 0}, {"/many", 300}, {"/many", 0}, {"/plain", 0}} {
		path := step.path
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 3000-lines.cube.test\r\nX-Cube-Request-Id: headdrop-%d\r\n%s\r\n", path, i, strings.Repeat("B: c\r\n", step.lines))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%d %s: %v", i, path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantA, wantOwn := 0, ""
		if path == "/many" {
			wantA = 2500
		} else {
			wantOwn = "1"
		}
		if resp.StatusCode != 200 || string(body) != "ok" || len(resp.Header["A"]) != wantA || resp.Header.Get("X-Own") != wantOwn ||
			resp.Header.Get("Date") == "" || resp.Header.Get(HeaderRequestID) != fmt.Sprintf("headdrop-%d", i) || resp.Header["Content-Type"] != nil || resp.Close ||
			resp.Header.Get("X-Got-B") != fmt.Sprint(step.lines) {
			t.Errorf("%d %s: %d %q, %d A lines (want %d), X-Own %q (want %q), Date %q, id %q, Content-Type %q, close %v, sandbox got %s B lines (want %d)",
				i, path, resp.StatusCode, body, len(resp.Header["A"]), wantA, resp.Header.Get("X-Own"), wantOwn,
				resp.Header.Get("Date"), resp.Header.Get(HeaderRequestID), resp.Header["Content-Type"], resp.Close, resp.Header.Get("X-Got-B"), step.lines)
		}
	}
}
