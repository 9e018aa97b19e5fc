package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// streamlessCases are bodies and whether they are JSON-RPC notifications
// and responses only, as a Streamable HTTP MCP server answers with 202.
var streamlessCases = []struct {
	name string
	body string
	want bool
}{
	{"cancellation", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"context canceled"}}`, true},
	{"initialized", `{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`, true},
	{"elicitation answer", `{"jsonrpc":"2.0","id":1,"result":{"action":"accept","content":{"v":"blue"}}}`, true},
	{"error answer", `{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"no"}}`, true},
	{"answer with a null id", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}`, true},
	{"whitespace around", " \r\n\t{ \"jsonrpc\" : \"2.0\" , \"method\" : \"n\" }\n", true},
	{"batch of notifications and answers", `[{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":2,"result":{}}]`, true},
	{"id nested in params only", `{"jsonrpc":"2.0","method":"n","params":{"id":1,"method":"m"}}`, true},

	{"request", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`, false},
	{"request with a null id", `{"jsonrpc":"2.0","id":null,"method":"tools/call"}`, false},
	{"request, id in another case", `{"jsonrpc":"2.0","ID":1,"method":"tools/call"}`, false},
	{"request, method in another case", `{"jsonrpc":"2.0","id":1,"Method":"tools/call"}`, false},
	{"request, escaped key", `{"jsonrpc":"2.0","\u0069d":1,"method":"tools/call"}`, false},
	{"batch with a request", `[{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`, false},
	{"neither method nor id", `{"jsonrpc":"2.0","result":{}}`, false},
	{"no version", `{"method":"notifications/cancelled"}`, false},
	{"other version", `{"jsonrpc":"1.0","method":"n"}`, false},
	{"version in another case", `{"JSONRPC":"2.0","method":"n"}`, false},
	{"empty batch", `[]`, false},
	{"nested batch", `[[{"jsonrpc":"2.0","method":"n"}]]`, false},
	{"batch of a string", `["x"]`, false},
	{"truncated", `{"jsonrpc":"2.0","method":"n"`, false},
	{"trailing bytes", `{"jsonrpc":"2.0","method":"n"}{"jsonrpc":"2.0","id":1,"method":"m"}`, false},
	{"trailing comma", `{"jsonrpc":"2.0","method":"n",}`, false},
	{"not an object", `"notifications/cancelled"`, false},
	{"null", `null`, false},
	{"empty", ``, false},
	{"spaces", `   `, false},
	{"form", `method=n&id=1`, false},
}

func TestStreamless(t *testing.T) {
	for _, tc := range streamlessCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := streamless([]byte(tc.body)); got != tc.want {
				t.Fatalf("streamless(%s) = %v, want %v", tc.body, got, tc.want)
			}
		})
	}
}

// FuzzStreamless checks streamless against the go-sdk gateway's own
// reading of a POST body (mcp's readBatch and jsonrpc.DecodeMessage): a
// body it calls streamless never holds a call, so the gateway opens no
// stream for it. Nor may a server that matches keys without regard to case
// (encoding/json into a struct) find a call in it.
func FuzzStreamless(f *testing.F) {
	for _, tc := range streamlessCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !streamless(body) {
			return
		}
		msgs := []json.RawMessage{body}
		var batch []json.RawMessage
		if json.Unmarshal(body, &batch) == nil {
			msgs = batch
		}
		for _, m := range msgs {
			if msg, err := jsonrpc.DecodeMessage(m); err == nil {
				if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
					t.Fatalf("streamless, but the go-sdk reads a call in %q", m)
				}
			}
			var loose struct {
				Method json.RawMessage `json:"method"`
				ID     json.RawMessage `json:"id"`
			}
			if json.Unmarshal(m, &loose) == nil && loose.Method != nil && loose.ID != nil {
				t.Fatalf("streamless, but encoding/json finds both method and id in %q", m)
			}
		}
	})
}

// At max_streams_per_sandbox, a POST of JSON-RPC notifications and
// responses passes (one over 8 KiB is read whole: see
// TestStreamLimitJudgesLargeBodies), and so
// does an MCP session's DELETE (an Mcp-Session-Id, no body); any other
// request is refused as before, and so are those once the sandbox has
// twice the limit in flight. The slot count is back where it was after
// each.
func TestStreamLimitAdmitsStreamlessPOSTs(t *testing.T) {
	t.Parallel()
	const notification = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`
	h := newHarness(t, func(o *harnessOpts) { o.cfg.MaxStreamsPerSandbox = 1 })
	// The sandbox holds a request to /hold until release, one to
	// /hold/next until next: the first request held, and the one held
	// beside it at twice the limit.
	entered, release, next := make(chan struct{}, 4), make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release); close(next) })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold":
			entered <- struct{}{}
			<-release
		case "/hold/next":
			entered <- struct{}{}
			<-next
		}
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	h.put("slotbox", map[string]string{"HostIP": "127.0.0.1", "CreatedAt": "1", "8080": itoa(port)})
	const host = "8080-slotbox.cube.test"
	sb := h.proxy.sandboxes.get([]byte("slotbox"))
	// held sends a request that the sandbox holds until released, with
	// an Mcp-Session-Id unless session is empty.
	held := func(t *testing.T, method, path, body, session string) <-chan int {
		st := make(chan int, 1)
		r := h.req(method, host, path, strings.NewReader(body))
		if session != "" {
			r.Header.Set("Mcp-Session-Id", session)
		}
		go func() {
			resp, err := h.client.Do(r)
			if err != nil {
				st <- 0
				return
			}
			resp.Body.Close()
			st <- resp.StatusCode
		}()
		select {
		case <-entered:
		case code := <-st:
			t.Fatalf("%s %s answered %d instead of reaching the sandbox", method, path, code)
		}
		return st
	}
	first := held(t, "GET", "/hold", "", "")

	for _, tc := range []struct {
		name, method, body string
		chunked            bool
		want               int
	}{
		{"notification", "POST", notification, false, 202},
		{"response", "POST", `{"jsonrpc":"2.0","id":7,"result":{"action":"decline"}}`, false, 202},
		{"batch", "POST", `[` + notification + `,{"jsonrpc":"2.0","id":7,"result":{}}]`, false, 202},
		{"request", "POST", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`, false, 429},
		{"batch with a request", "POST", `[` + notification + `,{"jsonrpc":"2.0","id":2,"method":"ping"}]`, false, 429},
		{"malformed", "POST", notification[:len(notification)-1], false, 429},
		{"not a POST", "PUT", notification, false, 429},
		{"chunked", "POST", notification, true, 429},
		{"longer than the pre-read: read whole", "POST", notification + strings.Repeat(" ", fasthttpPreRead), false, 202},
		{"no body", "POST", "", false, 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // no length known: Go sends it chunked
			}
			resp, err := h.client.Do(h.req(tc.method, host, "/mcp", body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%s at the limit: %d %s, want %d", tc.name, resp.StatusCode, b, tc.want)
			}
			if tc.want == 202 && string(b) != fmt.Sprintf("got %d bytes", len(tc.body)) {
				t.Fatalf("the sandbox got %q of a %d-byte body", b, len(tc.body))
			}
			testenv.WaitFor(t, 5*time.Second, "the slot count back to the held request", func() bool { return sb.inFlight() == 1 })
		})
	}

	t.Run("expect 100-continue", func(t *testing.T) {
		for _, tc := range []struct {
			body string
			want int
		}{
			{notification, 202},
			{`{"jsonrpc":"2.0","id":2,"method":"tools/call"}`, 429},
		} {
			c := dialRaw(t, h.addr)
			fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", host, len(tc.body))
			br := bufio.NewReader(c)
			if resp, b := readExpectAnswer(t, br); resp.StatusCode != http.StatusContinue {
				t.Fatalf("head of a short POST at the limit: %d %s, want 100", resp.StatusCode, b)
			}
			io.WriteString(c, tc.body)
			if resp, b := readExpectAnswer(t, br); resp.StatusCode != tc.want {
				t.Fatalf("%s after 100: %d %s, want %d", tc.body, resp.StatusCode, b, tc.want)
			}
			testenv.WaitFor(t, 5*time.Second, "the slot count back to the held request", func() bool { return sb.inFlight() == 1 })
		}
	})

	// rawAtLimit sends one request with exactly the head lines and body
	// given, on a connection of its own, and returns the answer.
	rawAtLimit := func(t *testing.T, method, head, body string) (int, string) {
		t.Helper()
		c := dialRaw(t, h.addr)
		fmt.Fprintf(c, "%s /mcp HTTP/1.1\r\nHost: %s\r\n%s\r\n%s", method, host, head, body)
		resp, b := readExpectAnswer(t, bufio.NewReader(c))
		return resp.StatusCode, b
	}
	const sessionID = "Mcp-Session-Id: s1\r\n"

	// An MCP session's DELETE (the go-sdk's ClientSession.Close) carries
	// an Mcp-Session-Id and no body, and passes; other requests on the
	// session, and a DELETE that is not that, are refused.
	t.Run("session DELETE", func(t *testing.T) {
		for _, tc := range []struct {
			name, method, head, body string
			want                     int
		}{
			{"no body", "DELETE", sessionID, "", 202},
			{"Content-Length 0", "DELETE", sessionID + "Content-Length: 0\r\n", "", 202},
			{"id header in lower case", "DELETE", "mcp-session-id: s1\r\n", "", 202},
			{"no session id", "DELETE", "", "", 429},
			{"empty session id", "DELETE", "Mcp-Session-Id: \r\n", "", 429},
			{"a body", "DELETE", sessionID + "Content-Length: 2\r\n", "{}", 429},
			{"chunked", "DELETE", sessionID + "Transfer-Encoding: chunked\r\n", "0\r\n\r\n", 429},
			{"a body behind Expect", "DELETE", sessionID + "Content-Length: 2\r\nExpect: 100-continue\r\n", "", 429},
			{"the session's GET stream", "GET", sessionID + "Accept: text/event-stream\r\n", "", 429},
			{"a call on the session", "POST", sessionID + "Content-Length: 2\r\n", "{}", 429},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if st, b := rawAtLimit(t, tc.method, tc.head, tc.body); st != tc.want {
					t.Fatalf("%s at the limit: %d %s, want %d", tc.name, st, b, tc.want)
				} else if st == 202 && b != "got 0 bytes" {
					t.Fatalf("the sandbox answered %q", b)
				}
				testenv.WaitFor(t, 5*time.Second, "the slot count back to the held request", func() bool { return sb.inFlight() == 1 })
			})
		}
	})

	t.Run("twice the limit", func(t *testing.T) {
		// One such POST held by the sandbox makes two in flight, twice the
		// limit: the next is refused, and so is a session's DELETE.
		second := held(t, "POST", "/hold/next", notification, "")
		resp, err := h.client.Do(h.req("POST", host, "/mcp", strings.NewReader(notification)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 429 {
			t.Fatalf("a notification with twice the limit in flight: %d, want 429", resp.StatusCode)
		}
		if st, b := rawAtLimit(t, "DELETE", sessionID, ""); st != 429 {
			t.Fatalf("a session's DELETE with twice the limit in flight: %d %s, want 429", st, b)
		}
		next <- struct{}{}
		if st := <-second; st != 202 {
			t.Fatalf("the held notification: %d", st)
		}
		testenv.WaitFor(t, 5*time.Second, "the slot count back to the first request", func() bool { return sb.inFlight() == 1 })

		// A session's DELETE held by the sandbox holds its slot too.
		third := held(t, "DELETE", "/hold/next", "", "s1")
		if st, b := rawAtLimit(t, "POST", "Content-Length: "+strconv.Itoa(len(notification))+"\r\n", notification); st != 429 {
			t.Fatalf("a notification with a DELETE making twice the limit in flight: %d %s, want 429", st, b)
		}
		next <- struct{}{}
		release <- struct{}{}
		if a, b := <-first, <-third; a != 202 || b != 202 {
			t.Fatalf("the held requests: %d, %d", a, b)
		}
		testenv.WaitFor(t, 5*time.Second, "no request in flight", func() bool { return sb.inFlight() == 0 })
	})
}
