package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// resp is one answer as the client read it.
type resp struct {
	Proto    string `json:"proto"`
	Status   int    `json:"status"`
	Interim  []int  `json:"interim,omitempty"`
	Headers  []hdr  `json:"headers"`
	Framing  string `json:"framing"` // "cl", "chunked", "close", "none"
	Body     []byte `json:"body,omitempty"`
	Trailers []hdr  `json:"trailers,omitempty"`
	Err      string `json:"err,omitempty"`
}

// from says who wrote the answer: the sandbox marks each of its own.
func (r resp) from() string {
	if len(getAll(r.Headers, "X-Lab")) > 0 {
		return "sandbox"
	}
	return "proxy"
}

// clientView is what the client got: its answers, and whether the
// connection was still open after the last one.
type clientView struct {
	Resps []resp `json:"responses"`
	Conn  string `json:"conn"` // "open", "closed", "reset", "extra bytes", "?"
	Err   string `json:"err,omitempty"`
}

const waitMarker = "{wait100}"

// pauseMarker in a case's bytes holds the rest back for 200 ms: the answers
// to what went before have arrived by then, and the next request goes out
// on a connection that has been idle.
const pauseMarker = "{pause}"

// longPauseMarker holds the rest back for 1 s, for a case whose sandbox
// must have written to the idle connection before the next request goes
// out (strayWhenIdle, 50 ms after its answer): at 200 ms from the client's
// write, a first answer that took 150 ms on loaded cores left the next
// request racing the sandbox's stray 408.
const longPauseMarker = "{pause1s}"

// writeRaw writes s, pausing at each pauseMarker and longPauseMarker.
func writeRaw(conn net.Conn, s string) error {
	for {
		at, marker, pause := -1, "", time.Duration(0)
		for _, p := range []struct {
			marker string
			d      time.Duration
		}{{pauseMarker, 200 * time.Millisecond}, {longPauseMarker, time.Second}} {
			if i := strings.Index(s, p.marker); i >= 0 && (at < 0 || i < at) {
				at, marker, pause = i, p.marker, p.d
			}
		}
		if at < 0 {
			_, err := io.WriteString(conn, s)
			return err
		}
		if _, err := io.WriteString(conn, s[:at]); err != nil {
			return err
		}
		time.Sleep(pause)
		s = s[at+len(marker):]
	}
}

// runClient sends c's bytes on a new connection and reads c.nresp answers.
// A {wait100} marker in the bytes sends what is before it, waits for an
// interim 100 (or a final answer, after which the rest is not sent) and then
// sends the rest, as a client honouring Expect: 100-continue does.
func runClient(c tcase, addr, tag string) (v clientView) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		v.Err = "dial: " + err.Error()
		return v
	}
	defer conn.Close()
	raw := strings.ReplaceAll(c.raw, "{case}", "X-Lab-Case: "+tag+"\r\n")
	br := bufio.NewReader(conn)
	conn.SetDeadline(time.Now().Add(4 * time.Second))
	first, rest, split := strings.Cut(raw, waitMarker)
	if err := writeRaw(conn, first); err != nil {
		v.Err = "write: " + err.Error()
		return v
	}
	nresp := c.nresp
	if nresp == 0 {
		nresp = 1
	}
	heads := headRequests(c.raw)
	if split {
		conn.SetReadDeadline(time.Now().Add(time.Second))
		r, err := readHead(br)
		conn.SetDeadline(time.Now().Add(4 * time.Second))
		switch {
		case err != nil && isTimeout(err):
			// No 100 within a second: send the body anyway, as curl does.
			io.WriteString(conn, rest)
		case err != nil:
			v.Err = "read: " + err.Error()
			return v
		case r.Status == 100:
			io.WriteString(conn, rest)
		default: // a final answer instead of 100
			finishResp(br, &r, len(heads) > 0 && heads[0])
			v.Resps = append(v.Resps, r)
			v.Conn = connState(conn, br)
			return v
		}
		if err == nil {
			// the 100 is recorded as the first answer's interim
			defer func() {
				if len(v.Resps) > 0 {
					v.Resps[0].Interim = append([]int{100}, v.Resps[0].Interim...)
				}
			}()
		}
	}
	for i := 0; i < nresp; i++ {
		r, err := readResp(br, i < len(heads) && heads[i])
		if err != nil {
			if errors.Is(err, io.EOF) && len(v.Resps) > 0 {
				v.Err = fmt.Sprintf("closed after %d answers", len(v.Resps))
			} else {
				v.Err = "read: " + errText(err)
			}
			v.Conn = "?"
			return v
		}
		v.Resps = append(v.Resps, r)
		if r.Framing == "close" || r.Framing == "upgraded" {
			v.Conn = "closed"
			return v
		}
	}
	v.Conn = connState(conn, br)
	return v
}

