package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// wsAcceptFor is the Sec-WebSocket-Accept a server answers key with
// (RFC 6455 §4.2.2).
func wsAcceptFor(key string) string {
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// wsFrame builds one final WebSocket frame with opcode op, masked (as a
// client sends) when mask, RSV1 set (a permessage-deflate message) when
// compressed.
func wsFrame(op byte, payload []byte, mask, compressed bool) []byte {
	b0 := 0x80 | op
	if compressed {
		b0 |= 0x40
	}
	b := []byte{b0}
	var m byte
	if mask {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, m|byte(n))
	case n < 1<<16:
		b = append(b, m|126, byte(n>>8), byte(n))
	default:
		b = append(b, m|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if !mask {
		return append(b, payload...)
	}
	key := [4]byte{1, 2, 3, 4}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

// The negotiation of a WebSocket stays end to end, over plain TCP and over
// the TLS listener (wss://<port>-<id>.<domain>) alike: the client's
// Sec-WebSocket-Extensions (permessage-deflate) and Sec-WebSocket-Protocol
// reach the sandbox as sent, the sandbox's choice reaches the client as
// sent, and the frames that follow, a compressed one (RSV1) the sandbox
// sent in the 101's own segment, 300 KiB each way and the close frames of
// both sides, pass byte for byte. The tunnel's access log line counts
// exactly those bytes: bytes_in what the client sent after its head,
// body_bytes_sent what the sandbox sent after its 101.
func TestWebSocketNegotiationAndFramesPassExactly(t *testing.T) {
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	const size = 300 << 10
	const offerExt = "permessage-deflate; client_max_window_bits"
	const chosenExt = "permessage-deflate; server_no_context_takeover; client_max_window_bits=10"
	// "Hello" deflated, as RFC 7692 §7.2.3.1's example.
	compressed := wsFrame(0x1, []byte{0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00}, false, true)
	serverClose := wsFrame(0x8, []byte{0x03, 0xe9, 'b', 'y', 'e'}, false, false) // 1001
	clientClose := wsFrame(0x8, []byte{0x03, 0xe9}, true, false)
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "ws", true: "wss"}[overTLS], func(t *testing.T) {
			h, buf := logHarness(t, accesslog.FormatJSON)
			seen := make(chan http.Header, 1)
			b := newScriptBackend(t, func(c net.Conn, req *http.Request, _ int) bool {
				seen <- req.Header.Clone()
				rawWrite(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
					"Sec-WebSocket-Accept: "+wsAcceptFor(req.Header.Get("Sec-WebSocket-Key"))+"\r\n"+
					"Sec-WebSocket-Extensions: "+chosenExt+"\r\nSec-WebSocket-Protocol: b.v2\r\n\r\n"+string(compressed))
				in := make([]byte, size+len(clientClose))
				if _, err := io.ReadFull(c, in[:size]); err != nil {
					t.Errorf("the sandbox read the client's bytes: %v", err)
					return false
				}
				rawWrite(c, string(in[:size])+string(serverClose))
				if _, err := io.ReadFull(c, in[size:]); err != nil || !bytes.Equal(in[size:], clientClose) {
					t.Errorf("the sandbox got the client's close frame as %x (%v), want %x", in[size:], err, clientClose)
				}
				return false
			})
			host := h.route("wsneg", b.port)
			c := dialProxy(t, h, host, overTLS)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Extensions: %s\r\n"+
				"Sec-WebSocket-Protocol: a.v1, b.v2\r\nX-Cube-Request-Id: wsneg-id\r\n\r\n", host, key, offerExt)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != wsAcceptFor(key) ||
				resp.Header.Get("Sec-WebSocket-Extensions") != chosenExt || resp.Header.Get("Sec-WebSocket-Protocol") != "b.v2" {
				t.Errorf("the client got %d %v; want the sandbox's 101 with its accept, extension and protocol", resp.StatusCode, resp.Header)
			}
			got := testenv.Recv(t, seen, 10*time.Second, "the sandbox's upgrade request")
			if got.Get("Sec-WebSocket-Extensions") != offerExt || got.Get("Sec-WebSocket-Protocol") != "a.v1, b.v2" || got.Get("Sec-WebSocket-Key") != key {
				t.Errorf("the sandbox got %v; want the client's key, extension offer and protocols", got)
			}
			first := make([]byte, len(compressed))
			if _, err := io.ReadFull(br, first); err != nil || !bytes.Equal(first, compressed) {
				t.Fatalf("the compressed frame sent with the 101 came as %x (%v), want %x", first, err, compressed)
			}
			payload := make([]byte, size)
			_, _ = rand.Read(payload)
			wrote := make(chan error, 1)
			go func() { _, err := c.Write(payload); wrote <- err }()
			echo := make([]byte, size)
			if _, err := io.ReadFull(br, echo); err != nil || !bytes.Equal(echo, payload) {
				t.Fatalf("the sandbox's echo of %d bytes: %v, equal %v", size, err, bytes.Equal(echo, payload))
			}
			if err := testenv.Recv(t, wrote, 10*time.Second, "the client's write"); err != nil {
				t.Fatal(err)
			}
			closing := make([]byte, len(serverClose))
			if _, err := io.ReadFull(br, closing); err != nil || !bytes.Equal(closing, serverClose) {
				t.Fatalf("the sandbox's close frame came as %x (%v), want %x", closing, err, serverClose)
			}
			if _, err := c.Write(clientClose); err != nil {
				t.Fatal(err)
			}
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after both close frames the client read %d bytes, %v; want the end of the connection", n, err)
			}
			e := buf.waitJSON(t, "wsneg-id")
			if e["status"] != 101.0 || e["route_kind"] != "websocket" || e["error_code"] != "" ||
				e["bytes_in"] != float64(size+len(clientClose)) || e["body_bytes_sent"] != float64(len(compressed)+size+len(serverClose)) {
				t.Errorf("access log %v; want 101, websocket, no error, bytes_in %d, body_bytes_sent %d",
					e, size+len(clientClose), len(compressed)+size+len(serverClose))
			}
		})
	}
}

