package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// firefox is a headless Firefox driven over WebDriver BiDi, the protocol
// Firefox speaks to automation (it dropped the DevTools protocol chromedp
// needs). The test needs two commands of it, so a JSON exchange on a
// WebSocket is all of the client: no driver binary, no Node.
type firefox struct {
	conn    *websocket.Conn
	context string // the browsing context (tab) pages open in
	id      int
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
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start firefox: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	// Port 0 lets Firefox pick; it prints the address it listens on.
	found := make(chan string, 1)
	go func() {
		var log []string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if addr, ok := strings.CutPrefix(line, "WebDriver BiDi listening on "); ok {
				found <- addr
				for sc.Scan() { // keep the pipe drained
				}
				return
			}
			log = append(log, line)
		}
		found <- strings.Join(log, "\n") // exited without listening
	}()
	var addr string
	select {
	case addr = <-found:
		if !strings.HasPrefix(addr, "ws://") {
			t.Fatalf("firefox exited without starting WebDriver BiDi; its stderr:\n%s", addr)
		}
	case <-time.After(time.Minute):
		t.Fatal("firefox did not start WebDriver BiDi within a minute")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, addr+"/session", nil)
	if err != nil {
		t.Fatalf("connect to firefox at %s: %v", addr, err)
	}
	conn.SetReadLimit(-1)
	t.Cleanup(func() { conn.CloseNow() })
	f := &firefox{conn: conn}
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

// call sends one command and returns its result. The session subscribes
// to no events, so every message is an answer; one of another id would
// be a bug of this client's.
func (f *firefox) call(ctx context.Context, method string, params map[string]any) (json.RawMessage, error) {
	f.id++
	msg, err := json.Marshal(map[string]any{"id": f.id, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	if err := f.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, fmt.Errorf("firefox %s: %w", method, err)
	}
	_, raw, err := f.conn.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("firefox %s: %w", method, err)
	}
	var answer struct {
		ID      int
		Type    string
		Error   string
		Message string
		Result  json.RawMessage
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return nil, fmt.Errorf("firefox %s: answer %s: %w", method, raw, err)
	}
	if answer.Type != "success" || answer.ID != f.id {
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