// connState: after the last answer, is the connection still open? A closed
// one reads EOF (or a reset) at once; an open one times out.
func connState(conn net.Conn, br *bufio.Reader) string {
	if br.Buffered() > 0 {
		b, _ := br.Peek(br.Buffered())
		return "extra bytes: " + strconv.Quote(string(b))
	}
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	b := make([]byte, 512)
	n, err := conn.Read(b)
	switch {
	case n > 0:
		return "extra bytes: " + strconv.Quote(string(b[:n]))
	case isTimeout(err):
		return "open"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	default:
		return "closed"
	}
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func errText(err error) string {
	switch {
	case isTimeout(err):
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	}
	return err.Error()
}

// readHead reads a status line and headers.
func readHead(br *bufio.Reader) (resp, error) {
	var r resp
	line, err := readLine(br)
	if err != nil {
		return r, err
	}
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	r.Proto = proto
	r.Status, err = strconv.Atoi(code)
	if err != nil {
		return r, fmt.Errorf("status line %q", line)
	}
	r.Headers, err = readHeaders(br)
	return r, err
}

// readResp reads one answer, interim ones folded into it.
func readResp(br *bufio.Reader, head bool) (resp, error) {
	var interim []int
	for {
		r, err := readHead(br)
		if err != nil {
			return r, err
		}
		if r.Status >= 100 && r.Status < 200 && r.Status != 101 {
			interim = append(interim, r.Status)
			continue
		}
		r.Interim = interim
		finishResp(br, &r, head)
		return r, nil
	}
}

// finishResp reads the body by the answer's framing.
func finishResp(br *bufio.Reader, r *resp, head bool) {
	var err error
	switch cl := getAll(r.Headers, "Content-Length"); {
	case r.Status == 101: // what follows is the upgraded protocol's, to its end
		r.Framing = "upgraded"
		r.Body, err = io.ReadAll(br)
	case head || r.Status == 204 || r.Status == 304:
		r.Framing = "none"
	case hasToken(r.Headers, "Transfer-Encoding", "chunked"):
		r.Framing = "chunked"
		r.Body, r.Trailers, err = readChunked(br)
	case len(cl) > 0:
		r.Framing = "cl"
		n, perr := strconv.Atoi(cl[0])
		if perr != nil {
			r.Err = "content-length " + cl[0]
			return
		}
		r.Body = make([]byte, n)
		var got int
		got, err = io.ReadFull(br, r.Body)
		r.Body = r.Body[:got]
	default:
		r.Framing = "close"
		r.Body, err = io.ReadAll(br)
	}
	if err != nil {
		r.Err = "body: " + errText(err)
	}
}

// headRequests says, for each request in raw (each has its {case} line right
// after its request line), whether it is a HEAD, whose answer has no body.
func headRequests(raw string) []bool {
	parts := strings.Split(raw, "{case}")
	heads := make([]bool, 0, len(parts))
	for _, p := range parts[:len(parts)-1] {
		p = strings.TrimSuffix(p, "\r\n")
		line := p[strings.LastIndex(p, "\n")+1:]
		// The line may begin with the body of the request before it.
		heads = append(heads, strings.Contains(line, "HEAD "))
	}
	return heads
}
