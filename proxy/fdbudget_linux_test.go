package proxy

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A client.max_conns the descriptor limit cannot hold is warned of when
// the server is built, as nginx warns of worker_connections over the open
// files limit: at 2 descriptors a stream the descriptors run out first,
// and new clients then wait in the listen backlog instead of getting 503
// proxy_overloaded (measured on the built binary at a 4,096 limit). It
// was silent, so an operator took client.max_conns for the bound. The
// limit is the process's own, read as the server reads it.
func TestNewServerWarnsOfMaxConnsOverFDLimit(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	fits := int((rl.Cur - descriptorHeadroom) / 2)
	for _, tc := range []struct {
		name     string
		maxConns int
		warn     bool
	}{
		{"unlimited", 0, false},
		{"fits", fits, false},
		{"one over", fits + 1, true},
		{"twice the limit", 2 * int(rl.Cur), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			newHarness(t, func(o *harnessOpts) {
				o.cfg.Logger = log
				o.srv.MaxClientConns = tc.maxConns
			})
			got := strings.Contains(logs.String(), "client.max_conns exceed what the open files limit holds")
			if got != tc.warn {
				t.Fatalf("client.max_conns %d at an open files limit of %d: warned %v, want %v\n%s", tc.maxConns, rl.Cur, got, tc.warn, logs.String())
			}
			if tc.warn && !strings.Contains(logs.String(), "max_conns_within_limit="+strconv.Itoa(fits)) {
				t.Errorf("the warning does not name the client.max_conns that fit (%d)\n%s", fits, logs.String())
			}
		})
	}
}
