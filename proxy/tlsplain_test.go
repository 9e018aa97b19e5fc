package proxy

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Plain HTTP sent to the HTTPS listener (an SDK or a curl given http://
// with the HTTPS port) is answered 400, as nginx answers it ("The plain HTTP
// request was sent to HTTPS port") and as Go's net/http does, and logged
// and counted like every refused request. The connection was closed without
// a byte before: curl said "Empty reply from server", which tells the client
// nothing about its mistake. The listener still speaks TLS afterwards, and
// bytes that are not a TLS handshake nor look like HTTP are still just
// closed.
func TestPlainHTTPOnTLSListenerAnswered400(t *testing.T) {
	h, logs := logHarness(t, "json")
	b := startAuthBackend(t)
	host := h.route("plainontls", b.port)
	addr, roots := serveTLS(t, h)

	for _, head := range []string{
		"GET /p?cube_token=secret HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST /upload HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\n\r\nhello",
		"OPTIONS * HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		// Empty lines before the request line, which a server skips
		// (RFC 9112 2.2), as nginx does here too: the proxy closed
		// without a byte.
		"\r\nGET /lead HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"\n\nGET /lead HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"\r\n\r\n\r\nGET /lead HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
	} {
		resp, body := rawRequest(t, addr, head)
		checkProxyError(t, resp, body, 400, CodeBadRequest)
		if !strings.Contains(body, "HTTPS") {
			t.Errorf("%q: answer %q does not say the port is HTTPS", head, body)
		}
		if !resp.Close {
			t.Errorf("%q: the 400 leaves the connection open", head)
		}
		id := resp.Header.Get(HeaderRequestID)
		if id == "" {
			t.Fatalf("%q: the 400 has no %s", head, HeaderRequestID)
		}
		entry := logs.waitJSON(t, id)
		if entry["status"] != float64(400) || entry["error_code"] != CodeBadRequest {
			t.Errorf("%q: logged %v %v, want 400 %s", head, entry["status"], entry["error_code"], CodeBadRequest)
		}
	}

	// Not HTTP: closed as before, with nothing written.
	c := dialRaw(t, addr)
	if _, err := c.Write([]byte("\x00\x01\x02\x03\x04\x05\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if n, _ := io.Copy(io.Discard, c); n != 0 {
		t.Errorf("bytes that are neither TLS nor HTTP got %d bytes back, want none", n)
	}

	// TLS still works on the listener.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host},
	}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "https://"+addr+"/ok", nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTPS after the plain requests: %d, want 200", resp.StatusCode)
	}
	if got := b.next(t); got.line != "GET /ok HTTP/1.1" {
		t.Errorf("sandbox got %q, want only the HTTPS request", got.line)
	}
	select {
	case got := <-b.heads:
		t.Errorf("sandbox also got %q from a plain request on the HTTPS port", got.line)
	default:
	}
}
