package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// SIGHUP is nginx's reload signal; here it reopens the access log and
// applies nothing else. An operator who edits the configuration file and
// sends it is told so, with the settings that changed (not one a flag
// overrides, which the file cannot change), and told when the file no
// longer loads (an unknown key, the file removed), since the next restart
// would fail. An unchanged file adds nothing to the log, and the running
// configuration is never touched. Before, every case logged only "access
// log reopened", which read as a reload.
func TestSIGHUPSaysTheConfigIsNotReloaded(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "cubeproxy.yaml")
	base := "http_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\nroutes: \"\"\naccess_log:\n  path: " +
		filepath.Join(dir, "access.log") + "\n"
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(conf, []byte(base+body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("drain_timeout: 2s\n")
	r := runServe(t, []string{"--config", conf, "--max-request-body", "1000"}, noEnv)

	type line struct {
		Msg     string   `json:"msg"`
		Config  string   `json:"config"`
		Changed []string `json:"changed"`
		Err     string   `json:"err"`
	}
	warnings := func() []line {
		var out []line
		for _, s := range strings.Split(r.logs.String(), "\n") {
			var l line
			if json.Unmarshal([]byte(s), &l) == nil && strings.HasPrefix(l.Msg, "SIGHUP: the configuration file") {
				out = append(out, l)
			}
		}
		return out
	}
	hups := 0
	// hup sends SIGHUP and returns once its check has run: the loop calls
	// the check before it starts the reopen that logs its line.
	hup := func() []line {
		t.Helper()
		before := len(warnings())
		reopened := strings.Count(r.logs.String(), `"msg":"access log reopened"`)
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 5*time.Second, "the access log reopened", func() bool {
			return strings.Count(r.logs.String(), `"msg":"access log reopened"`) > reopened
		})
		testenv.WaitFor(t, 5*time.Second, "the configuration checked", func() bool { return r.a.rechecks.Load() == 0 })
		// The process log is queued: a line logged after the check's
		// warning is written after it, so once it is in the logs, the
		// warning is too.
		hups++
		marker := fmt.Sprintf("sighup-checked-%d", hups)
		r.a.log.Info(marker)
		testenv.WaitFor(t, 5*time.Second, "the process log flushed", func() bool { return strings.Contains(r.logs.String(), marker) })
		return warnings()[before:]
	}

	if got := hup(); len(got) != 0 {
		t.Errorf("SIGHUP with the file unchanged logged %+v, want nothing", got)
	}

	write("drain_timeout: 3s\nmax_request_body: 5\nupstream:\n  max_conns: 7\n")
	got := hup()
	if len(got) != 1 || !strings.Contains(got[0].Msg, "changed since start") || got[0].Config != conf ||
		!slices.Equal(got[0].Changed, []string{"drain_timeout", "upstream.max_conns"}) {
		t.Errorf("SIGHUP after an edit logged %+v, want one warning naming drain_timeout and upstream.max_conns (max_request_body is the flag's)", got)
	}

	// Values the file's own checks pass and serve's start refuses: a
	// restart would fail, so "restart to apply it" would mislead.
	for _, c := range []struct{ body, err string }{
		{"log_level: verbose\n", "log_level"},
		{"store: redi\n", "store"},
		{"auth:\n  exempt_ports: [0]\n", "auth.exempt_ports"},
		{"tls:\n  redirect_port: 8443\n", "tls.redirect_port"},
		{"store: redis\nredis:\n  addr: 127.0.0.1:6379\n  url: redis://127.0.0.1:6379\n", "redis.addr and redis.url"},
	} {
		write(c.body)
		if got := hup(); len(got) != 1 || !strings.Contains(got[0].Msg, "no longer loads") || !strings.Contains(got[0].Err, c.err) {
			t.Errorf("SIGHUP with %q logged %+v, want one warning that the file no longer loads, naming %s", c.body, got, c.err)
		}
	}

	write("drain_timeou: 3s\n")
	if got := hup(); len(got) != 1 || !strings.Contains(got[0].Msg, "no longer loads") || !strings.Contains(got[0].Err, "unknown key drain_timeou") {
		t.Errorf("SIGHUP with an unknown key logged %+v, want one warning that the file no longer loads, with the key", got)
	}

	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	if got := hup(); len(got) != 1 || !strings.Contains(got[0].Msg, "no longer loads") || !strings.Contains(got[0].Err, "no such file") {
		t.Errorf("SIGHUP with the file removed logged %+v, want one warning that the file no longer loads", got)
	}

	if d := r.a.server.Config().DrainTimeout; d != 2*time.Second {
		t.Errorf("drain_timeout after the SIGHUPs: %v, want the 2s it started with", d)
	}
	r.stop()
}