// wsCompressEcho is a sandbox's WebSocket server with compression in mode:
// it echoes each message in 50 KB fragments, answers "ping-me" by pinging
// the client (and says whether the pong came), answers "bye" by closing
// with 4002, and reports the close a client sent on closed.
func wsCompressEcho(t *testing.T, mode websocket.CompressionMode, closed chan<- websocket.CloseError) uint16 {
	return backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"b.v2"}, CompressionMode: mode, CompressionThreshold: 1})
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(64 << 20)
		ctx := r.Context()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				var ce websocket.CloseError
				if !errors.As(err, &ce) {
					ce = websocket.CloseError{Code: -1, Reason: err.Error()}
				}
				closed <- ce
				return
			}
			switch string(msg) {
			case "ping-me":
				go func() { // the pong is read by this loop
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					answer := "pong came"
					if err := c.Ping(pctx); err != nil {
						answer = "no pong: " + err.Error()
					}
					_ = c.Write(ctx, websocket.MessageText, []byte(answer))
				}()
				continue
			case "bye":
				_ = c.Close(4002, "sandbox bye")
				return
			}
			wr, err := c.Writer(ctx, typ)
			if err != nil {
				return
			}
			for p := msg; len(p) > 0; p = p[min(len(p), 50000):] {
				_, _ = wr.Write(p[:min(len(p), 50000)])
			}
			if wr.Close() != nil {
				return
			}
		}
	}))
}

