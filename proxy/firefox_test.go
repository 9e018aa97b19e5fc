package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// firefox is a headless Firefox driven over WebDriver BiDi, the protocol
// Firefox speaks to automation (it dropped the DevTools protocol Chromium
// is driven over). The test needs three commands of it, so a JSON exchange
// on a WebSocket (browserConn) is all of the client: no driver binary, no
// Node.
type firefox struct {
	ws      *browserConn
	context string // the browsing context (tab) pages open in
}

// firefoxPrefs resolve every name to loopback (Firefox has no per-domain
// host rules; the test uses no other names) and keep the start quiet.
const firefoxPrefs = `user_pref("network.dns.forceResolve", "127.0.0.1");
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
`

// newFirefox starts a headless Firefox with a fresh profile that accepts
// the tests' certificates. A missing Firefox fails the test: make test
// installs it.
func newFirefox(t *testing.T) *firefox {
	t.Helper()
	bin, err := exec.LookPath("firefox-esr") // Debian's name
	if err != nil {
		if bin, err = exec.LookPath("firefox"); err != nil {
			t.Fatalf("firefox not found (make test installs firefox-esr with apt): %v", err)
		}
	}
	profile := t.TempDir()
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(firefoxPrefs), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless", "--no-remote", "--profile", profile, "--remote-debugging-port", "0", "about:blank")
	cmd.Env = append(os.Environ(), "MOZ_CRASHREPORTER_DISABLE=1")
	addr := startBrowser(t, cmd, "WebDriver BiDi listening on ")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &firefox{ws: dialBrowser(ctx, t, addr+"/session")}
	if _, err := f.call(ctx, "session.new", map[string]any{
		"capabilities": map[string]any{"alwaysMatch": map[string]any{"acceptInsecureCerts": true}},
	}); err != nil {
		t.Fatal(err)
	}
	tree, err := f.call(ctx, "browsingContext.getTree", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Contexts []struct{ Context string }
	}
	if err := json.Unmarshal(tree, &got); err != nil || len(got.Contexts) == 0 {
		t.Fatalf("firefox's browsing contexts %s: %v", tree, err)
	}
	f.context = got.Contexts[0].Context
	return f
}

// call sends one command and returns its result.
func (f *firefox) call(ctx context.Context, method string, params map[string]any) (json.RawMessage, error) {
	raw, err := f.ws.exchange(ctx, "", method, params)
	if err != nil {
		return nil, fmt.Errorf("firefox %s: %w", method, err)
	}
	var answer struct {
		Type    string
		Error   string
		Message string
		Result  json.RawMessage
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return nil, fmt.Errorf("firefox %s: answer %s: %w", method, raw, err)
	}
	if answer.Type != "success" {
		return nil, fmt.Errorf("firefox %s: %s: %s (%s)", method, answer.Error, answer.Message, raw)
	}
	return answer.Result, nil
}

func (f *firefox) navigate(ctx context.Context, url string) error {
	_, err := f.call(ctx, "browsingContext.navigate", map[string]any{
		"context": f.context, "url": url, "wait": "complete",
	})
	return err
}
