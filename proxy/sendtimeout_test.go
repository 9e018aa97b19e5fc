package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// client.write_timeout is renewed by every byte the client takes, as
// nginx's send_timeout: a client that reads steadily, however slowly, gets
// the whole answer, and only one that takes nothing for the timeout is cut.
// Before, the timeout bounded each piece (up to 64 KiB) whole: with a
// 300 ms timeout a client reading 96 KB/s through a 32 KiB send buffer
// (a slow client's autotuned one on a WAN is 80-120 KiB) was cut 0.3 s
// into the first piece; nginx 1.22 (send_timeout 2s, listen sndbuf=48k)
// served a 30 KB/s reader, whose 64 KiB pieces take 2.2 s each, to the end.
func TestWriteTimeoutRenewedByProgress(t *testing.T) {
	// Not t.Parallel, though it waits on slow readers: the other parallel
	// tests' start-up (TLS, harnesses, under -race) stalled a reader past
	// a 300 ms timeout in a clean-clone run. Its cases run in parallel
	// with each other, mostly asleep.
	//
	// The timeout is a second, and the readers' pace derives from it: a
	// tick is a tenth of it, and a reader takes a piece (64 KiB through
	// fasthttp, 16 KiB detached) in about two timeouts, so a timeout
	// bounding a piece whole still cuts it. With 300 ms, a reader starved
	// for half a second (load 11-18 on 2 cores) was cut, rightly; a
	// reader that took nothing for a whole timeout (measured: the longest
	// gap between its reads) proves nothing either way, and its case is
	// run again, up to three times.
	const timeout = time.Second
	const tickEvery = timeout / 10
	const fullSize = 160 << 10 // three pieces, the first two whole 64 KiB reads
	body := strings.Repeat("x", fullSize)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		size := fullSize
		if n, err := strconv.Atoi(r.URL.Query().Get("n")); err == nil {
			size = n
		}
		switch r.URL.Path {
		case "/sized":
			w.Header().Set("Content-Length", fmt.Sprint(size))
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
		}
		piece := 32 << 10
		if r.URL.Query().Has("whole") {
			piece = size // the proxy reads as much as its buffer takes
		}
		for i := 0; i < size; i += piece {
			io.WriteString(w, body[i:min(size, i+piece)])
			w.(http.Flusher).Flush()
		}
	}))
	for _, tc := range []writeTimeoutCase{
		{name: "sized", path: "/sized"},
		// No chunked case: fasthttp writes a chunked body in 4 KiB
		// pieces (its copy buffer), each given its own deadline when
		// bodyStream.Read returns it, and a piece's write waits at most
		// once: the wake-up comes when a third of the send buffer is
		// free (above, 32 KiB), more than the rest of any piece, so
		// progress has nothing to renew. Such a case passed with the
		// renewal switched off. With a smaller buffer a piece can wait
		// twice, but a reader slow enough for a piece to outlast the
		// timeout (8 KB/s, through 8 KiB or the kernel's smallest) left
		// its write without a wake-up for over 300 ms on this client's
		// tiny window: cut with the renewal or without it.
		{name: "sized over TLS", path: "/sized", tls: true},
		{name: "a pause longer than the timeout cuts", path: "/sized", pause: 2 * timeout, cut: true},
		// Detached streams write to the connection themselves, not
		// through fasthttp: an event stream, and any body for HTTP/1.0.
		// Their pieces are the sandbox's reads (16 KiB here): at 10 KB/s
		// each takes 1.6 s, longer than the timeout. (A smaller send
		// buffer: the kernel wakes a waiting write once a third of it is
		// free, which through 32 KiB came up to a third of the timeout
		// apart.) 40 KiB, under three such pieces, is enough: past the
		// ~12 KiB the two sockets buffer, each piece after the first
		// waits 1.6 s on the client, so a timeout bounding a piece whole
		// cuts the second.
		{name: "event stream", path: "/events?whole", read: 1 << 10, size: 40 << 10},
		{name: "event stream paused longer than the timeout cuts", path: "/events?whole", pause: 2 * timeout, cut: true},
		{name: "HTTP/1.0 unframed", path: "/chunked?whole", http10: true, read: 1 << 10, size: 40 << 10},
		{name: "HTTP/1.0 unframed paused longer than the timeout cuts", path: "/chunked?whole", http10: true, pause: 2 * timeout, cut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for range 3 {
				if !tc.run(t, port, cmp.Or(tc.size, fullSize), timeout, tickEvery) {
					return
				}
			}
			t.Fatalf("in three runs the reader was starved for the whole timeout (%v)", timeout)
		})
	}
}

// writeTimeoutCase is a case of TestWriteTimeoutRenewedByProgress.
type writeTimeoutCase struct {
	name, path string
	http10     bool // an HTTP/1.0 request: the stream is detached, its body unframed
	tls        bool
	pause      time.Duration // the client stops reading this long after 8 KiB
	read       int           // bytes read per tick; 0: 3 KiB (30 KB/s)
	size       int           // the answer's bytes; 0: the test's fullSize
	cut        bool
}

