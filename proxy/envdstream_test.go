package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// connectEnvelope frames msg as a Connect-protocol stream message: a flags
// byte (0x02 marks the end-of-stream message) and a big-endian length.
func connectEnvelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// readEnvelope reads one Connect-protocol stream message from r.
func readEnvelope(r io.Reader) (flags byte, msg []byte, err error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	msg = make([]byte, binary.BigEndian.Uint32(head[1:]))
	_, err = io.ReadFull(r, msg)
	return head[0], msg, err
}

// envd's server streams (process.Process/Start and Connect,
// filesystem.Filesystem/WatchDir: the platform's nginx turns buffering off
// for exactly these) are Connect-protocol streams: a POST answered 200
// with application/connect+json and a body of enveloped messages, the
// last one the end-of-stream message. Each message must reach the client
// while envd still holds the stream open (a command's first output line
// before it exits, a watch's first event), whether the client sent its
// request with a length (the Python SDK) or chunked (connect-go over
// HTTP/1.1), by host or by path, and a message split across writes or
// larger than a read (a command's 200 KiB of stdout) must come whole.
// envd sends its next message only once the client has the previous one.
func TestEnvdConnectStreamsFlushEachMessage(t *testing.T) {
	h := newHarness(t)
	big := bytes.Repeat([]byte("x"), 200<<10)
	ack := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := io.ReadAll(r.Body)
		if err != nil || r.Header.Get("Content-Type") != "application/connect+json" {
			http.Error(w, fmt.Sprint(err), 400)
			return
		}
		_, in, err := readEnvelope(bytes.NewReader(req))
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(200)
		f := w.(http.Flusher)
		msgs := [][]byte{
			[]byte(`{"event":{"start":{"pid":7},"echo":` + string(in) + `}}`),
			[]byte(`{"event":{"data":{"stdout":"aGVsbG8K"}}}`),
			[]byte(`{"event":{"data":{"stdout":"` + string(big) + `"}}}`),
		}
		for i, m := range msgs {
			env := connectEnvelope(0, m)
			if i == 1 {
				// The prefix alone first, as a writer that frames
				// before it encodes may send it.
				w.Write(env[:5])
				f.Flush()
				env = env[5:]
			}
			w.Write(env)
			f.Flush()
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			}
		}
		w.Write(connectEnvelope(2, []byte(`{}`)))
	}))
	host := h.route("envdstream", port)
	paths := []string{"/process.Process/Start", "/process.Process/Connect", "/filesystem.Filesystem/WatchDir"}
	for _, chunked := range []bool{false, true} {
		for _, byPath := range []bool{false, true} {
			for _, path := range paths {
				name := fmt.Sprintf("%s chunked=%v byPath=%v", path, chunked, byPath)
				t.Run(name, func(t *testing.T) {
					in := []byte(`{"process":{"cmd":"echo"}}`)
					var body io.Reader = bytes.NewReader(connectEnvelope(0, in))
					if chunked {
						body = io.MultiReader(body) // no length: sent chunked
					}
					r := h.req("POST", host, path, body)
					if byPath {
						r = h.req("POST", h.addr, "/sandbox/envdstream/"+itoa(port)+path, body)
					}
					r.Header.Set("Content-Type", "application/connect+json")
					r.Header.Set("Connect-Protocol-Version", "1")
					resp := h.do(r)
					defer resp.Body.Close()
					if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
						b, _ := io.ReadAll(resp.Body)
						t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
					}
					for i := 0; i < 3; i++ {
						flags, msg, err := readEnvelope(resp.Body)
						if err != nil || flags != 0 {
							t.Fatalf("message %d: flags %d, %v", i, flags, err)
						}
						switch i {
						case 0:
							if !bytes.Contains(msg, in) {
								t.Fatalf("first message %q lacks the request %q", msg, in)
							}
						case 2:
							if len(msg) != len(big)+len(`{"event":{"data":{"stdout":""}}}`) {
								t.Fatalf("large message: %d bytes", len(msg))
							}
						}
						select {
						case ack <- struct{}{}:
						case <-time.After(10 * time.Second):
							t.Fatal("envd never waited for the acknowledgement")
						}
					}
					flags, msg, err := readEnvelope(resp.Body)
					if err != nil || flags != 2 || string(msg) != "{}" {
						t.Fatalf("end-of-stream message: flags %d %q %v", flags, msg, err)
					}
					if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
						t.Fatalf("after the end-of-stream message: %q %v", rest, err)
					}
				})
			}
		}
	}
}

