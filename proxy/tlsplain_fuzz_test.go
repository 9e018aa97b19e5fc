package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// FuzzTLSFirstBytes sends arbitrary first bytes to a real HTTPS listener
// (plainHTTPOnTLS, the TLS connection's head timeout, the drain's
// handshake set): no panic, an answer or a close within seconds, and no
// byte that is neither TLS nor the proxy's 400. Whatever net/http's own
// HTTPS server answers as plain HTTP ("GET /", "POST " and the like), also
// after empty lines (RFC 9112 2.2), is answered 400 with the JSON error,
// one request id and Connection: close; a TLS handshake record (0x16)
// that is all the input never gets HTTP. (After a first record holding
// part of a handshake message, a record header that reads as HTTP,
// "\x16\x030\x00\x010A0000", gets the 400, where nginx, which
// decides by the first byte, closes: crypto/tls reports the two alike,
// and only a client sending garbage sees it.)
func FuzzTLSFirstBytes(f *testing.F) {
	bport := strconv.Itoa(int(fuzzBackend(f, "box")))
	host := "8080-box.cube.test"
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\n\r\nhello",
		"OPTIONS * HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"\r\n\r\n\r\nGET /lead HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"\n\nGET /lead HTTP/1.1\r\n\r\n",
		"get / HTTP/1.1\r\n\r\n",
		"GET\t/ HTTP/1.1\r\n\r\n",
		"GET",
		"\x16\x03\x01\x00\x05hello",
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
		"\x80\x2e\x01\x00\x02",
		"\x15\x03\x03\x00\x02\x02\x28",
		"\x00\x01\x02\x03\x04\x05\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	ca := testenv.NewCA(f, "fuzz CA")
	addr, _ := fuzzProxy(f, map[string]map[string]string{
		"box": {"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1", "CreatedAt": "1", "8080": bport},
	}, Config{}, &tls.Config{Certificates: []tls.Certificate{ca.Certificate(f, "*.cube.test")}})

	f.Fuzz(func(t *testing.T, raw []byte) {
		out, rerr := fuzzExchange(t, addr, func(c net.Conn) {
			_, _ = c.Write(raw) // the proxy may answer and close first
		})
		isHTTP := bytes.HasPrefix(out, []byte("HTTP/"))
		switch {
		case looksLikeHTTPToNetHTTP(bytes.TrimLeft(raw, "\r\n")) && !isHTTP && rerr == nil:
			t.Fatalf("plain HTTP %q got %q, want the 400", raw, out)
		case firstRecordWhole(raw) && isHTTP:
			t.Fatalf("a TLS record %q got HTTP: %q", raw, out)
		case !isHTTP && len(out) > 0 && (out[0] < 0x14 || out[0] > 0x17):
			t.Fatalf("%q got %q: neither TLS nor HTTP", raw, out)
		case !isHTTP:
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil {
			t.Fatalf("unparsable answer %q to %q: %v", out, raw, err)
		}
		body, _ := io.ReadAll(resp.Body)
		var obj struct{ Error, Code string }
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/json" ||
			json.Unmarshal(body, &obj) != nil || obj.Code != CodeBadRequest || !strings.Contains(obj.Error, "HTTPS") {
			t.Fatalf("%q got %d %q %q, want 400 with the JSON %s", raw, resp.StatusCode, resp.Header.Get("Content-Type"), body, CodeBadRequest)
		}
		if ids := resp.Header.Values(HeaderRequestID); len(ids) != 1 || !isToken([]byte(ids[0])) || !resp.Close {
			t.Fatalf("%q: the 400 has %s %q, Connection close %v", raw, HeaderRequestID, ids, resp.Close)
		}
	})
}

// looksLikeHTTPToNetHTTP is net/http's test (tlsRecordHeaderLooksLikeHTTP)
// for the first bytes its HTTPS server answers as plain HTTP.
func looksLikeHTTPToNetHTTP(b []byte) bool {
	if len(b) < 5 {
		return false
	}
	switch string(b[:5]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

// firstRecordWhole reports whether raw is a TLS handshake record header
// and at most the record it announces.
func firstRecordWhole(raw []byte) bool {
	return len(raw) >= 5 && raw[0] == 0x16 && len(raw)-5 <= int(raw[3])<<8|int(raw[4])
}
