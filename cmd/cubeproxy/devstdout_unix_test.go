//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// fileText is a fmt.Stringer of a file's current contents.
type fileText string

func (p fileText) String() string { b, _ := os.ReadFile(string(p)); return string(b) }

// An access_log path of /dev/stdout, as nginx configurations and images
// write it, is the access log on stdout, as `-` is. Opened as a path, it
// was a second open of stdout beside the process log's: with stdout a file
// a shell opened with `>` (no O_APPEND), the process log wrote at its own
// offset over the access log's lines (a "shutting down" line over the
// first request's), and with stdout a socket (systemd's
// StandardOutput=journal) the open failed with ENXIO and serve did not
// start. The binary's real stdout is each of these; every line of the
// output must parse, the access line and "stopped" among them.
func TestAccessLogPathDevStdoutIsStdout(t *testing.T) {
	bin := buildBinary(t)
	for _, kind := range []string{"file", "socket"} {
		t.Run(kind, func(t *testing.T) {
			var out fmt.Stringer
			var stdout *os.File
			switch kind {
			case "file":
				path := filepath.Join(t.TempDir(), "out.log")
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644) // a shell's `>`
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				stdout, out = f, fileText(path)
			case "socket":
				fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
				if err != nil {
					t.Fatal(err)
				}
				mine, theirs := os.NewFile(uintptr(fds[0]), "reader"), os.NewFile(uintptr(fds[1]), "stdout")
				defer theirs.Close()
				buf := new(syncBuffer)
				read := make(chan struct{})
				go func() {
					defer close(read)
					io.Copy(buf, mine)
				}()
				t.Cleanup(func() {
					mine.Close()
					<-read
				})
				stdout, out = theirs, buf
			}
			cmd := exec.Command(bin, "serve", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
				"--drain-timeout", "1s", "--access-log-path", "/dev/stdout")
			cmd.Stdout, cmd.Stderr = stdout, stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			httpAddr, _ := waitListening(t, out, exited)

			req, _ := http.NewRequest("GET", "http://"+httpAddr+"/devstdout-probe", nil)
			req.Host = "50005-nosuch.cube.test"
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			testenv.WaitFor(t, 5*time.Second, "the access line", func() bool {
				return strings.Contains(out.String(), "/devstdout-probe")
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := testenv.Recv(t, exited, 15*time.Second, "the exit after SIGTERM"); err != nil {
				t.Fatalf("exit: %v\n%s", err, out)
			}
			testenv.WaitFor(t, 5*time.Second, "the stopped line", func() bool {
				return strings.Contains(out.String(), `"msg":"stopped"`)
			})
			text := out.String()
			access := 0
			for _, ln := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(ln), &rec); err != nil {
					t.Errorf("line does not parse (%v): %q", err, ln)
					continue
				}
				if rec["request_uri"] == "/devstdout-probe" {
					access++
				}
			}
			if access != 1 {
				t.Errorf("%d access lines of the request, want 1:\n%s", access, text)
			}
		})
	}
}
