package proxy

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// X-Forwarded-Proto, when the client sent none (or an empty one), names
// the scheme the request came over, as nginx's $scheme: a sandbox behind
// the proxy's TLS listener that read "http" would build http:// links
// and redirect every request to HTTPS, for ever. A client's own value is
// kept (README: "set when absent").
func TestForwardedProtoNamesTheListenersScheme(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", echoHeaders())
	host := h.route("proto", port)
	tlsAddr, roots := serveTLS(t, h)
	tlsClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host},
	}}
	defer tlsClient.CloseIdleConnections()
	plainClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer plainClient.CloseIdleConnections()

	for _, tc := range []struct {
		name string
		tls  bool
		sent []string // the client's X-Forwarded-Proto lines
		want string
	}{
		{"https, none sent", true, nil, "https"},
		{"https, empty sent", true, []string{""}, "https"},
		{"https, client's kept", true, []string{"http"}, "http"},
		{"http, none sent", false, nil, "http"},
		{"http, client's kept", false, []string{"https"}, "https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, url := plainClient, "http://"+h.addr+"/"
			if tc.tls {
				client, url = tlsClient, "https://"+tlsAddr+"/"
			}
			req, err := http.NewRequest("GET", url, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			if tc.sent != nil {
				req.Header["X-Forwarded-Proto"] = tc.sent
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			var e echoed
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if got := e.get("X-Forwarded-Proto"); got != tc.want {
				t.Errorf("X-Forwarded-Proto reached the sandbox as %q, want %q", got, tc.want)
			}
		})
	}
}