// run runs the case once, for an answer of size bytes, and reports whether
// its steady reader was starved (took nothing for the whole timeout): a
// cut was then right, and nothing was checked.
func (tc writeTimeoutCase) run(t *testing.T, port uint16, size int, timeout, tickEvery time.Duration) (starved bool) {
	t.Helper()
	h, logs := logHarness(t, accesslog.FormatJSON, func(o *harnessOpts) { o.srv.ClientWriteTimeout = timeout })
	host := h.route("slowreader", port)
	sndbuf := 16 << 10 // 32 KiB: the kernel doubles it
	if tc.read > 0 {
		sndbuf = 4 << 10
	}
	ln := listenSmallSendBuffer(t, sndbuf)
	var c net.Conn = dialSmallWindow(t, ln.Addr().String())
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if tc.tls {
		ca := testenv.NewCA(t, "send timeout CA")
		cert := ca.Certificate(t, "*.cube.test")
		go h.server.ServeTLS(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		c = tls.Client(c, &tls.Config{RootCAs: ca.Pool(), ServerName: host})
	} else {
		go h.server.Serve(ln)
	}
	id := "slow-" + strings.ReplaceAll(tc.name, " ", "-")
	proto := "HTTP/1.1"
	if tc.http10 {
		proto = "HTTP/1.0"
	}
	path := tc.path
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	path += fmt.Sprintf("%sn=%d", sep, size)
	fmt.Fprintf(c, "GET %s %s\r\nHost: %s\r\nX-Cube-Request-Id: %s\r\nConnection: close\r\n\r\n", path, proto, host, id)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 3 KiB (or tc.read) a tick.
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	buf := make([]byte, cmp.Or(tc.read, 3<<10))
	got, start := 0, time.Now()
	paused := false
	var gap time.Duration // the longest between reads, the pause aside
	last := start
	for {
		if tc.pause > 0 && !paused && got >= 8<<10 {
			paused = true
			time.Sleep(tc.pause)
			last = time.Now()
		}
		n, err := io.ReadFull(resp.Body, buf)
		got += n
		gap, last = max(gap, time.Since(last)), time.Now()
		if err != nil {
			break
		}
		<-tick.C
	}
	e := logs.waitJSON(t, id)
	if tc.cut {
		if got >= size || e["error_code"] != CodeClientWriteTimeout {
			t.Errorf("a client that paused %v got %d of %d bytes, logged %q; want it cut (%s)", tc.pause, got, size, e["error_code"], CodeClientWriteTimeout)
		}
		return false
	}
	if got != size || e["error_code"] != "" {
		if gap >= timeout {
			t.Logf("the reader took nothing for %v, the whole timeout: run again", gap.Round(time.Millisecond))
			return true
		}
		t.Errorf("a client reading steadily got %d of %d bytes in %v (at most %v between reads), logged %q after %v s; want all of it",
			got, size, time.Since(start).Round(time.Millisecond), gap.Round(time.Millisecond), e["error_code"], e["request_time"])
	}
	return false
}

// listenSmallSendBuffer listens on loopback with an SO_SNDBUF of size,
// which accepted connections inherit: loopback's autotuning grows a send
// buffer to megabytes, where a slow client on a WAN keeps about 100 KiB.
func listenSmallSendBuffer(t *testing.T, size int) net.Listener {
	t.Helper()
	return listenWithBuffer(t, syscall.SO_SNDBUF, size)
}

// clientConnPair is a clientConn with the given write timeout on a
// 16 KiB send buffer, and its peer, whose receive window is small.
func clientConnPair(t *testing.T, timeout time.Duration) (net.Conn, net.Conn) {
	t.Helper()
	ln := listenSmallSendBuffer(t, 16<<10)
	peer := dialSmallWindow(t, ln.Addr().String())
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("accepted %T, want a *net.TCPConn", c)
	}
	return newClientConn(tcp, nil, timeout), peer
}

