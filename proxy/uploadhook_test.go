package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// hookStep is one read of scriptedBody: bytes fasthttp's reader hands
// over from memory, or a read of the client's connection, which runs the
// connection's read hook first (as clientConn.Read and tlsConn.Read do).
type hookStep struct {
	conn bool
	data string
	err  error
}

// scriptedBody plays fasthttp's chunked reader over a client connection
// whose reads run the hook a readHolder set (hookHolder).
type scriptedBody struct {
	holder *hookHolder
	steps  []hookStep
}

func (s *scriptedBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil // nextChunk's read of the framing
	}
	if len(s.steps) == 0 {
		return 0, io.EOF
	}
	st := &s.steps[0]
	if st.conn && s.holder.hook != nil {
		if err := s.holder.hook.beforeRead(); err != nil {
			// fasthttp wraps a failure within the chunk framing in
			// an ErrBrokenChunk, which does not unwrap.
			return 0, fmt.Errorf("cannot read chunk size: %v", err)
		}
	}
	n := copy(p, st.data)
	st.data = st.data[n:]
	if st.data != "" {
		return n, nil
	}
	err := st.err
	s.steps = s.steps[1:]
	return n, err
}

// hookHolder is a client connection's readHolder: it keeps the hook set.
type hookHolder struct {
	hook readHook
	sets int
}

func (h *hookHolder) holdReads(time.Time, holdLender) {}
func (h *hookHolder) setReadHook(f readHook) {
	h.hook = f
	h.sets++
}

// failingSandbox is the sandbox connection beneath the request's writer:
// it takes writes until it has taken limit bytes, then fails them all.
type failingSandbox struct {
	got   bytes.Buffer
	limit int
	err   error
	calls int
}

func (s *failingSandbox) Write(p []byte) (int, error) {
	s.calls++
	if s.got.Len()+len(p) > s.limit {
		return 0, s.err
	}
	return s.got.Write(p)
}

// Every way a chunked upload's copy ends (the body's end, the client's
// failure, the cap, the sandbox's failure in a write of its own, in the
// read hook's or in the last flush) leaves the client connection without
// the read hook, and the buffer pieces waited in handed back (pend nil);
// the copy returns the sandbox's error itself when a write to it failed,
// wherever that write was made, so that roundTrip tells it from the
// client's (isWriteErr), and the client's, or the cap's, otherwise; and the
// sandbox gets every byte read, in order, unless it failed.
func TestChunkedUploadHookEveryExit(t *testing.T) {
	sandboxErr := errors.New("sandbox write failed")
	clientErr := errors.New("client read failed")
	big := strings.Repeat("B", 5000)
	mem := func(s string) hookStep { return hookStep{data: s} }
	conn := func(s string) hookStep { return hookStep{conn: true, data: s} }
	for _, tc := range []struct {
		name    string
		steps   []hookStep
		limit   int64 // max_request_body (0: none)
		accepts int   // bytes the sandbox takes before failing (-1: all)
		wantErr error
		want    string // what the sandbox got
	}{
		{"ends", []hookStep{mem("a"), mem("b"), conn("c"), mem("d"), {conn: true, data: "e", err: io.EOF}}, 0, -1, nil, "abcde"},
		{"ends after a big piece", []hookStep{mem("a"), conn(big), mem("c"), {data: "d", err: io.EOF}}, 0, -1, nil, "a" + big + "cd"},
		{"client fails", []hookStep{mem("a"), mem("b"), {conn: true, err: clientErr}}, 0, -1, clientErr, "ab"},
		{"client fails behind pieces from memory", []hookStep{conn("a"), mem("b"), {err: clientErr}}, 0, -1, clientErr, "ab"},
		{"cap", []hookStep{mem("ab"), mem("cd"), mem("ef")}, 4, -1, errBodyTooLarge, "abcd"},
		{"cap at a read of the connection", []hookStep{mem("ab"), mem("cd"), conn("ef")}, 4, -1, errBodyTooLarge, "abcd"},
		{"sandbox fails in the hook", []hookStep{mem("a"), mem("b"), conn("c"), conn("d")}, 0, 1, sandboxErr, ""},
		{"sandbox fails in the hook at the cap", []hookStep{mem("ab"), mem("cd"), conn("ef")}, 4, 1, sandboxErr, ""},
		{"sandbox fails in the last flush", []hookStep{mem("a"), {data: "b", err: io.EOF}}, 0, 1, sandboxErr, ""},
		{"sandbox fails in a big write", []hookStep{conn("a"), conn(big)}, 0, 1, sandboxErr, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := &hookHolder{}
			src := &scriptedBody{holder: holder, steps: tc.steps}
			sandbox := &failingSandbox{limit: 1 << 30, err: sandboxErr}
			if tc.accepts >= 0 {
				sandbox.limit = tc.accepts
			}
			bw := bufio.NewWriterSize(sandbox, 4<<10)
			left := int64(1 << 30)
			if tc.limit > 0 {
				left = tc.limit
			}
			b := &clientBody{ctx: &fasthttp.RequestCtx{}, r: src, size: -1, left: left, hold: holder, bw: bw}
			_, err := b.WriteTo(bw)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("copy ended with %v, want %v", err, tc.wantErr)
			}
			if holder.hook != nil || holder.sets != 2 {
				t.Errorf("the hook is still set (%v) after %d sets, want removed after 2", holder.hook, holder.sets)
			}
			if b.pend != nil || b.coalesce || b.dst != nil {
				t.Errorf("left behind: pend %v, coalesce %v, dst %v", b.pend, b.coalesce, b.dst)
			}
			_ = bw.Flush()
			if got := sandbox.got.String(); got != tc.want {
				t.Errorf("the sandbox got %q, want %q", got, tc.want)
			}
		})
	}
}