// A real client and server (coder/websocket), over ws:// and over wss://
// to <port>-<id>.<domain> on the TLS listener, negotiate permessage-deflate
// (with and without context takeover, or none) and a subprotocol through
// the proxy, and exchange a 6 MiB message sent and echoed in fragments,
// pings both ways and the close codes of both sides.
func TestWebSocketRealClientsNegotiateThroughProxy(t *testing.T) {
	modes := []websocket.CompressionMode{websocket.CompressionContextTakeover, websocket.CompressionNoContextTakeover, websocket.CompressionDisabled}
	for _, overTLS := range []bool{false, true} {
		for _, mode := range modes {
			name := map[bool]string{false: "ws", true: "wss"}[overTLS] + map[websocket.CompressionMode]string{
				websocket.CompressionContextTakeover: " deflate", websocket.CompressionNoContextTakeover: " deflate without takeover",
				websocket.CompressionDisabled: " uncompressed"}[mode]
			t.Run(name, func(t *testing.T) {
				h := newHarness(t)
				closed := make(chan websocket.CloseError, 2)
				host := h.route("wsreal", wsCompressEcho(t, mode, closed))
				opts := &websocket.DialOptions{Host: host, Subprotocols: []string{"a.v1", "b.v2"}, CompressionMode: mode, CompressionThreshold: 1}
				url := "ws://" + h.addr + "/ws"
				if overTLS {
					addr, roots := serveTLS(t, h)
					tr := &http.Transport{
						TLSClientConfig: &tls.Config{RootCAs: roots},
						DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
							return (&net.Dialer{}).DialContext(ctx, network, addr)
						},
					}
					t.Cleanup(tr.CloseIdleConnections)
					opts.Host, opts.HTTPClient, url = "", &http.Client{Transport: tr}, "wss://"+host+"/ws"
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				c, resp, err := websocket.Dial(ctx, url, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer c.CloseNow()
				c.SetReadLimit(64 << 20)
				ext := resp.Header.Get("Sec-WebSocket-Extensions")
				if c.Subprotocol() != "b.v2" || strings.HasPrefix(ext, "permessage-deflate") != (mode != websocket.CompressionDisabled) {
					t.Errorf("negotiated subprotocol %q, extensions %q", c.Subprotocol(), ext)
				}
				big := make([]byte, 6<<20)
				_, _ = rand.Read(big[:1<<20]) // the rest compresses
				wr, err := c.Writer(ctx, websocket.MessageBinary)
				if err != nil {
					t.Fatal(err)
				}
				for p := big; len(p) > 0; p = p[min(len(p), 70000):] {
					_, _ = wr.Write(p[:min(len(p), 70000)])
				}
				if err := wr.Close(); err != nil {
					t.Fatal(err)
				}
				if _, echo, err := c.Read(ctx); err != nil || !bytes.Equal(echo, big) {
					t.Fatalf("echo of a 6 MiB fragmented message: %d bytes, %v", len(echo), err)
				}
				// The sandbox pings; this Read answers it.
				if err := c.Write(ctx, websocket.MessageText, []byte("ping-me")); err != nil {
					t.Fatal(err)
				}
				if _, m, err := c.Read(ctx); err != nil || string(m) != "pong came" {
					t.Fatalf("the sandbox's ping: %q %v", m, err)
				}
				// The client pings; a Read must run meanwhile to take the
				// pong, and then takes the sandbox's close.
				readEnd := make(chan error, 1)
				go func() { _, _, err := c.Read(ctx); readEnd <- err }()
				if err := c.Ping(ctx); err != nil {
					t.Errorf("the client's ping: %v", err)
				}
				if err := c.Write(ctx, websocket.MessageText, []byte("bye")); err != nil {
					t.Fatal(err)
				}
				if err := testenv.Recv(t, readEnd, 20*time.Second, "the sandbox's close"); websocket.CloseStatus(err) != 4002 {
					t.Errorf("the client read %v; want the sandbox's close 4002", err)
				}
				// And a client's close code reaches the sandbox.
				c2, _, err := websocket.Dial(ctx, url, opts)
				if err != nil {
					t.Fatal(err)
				}
				if err := c2.Close(4001, "client bye"); err != nil {
					t.Errorf("the client's close: %v", err)
				}
				if ce := testenv.Recv(t, closed, 20*time.Second, "the sandbox to read the client's close"); ce.Code != 4001 {
					t.Errorf("the sandbox read %v; want the client's close 4001", ce)
				}
			})
		}
	}
}

// The script of TestPythonWebsocketsOverTLSWithDeflate: Python's websockets
// client (permessage-deflate on by default) through the TLS listener.
const pyWebsocketsWSS = `
import asyncio, os, socket, ssl, sys, websockets
addr, host, cafile = sys.argv[1], sys.argv[2], sys.argv[3]
async def main():
    ip, port = addr.rsplit(':', 1)
    s = socket.create_connection((ip, int(port)))
    ctx = ssl.create_default_context(cafile=cafile)
    async with websockets.connect('wss://' + host + '/ws', sock=s, ssl=ctx, server_hostname=host,
            subprotocols=['a.v1', 'b.v2'], max_size=None, open_timeout=10, close_timeout=10) as c:
        print('protocol', c.subprotocol)
        print('extensions', [type(e).__name__ for e in c.extensions])
        big = os.urandom(1 << 20) + bytes(5 << 20)
        await c.send(big[i:i + 65536] for i in range(0, len(big), 65536))
        print('echo', await c.recv() == big)
        await asyncio.wait_for(await c.ping(), 10)
        print('pong')
        await c.send('bye')
        try:
            await c.recv()
        except websockets.ConnectionClosed as e:
            print('closed', e.rcvd.code, e.rcvd.reason)
asyncio.run(main())
`

// Python's websockets client negotiates permessage-deflate and a
// subprotocol with a sandbox through wss://<port>-<id>.<domain>, and its
// fragmented message, ping and the sandbox's close code pass.
func TestPythonWebsocketsOverTLSWithDeflate(t *testing.T) {
	py := pythonWith(t, "websockets")
	h := newHarness(t)
	host := h.route("pywss", wsCompressEcho(t, websocket.CompressionContextTakeover, make(chan websocket.CloseError, 1)))
	addr, ca := serveTLSFor(t, h, "*.cube.test")
	cafile := t.TempDir() + "/ca.pem"
	if err := os.WriteFile(cafile, ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runPython(t, py, pyWebsocketsWSS, addr, host, cafile)
	if want := "protocol b.v2\nextensions ['PerMessageDeflate']\necho True\npong\nclosed 4002 sandbox bye\n"; err != nil || out != want {
		t.Fatalf("got %q (%v), want %q", out, err, want)
	}
}
