package main

import (
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// SIGUSR2 is nginx's binary upgrade (a new master beside the old one).
// Here it does nothing, which said nothing either: the operator's next
// step, SIGQUIT to the old master, is a stack dump and exit 2 here, every
// stream cut. It is logged with the way this proxy is upgraded, and the
// proxy keeps serving.
func TestSIGUSR2SaysThereIsNoBinaryUpgrade(t *testing.T) {
	r := runServe(t, []string{"--config=", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes", "",
		"--access-log-format", "off", "--drain-timeout", "1s"}, noEnv)
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	// A warning: with log_level warn, as production runs, an info line
	// would never reach the operator who sent the signal.
	const want = `"level":"WARN","msg":"SIGUSR2: no binary upgrade here (nginx's USR2); start the new binary beside this one with reuse_port, then SIGTERM this one (SIGQUIT is no graceful stop)"`
	testenv.WaitFor(t, 5*time.Second, "SIGUSR2 answered", func() bool {
		return strings.Contains(r.logs.String(), want)
	})
	resp, err := http.Get("http://" + r.a.adminLn.Addr().String() + "/readyz")
	if err != nil {
		t.Fatalf("readyz after SIGUSR2: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("readyz after SIGUSR2: %d, want 200", resp.StatusCode)
	}
	r.stop()
}
