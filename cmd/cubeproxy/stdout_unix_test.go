//go:build unix

package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// A stdout pipe as a container's log driver gives it: blocking, and
// stalled (full, its reader not reading). serve's two log writers wait for
// it in the runtime's poller, their goroutines parked, not in a write(2)
// that holds a thread and its processor: with GOMAXPROCS=1 that held every
// request for up to 20 ms at a time (README, Performance). Once the reader
// reads, the lines arrive, and after serve the pipe is blocking again, as
// it was handed over.
func TestStalledStdoutParksLogWriters(t *testing.T) {
	rd, wr := testenv.BlockingPipe(t) // not polled, as os.Stdout is
	raw, err := wr.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// Full before serve starts, and blocking again, as inherited.
	raw.Control(func(fd uintptr) { unix.SetNonblock(int(fd), true) })
	testenv.Fill(t, raw)
	raw.Control(func(fd uintptr) { unix.SetNonblock(int(fd), false) })

	r := runServeTo(t, []string{"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--routes=",
		"--drain-timeout", "1s"}, noEnv, wr)
	req, _ := http.NewRequest("GET", "http://"+r.a.httpLn.Addr().String()+"/stdout-probe", nil)
	req.Host = "50005-nosuch.cube.test"
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// writerState returns the state of the goroutine running fn once it
	// is in a write ("" before).
	writerState := func(fn string) string {
		for _, g := range testenv.Stacks() {
			if strings.Contains(g, fn) && strings.Contains(g, "os.(*File).Write") {
				head, _, _ := strings.Cut(g, "\n")
				return head
			}
		}
		return ""
	}
	// Both write to the one file: one waits for stdout, the other for
	// the file's write lock (semacquire), behind it.
	states := map[string]string{}
	for _, fn := range []string{"accesslog.(*Logger).run", "proclog.(*Writer).run"} {
		testenv.WaitFor(t, 10*time.Second, fn+" in a write to the stalled stdout", func() bool {
			states[fn] = writerState(fn)
			return states[fn] != ""
		})
	}
	parked := 0
	for fn, state := range states {
		if strings.Contains(state, "[syscall") {
			t.Errorf("%s waits for the stalled stdout in a system call (%q), holding a thread and its processor; want it parked in the poller", fn, state)
		}
		if strings.Contains(state, "[IO wait") {
			parked++
		}
	}
	if parked == 0 {
		t.Errorf("no log writer waits in the poller (IO wait): %q", states)
	}

	var got syncBuffer
	read := make(chan struct{})
	go func() { io.Copy(&got, rd); close(read) }()
	testenv.WaitFor(t, 10*time.Second, "the access log line once stdout is read", func() bool {
		return strings.Contains(got.String(), "/stdout-probe")
	})
	r.stop()
	var flags int
	raw.Control(func(fd uintptr) { flags, err = unix.FcntlInt(fd, unix.F_GETFL, 0) })
	if err != nil || flags&unix.O_NONBLOCK != 0 {
		t.Errorf("stdout after serve: flags %#x, %v; want blocking, as it was handed over", flags, err)
	}
	wr.Close()
	<-read
}