// A command's output stream (process.Process/Start) open while its
// sandbox is paused for longer than upstream.idle_timeout: a paused VM is
// silent by nature, and its open streams are left for it to resume, these
// too, though they get no heartbeats to mark the time (not an event
// stream). Once the sandbox runs again, the command's next message comes
// on the same stream.
func TestEnvdStreamOutlastsPause(t *testing.T) {
	t.Parallel()
	// Long enough for the resume's admin call, the acknowledgement and
	// envd's answer to fit in the whole timeout the resume gives, on a
	// loaded machine (TestStreamIdleCountsFromResume asserts that whole).
	const idle = 500 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	ack := make(chan struct{})
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(connectEnvelope(0, []byte(`{"event":{"start":{"pid":7}}}`)))
		w.(http.Flusher).Flush()
		select {
		case <-ack:
		case <-r.Context().Done():
			return
		}
		w.Write(connectEnvelope(0, []byte(`{"event":{"end":{"exitCode":0}}}`)))
		w.Write(connectEnvelope(2, []byte(`{}`)))
	}))
	host := h.route("envdpause", port)
	r := h.req("POST", host, "/process.Process/Start", bytes.NewReader(connectEnvelope(0, []byte(`{}`))))
	r.Header.Set("Content-Type", "application/connect+json")
	resp := h.do(r)
	defer resp.Body.Close()
	if _, msg, err := readEnvelope(resp.Body); err != nil || !bytes.Contains(msg, []byte("start")) {
		t.Fatalf("start message %q: %v", msg, err)
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"envdpause","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	type read struct {
		msg []byte
		err error
	}
	next := make(chan read, 1)
	go func() {
		_, msg, err := readEnvelope(resp.Body)
		next <- read{msg, err}
	}()
	select {
	case got := <-next:
		t.Fatalf("the paused sandbox's stream ended: %q %v", got.msg, got.err)
	case <-time.After(4 * idle): // four idle timeouts: the stream must still be open
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"envdpause","state":"running"}`, ""); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	select {
	case ack <- struct{}{}:
	case got := <-next:
		t.Fatalf("the stream ended after the resume, before envd spoke: %q %v", got.msg, got.err)
	case <-time.After(10 * time.Second):
		t.Fatal("envd never waited for the acknowledgement")
	}
	select {
	case got := <-next:
		if got.err != nil || !bytes.Contains(got.msg, []byte("exitCode")) {
			t.Fatalf("after the resume: %q %v", got.msg, got.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no message after the resume")
	}
	if flags, msg, err := readEnvelope(resp.Body); err != nil || flags != 2 {
		t.Fatalf("end-of-stream message: %d %q %v", flags, msg, err)
	}
}

// A sandbox resumed gets a whole upstream.idle_timeout from the resume to
// speak on the streams the pause left open, however the timeout's
// expiries during the pause fell. Re-armed only at those expiries, a
// stream was cut anywhere from at once to one timeout after the resume:
// a command's output that came a moment after the resume found it gone
// (TestEnvdStreamOutlastsPause failed so on a loaded machine). Four
// streams, opened an eighth of the timeout apart, so that the expiries of
// at most one of them can fall a whole timeout after the resume.
//
// Both ways a stream waits: an envd stream read through fasthttp
// (bodyStream.Read), and a GET event stream detached from it (copyEvents).
func TestStreamIdleCountsFromResume(t *testing.T) {
	t.Parallel()
	for _, detached := range []bool{false, true} {
		t.Run(fmt.Sprintf("detached=%v", detached), func(t *testing.T) {
			t.Parallel()
			// A run whose pause came after the first stream could expire
			// proves nothing (see streamIdleCountsFromResume): another,
			// on a fresh proxy, up to three in all.
			for range 3 {
				if streamIdleCountsFromResume(t, detached) {
					return
				}
			}
			t.Fatal("in three runs the four streams were not open and paused within upstream.idle_timeout of the first")
		})
	}
}

// streamIdleCountsFromResume reports false, having checked nothing, when
// the pause took effect too late: it must come within upstream.idle_timeout
// of the first stream's request, before which no stream can expire, or a
// stream cut before the pause is right. Opening the streams and the pause
// took over 0.8 s on a loaded machine.
func streamIdleCountsFromResume(t *testing.T, detached bool) bool {
	const idle = 1600 * time.Millisecond
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if detached {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: start\n\n")
		} else {
			w.Header().Set("Content-Type", "application/connect+json")
			w.Write(connectEnvelope(0, []byte(`{"event":{"start":{"pid":7}}}`)))
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done() // silent from then on
	}))
	host := h.route("resumeidle", port)
	ended := make(chan time.Time, 4)
	// The four open at once, each an eighth of the timeout after the one
	// before by the clock, not after its answer: opened one after
	// another, the four requests' latencies added up, and on loaded cores
	// under -race the pause came too late in every run.
	reqs := make([]*http.Request, 4)
	for i := range reqs {
		if detached {
			reqs[i] = h.req("GET", host, "/events", nil)
			reqs[i].Header.Set("Accept", "text/event-stream")
		} else {
			reqs[i] = h.req("POST", host, "/process.Process/Start", bytes.NewReader(connectEnvelope(0, []byte(`{}`))))
			reqs[i].Header.Set("Content-Type", "application/connect+json")
		}
	}
	type open struct {
		resp *http.Response
		err  error
	}
	opened := make([]chan open, 4)
	first := time.Now() // before the first stream's request: none expires before first+idle
	for i, r := range reqs {
		opened[i] = make(chan open, 1)
		go func() {
			time.Sleep(time.Until(first.Add(time.Duration(i) * idle / 8))) // this stream's expiries an eighth later
			resp, err := h.client.Do(r)
			if err != nil {
				opened[i] <- open{err: err}
				return
			}
			if resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			} else if detached {
				line := make([]byte, len("data: start"))
				if _, err = io.ReadFull(resp.Body, line); err == nil && string(line) != "data: start" {
					err = fmt.Errorf("start event %q", line)
				}
			} else if _, msg, rerr := readEnvelope(resp.Body); rerr != nil || !bytes.Contains(msg, []byte("start")) {
				err = fmt.Errorf("start message %.100q: %v", msg, rerr)
			}
			opened[i] <- open{resp, err}
		}()
	}
	for i := range opened {
		o := testenv.Recv(t, opened[i], 10*time.Second, fmt.Sprintf("stream %d to open", i))
		if o.resp != nil {
			defer o.resp.Body.Close()
		}
		if o.err != nil {
			t.Fatalf("stream %d: %v", i, o.err)
		}
		go func() {
			io.Copy(io.Discard, o.resp.Body)
			ended <- time.Now()
		}()
	}
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"resumeidle","state":"paused"}`, ""); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	if time.Since(first) >= idle {
		return false
	}
	select {
	case <-ended:
		t.Fatal("a paused sandbox's stream was cut")
	case <-time.After(2 * idle):
	}
	resumed := time.Now()
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"resumeidle","state":"running"}`, ""); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	for i := 0; i < 4; i++ {
		select {
		case at := <-ended:
			if took := at.Sub(resumed); took < idle*7/8 {
				t.Fatalf("a stream was cut %v after the resume, want a whole upstream.idle_timeout (%v)", took, idle)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a silent stream outlived upstream.idle_timeout after the resume")
		}
	}
	return true
}

// The same state sent again is no change of it: a control plane that
// re-sends running for a running sandbox (a periodic sync) must not give
// its silent streams a fresh upstream.idle_timeout each time, which kept
// them open for ever (pausedIdle reads the time of the last change as a
// resume's).
func TestResentRunningIsNoResume(t *testing.T) {
	t.Parallel()
	const idle = 2 * time.Second
	h := newHarness(t, func(o *harnessOpts) { o.cfg.IdleStreamTimeout = idle })
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(connectEnvelope(0, []byte(`{"event":{"start":{"pid":7}}}`)))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // silent from then on
	}))
	host := h.route("resent", port)
	r := h.req("POST", host, "/process.Process/Start", bytes.NewReader(connectEnvelope(0, []byte(`{}`))))
	r.Header.Set("Content-Type", "application/connect+json")
	resp := h.do(r)
	defer resp.Body.Close()
	if _, msg, err := readEnvelope(resp.Body); err != nil || !bytes.Contains(msg, []byte("start")) {
		t.Fatalf("start message %.100q: %v", msg, err)
	}
	silent := time.Now()
	ended := make(chan time.Time, 1)
	go func() {
		io.Copy(io.Discard, resp.Body)
		ended <- time.Now()
	}()
	time.Sleep(idle / 2)
	if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"resent","state":"running"}`, ""); st != 200 {
		t.Fatalf("running again: %d %s", st, body)
	}
	// Cut at idle after the last byte; a fresh timeout from the re-sent
	// state would cut it half a timeout later.
	if took := testenv.Recv(t, ended, 10*time.Second, "the silent stream's end").Sub(silent); took > idle*5/4 {
		t.Fatalf("the silent stream was cut %v after its last byte, want upstream.idle_timeout (%v): the re-sent state counted as a resume", took, idle)
	}
}