// A clientConn watching its sends keeps net.TCPConn's contract: writes from several goroutines
// each arrive whole, a peer that takes nothing is a timeout (Op "write")
// after the deadline, and a peer that reset is a reset, not a timeout.
func TestClientConnKeepsTCPConnErrors(t *testing.T) {
	pair := func(t *testing.T) (net.Conn, net.Conn) { return clientConnPair(t, 200*time.Millisecond) }
	t.Run("concurrent writes arrive whole", func(t *testing.T) {
		c, peer := pair(t)
		const block = 64 << 10
		errs := make(chan error, 2)
		for _, b := range []byte("ab") {
			go func() {
				_, err := c.Write(bytes.Repeat([]byte{b}, block))
				errs <- err
			}()
		}
		got := make([]byte, 2*block)
		if _, err := io.ReadFull(peer, got); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got[0] == got[block] || bytes.Count(got[:block], got[:1]) != block || bytes.Count(got[block:], got[block:block+1]) != block {
			t.Fatalf("the two writes interleaved: first block %q..., second %q...", got[:8], got[block:block+8])
		}
	})
	t.Run("a peer that takes nothing times out", func(t *testing.T) {
		c, _ := pair(t)
		_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		start := time.Now()
		n, err := c.Write(make([]byte, 4<<20))
		var oe *net.OpError
		if !isTimeout(err) || !errors.As(err, &oe) || oe.Op != "write" {
			t.Fatalf("write to a peer reading nothing: %d bytes, %v; want a write timeout", n, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the timeout came after %v, want about 200 ms", d)
		}
	})
	// What the tunnel's close and a kill do to a write blocked on a
	// client that reads nothing: it ends at once, with the error
	// net.TCPConn's would have, and so does a write queued behind it.
	for _, stop := range []struct {
		name  string
		do    func(net.Conn)
		check func(error) bool
	}{
		{"a close ends waiting writes at once", func(c net.Conn) { c.Close() }, func(err error) bool { return errors.Is(err, net.ErrClosed) }},
		{"a past deadline ends waiting writes at once", func(c net.Conn) { _ = c.SetDeadline(time.Unix(1, 0)) }, isTimeout},
	} {
		t.Run(stop.name, func(t *testing.T) {
			c, _ := pair(t)
			raw, err := c.(*clientConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			testenv.Fill(t, raw) // the kernel takes nothing more
			errs := make(chan error, 2)
			for range 2 {
				go func() {
					_, err := c.Write(make([]byte, 1<<10))
					errs <- err
				}()
			}
			// Only this test's goroutines are counted: another's still in
			// a clientConn's Write (an earlier test's proxy not yet torn
			// down) would keep the count above 2. The wait only bounds a
			// hang: the race run on a loaded machine once outlasted 5 s.
			testenv.WaitFor(t, 30*time.Second, "both writes waiting", func() bool {
				n := 0
				for _, s := range testenv.Stacks() {
					if strings.Contains(s, "(*clientConn).Write") && strings.Contains(s, "created by github.com/cube-sandbox/cubeproxy/proxy.TestClientConnKeepsTCPConnErrors.") {
						n++
					}
				}
				return n == 2
			})
			start := time.Now()
			stop.do(c)
			for range 2 {
				select {
				case err := <-errs:
					var oe *net.OpError
					if !stop.check(err) || !errors.As(err, &oe) || oe.Op != "write" {
						t.Errorf("the write ended with %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a write still waits 5 s after it was stopped")
				}
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("the writes ended %v after they were stopped", d)
			}
		})
	}
	t.Run("a peer that reset is a reset", func(t *testing.T) {
		c, peer := pair(t)
		_ = peer.(*net.TCPConn).SetLinger(0)
		peer.Close()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		var err error
		for err == nil { // the first write may go out before the RST is seen
			_, err = c.Write(make([]byte, 64<<10))
		}
		if !isConnReset(err) || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			t.Fatalf("write to a peer that reset: %v; want ECONNRESET or EPIPE", err)
		}
	})
}

// io.Copy into a clientConn from a reader without WriteTo goes through
// its ReadFrom: the embedded *net.TCPConn's wrote around Write, so a copy
// to a slow but steady client was cut at the first deadline.
func TestClientConnCopyRenewsAsWritesDo(t *testing.T) {
	t.Parallel() // waits on a slow reader
	// Three seconds, not the 200 ms the other cases take: a reader
	// starved for 200 ms, then 500 ms, then over a second (load 11-18 on
	// 2 cores, under -race) is not the defect this case looks for, and
	// failed it. The reader takes at most 3 KiB a 30 ms tick, 100 KB/s,
	// so the copy lasts at least 5.2 s, past the first deadline however
	// fast the machine; a tick missed under load only slows it.
	const timeout = 3 * time.Second
	c, peer := clientConnPair(t, timeout)
	const size = 512 << 10
	got := make(chan int, 1)
	go func() {
		tick := time.NewTicker(30 * time.Millisecond)
		defer tick.Stop()
		buf := make([]byte, 3<<10)
		n := 0
		for n < size {
			m, err := peer.Read(buf)
			n += m
			if err != nil {
				break
			}
			<-tick.C
		}
		got <- n
	}()
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	start := time.Now()
	src := struct{ io.Reader }{bytes.NewReader(make([]byte, size))} // no WriteTo
	n, err := io.Copy(c, src)
	if err != nil || n != size {
		t.Fatalf("copy to a steady reader: %d of %d bytes in %v, %v; want all of it", n, size, time.Since(start).Round(time.Millisecond), err)
	}
	// Past the first deadline (start + timeout) only if it was renewed;
	// a quarter more, so that the renewal was not the last write's.
	if d := time.Since(start); d < timeout*5/4 {
		t.Fatalf("the copy took %v: the reader was not slow enough to need a renewal", d)
	}
	if r := <-got; r != size {
		t.Fatalf("the reader got %d of %d bytes", r, size)
	}
}
