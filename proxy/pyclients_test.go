package proxy

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// pythonWith returns a python3 that imports every one of modules: the one
// on PATH, or Debian's /usr/bin/python3 where the apt packages go (a pyenv
// python3 on PATH does not see them). make test installs the packages
// (python3-requests, python3-httpx, python3-websockets); a missing one
// fails the test rather than skipping it.
func pythonWith(t *testing.T, modules ...string) string {
	t.Helper()
	probe := "import " + strings.Join(modules, ", ")
	var tried []string
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		py, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		out, err := exec.Command(py, "-c", probe).CombinedOutput()
		if err == nil {
			return py
		}
		tried = append(tried, py+": "+strings.TrimSpace(string(out)))
	}
	t.Fatalf("no python3 imports %s (make test installs them with apt): %s", strings.Join(modules, ", "), strings.Join(tried, "; "))
	return ""
}

// runPython runs script with args under py, within 60 s, and returns its
// standard output; stderr goes into the failure.
func runPython(t *testing.T, py, script string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{"-c", script}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		err = &pythonError{err: err, stderr: stderr.String()}
	}
	return stdout.String(), err
}

// pythonError is a failed Python run with what it wrote to stderr.
type pythonError struct {
	err    error
	stderr string
}

func (e *pythonError) Error() string { return e.err.Error() + ": " + e.stderr }

// The script of TestPythonClientsReadTheRefusalOfALargeUpload: requests
// with a generator body (chunked) and httpx with a sized one each send the
// whole body before they read the answer.
const pyLargeUpload = `
import sys, requests, httpx
addr, host = sys.argv[1], sys.argv[2]
body = bytes(24 << 20)
def pieces():
    for i in range(0, len(body), 1 << 16):
        yield body[i:i + (1 << 16)]
r = requests.post('http://' + addr + '/upload', data=pieces(), headers={'Host': host}, timeout=30)
print('requests', r.status_code, r.json()['code'])
r = httpx.post('http://' + addr + '/upload', content=body, headers={'Host': host}, timeout=30)
print('httpx', r.status_code, r.json()['code'])
`

// Python's requests and httpx read the proxy's 502 for a 24 MiB upload to
// a sandbox whose port is down, as through nginx: with the lingering close
// cut at 16 MiB both raised a broken pipe (requests.ConnectionError,
// httpx.WriteError) instead.
func TestPythonClientsReadTheRefusalOfALargeUpload(t *testing.T) {
	py := pythonWith(t, "requests", "httpx")
	h := newHarness(t)
	host := h.route("pydown", freePort(t))
	out, err := runPython(t, py, pyLargeUpload, h.addr, host)
	want := "requests 502 " + CodeUpstreamConnect + "\nhttpx 502 " + CodeUpstreamConnect + "\n"
	if err != nil || out != want {
		t.Fatalf("got %q (%v), want %q", out, err, want)
	}
}

// The script of TestPythonWebsocketsOverAnHTTP10Sandbox: the websockets
// library's client, on a socket to argv[1] with Host argv[2], prints the
// first message and closes.
const pyWebsocketsFirst = `
import asyncio, socket, sys, websockets
async def main():
    s = socket.create_connection(tuple(sys.argv[1].rsplit(':', 1)))
    async with websockets.connect('ws://' + sys.argv[2] + '/ws', sock=s, open_timeout=10, close_timeout=10) as c:
        print(await c.recv())
asyncio.run(main())
`

// A sandbox that answers the WebSocket handshake with "HTTP/1.0 101" (as
// Python's http.server writes its status line by default) works through
// the proxy with Python's websockets client, which refuses that answer
// directly: the proxy writes its own HTTP/1.1 status line (nginx does
// too). The direct run shows the client is that strict, so the proxy's
// run is not passing by a lenient library. Run against a proxy that
// relayed the 101 verbatim, the proxied run fails as the direct one.
func TestPythonWebsocketsOverAnHTTP10Sandbox(t *testing.T) {
	py := pythonWith(t, "websockets")
	h := newHarness(t)
	b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
		sum := sha1.Sum([]byte(req.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		head := "HTTP/1.0 101 Switching Protocols\r\nServer: BaseHTTP/0.6 Python/3.11\r\nUpgrade: websocket\r\n" +
			"Connection: Upgrade\r\nSec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n"
		msg := "hello over 1.0"
		if !rawWrite(c, head+"\x81"+string(rune(len(msg)))+msg) {
			return false
		}
		// The client's close frame (masked, a 2-byte code), answered with
		// the same code, unmasked.
		var close [8]byte
		if _, err := io.ReadFull(c, close[:]); err != nil {
			return false
		}
		code := []byte{close[6] ^ close[2], close[7] ^ close[3]}
		rawWrite(c, "\x88\x02"+string(code))
		return false
	})
	host := h.route("pyws10", b.port)
	if out, err := runPython(t, py, pyWebsocketsFirst, net.JoinHostPort("127.0.0.1", itoa(b.port)), host); err == nil {
		t.Fatalf("directly, websockets took the HTTP/1.0 101 (%q): this test no longer shows anything", out)
	}
	out, err := runPython(t, py, pyWebsocketsFirst, h.addr, host)
	if err != nil || out != "hello over 1.0\n" {
		t.Fatalf("through the proxy: %q (%v), want the sandbox's first message", out, err)
	}
}
