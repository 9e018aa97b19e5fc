package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// pieces serves b in pieces of random sizes up to max, then io.EOF.
func pieces(b []byte, r *rand.Rand, max int) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(b) == 0 {
			return nil, io.EOF
		}
		n := min(1+r.IntN(max), len(b))
		p := b[:n]
		b = b[n:]
		return p, nil
	}
}

func gzipped(t *testing.T, level int, flushEvery int, hdr gzip.Header, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		t.Fatal(err)
	}
	w.Header = hdr
	for i := 0; i < len(data); {
		n := len(data) - i
		if flushEvery > 0 {
			n = min(n, flushEvery)
		}
		if _, err := w.Write(data[i : i+n]); err != nil {
			t.Fatal(err)
		}
		if flushEvery > 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		i += n
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The eager decoder must decode what compress/gzip writes, at every level
// and block type, whatever the read boundaries.
func TestGunzipEagerDecodesCompressGzip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 80_000) // beyond the 32 KiB window
	for i := range text {
		text[i] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/\n "[r.IntN(66)]
	}
	events := sseEvents([]int64{1, 2, 3, 1796016246838663993}, 4096)
	data := map[string][]byte{
		"empty":    nil,
		"one byte": []byte("x"),
		"repeats":  bytes.Repeat([]byte("data: abc\n\n"), 6_000), // long matches, far distances
		"text":     text,
		"events":   bytes.Repeat(events, 10),
	}
	hdrs := []gzip.Header{{}, {Name: "n.txt", Comment: "c", Extra: []byte{1, 2, 3}}}
	for name, d := range data {
		for _, level := range []int{gzip.NoCompression, gzip.BestSpeed, gzip.DefaultCompression, gzip.BestCompression, gzip.HuffmanOnly} {
			for _, flush := range []int{0, 1000} {
				for hi, hdr := range hdrs {
					if hi > 0 && (level != gzip.DefaultCompression || flush != 0) {
						// The header's fields come before any block: one
						// level and one flush show them read in pieces.
						continue
					}
					t.Run(fmt.Sprintf("%s/level%d/flush%d/hdr%d", name, level, flush, hi), func(t *testing.T) {
						z := gzipped(t, level, flush, hdr, d)
						for _, max := range []int{1, 7, 4096, len(z)} {
							var got []byte
							err := gunzipEager(pieces(z, r, max), func(b []byte, _ int64) bool { got = append(got, b...); return true },
								func() int64 { return 0 })
							if err != io.EOF {
								t.Fatalf("pieces of ≤%d: err %v, want io.EOF at the end of the member", max, err)
							}
							if !bytes.Equal(got, d) {
								t.Fatalf("pieces of ≤%d: decoded %d bytes, want %d (equal: %v)", max, len(got), len(d), bytes.Equal(got, d))
							}
						}
					})
				}
			}
		}
	}
}

func TestGunzipEagerRejectsCorruptInput(t *testing.T) {
	good := gzipped(t, gzip.DefaultCompression, 0, gzip.Header{}, []byte(strings.Repeat("hello, event stream ", 100)))
	for name, z := range map[string][]byte{
		"not gzip":  []byte("plain text, not gzip at all"),
		"truncated": good[:len(good)/2],
		"bad crc":   append(append([]byte{}, good[:len(good)-8]...), 0, 0, 0, 0, 0, 0, 0, 0),
	} {
		err := gunzipEager(pieces(z, rand.New(rand.NewPCG(1, 1)), 64), func([]byte, int64) bool { return true }, func() int64 { return 0 })
		if err == nil || err == io.EOF {
			t.Errorf("%s: err %v, want a decoding error", name, err)
		}
	}
}

// Every byte the input received so far encodes must be handed out before
// the decoder waits for more: a peer (nginx with gzip) sends buffers that
// end mid-block, and compress/gzip held the events already received until
// a later buffer ended the block, doubling nginx-platform's measured
// latency next to what zlib clients see.
func TestGunzipEagerHandsOutReceivedEventsBeforeWaiting(t *testing.T) {
	// Random padding, as the backend's: compresses like text, not to nothing.
	r := rand.New(rand.NewPCG(5, 6))
	event := func(ts int64) []byte {
		ev := []byte(fmt.Sprintf("data: %019d ", ts))
		for len(ev) < 254 {
			ev = append(ev, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[r.IntN(64)])
		}
		return append(ev, "\n\n"...)
	}
	e1, e2 := event(1796016246838663993), event(1796016246838700000)
	for _, level := range []int{gzip.NoCompression, gzip.BestSpeed, gzip.DefaultCompression} {
		t.Run(fmt.Sprint("level", level), func(t *testing.T) {
			// One block for both events; the first piece ends in e2's codes.
			z := gzipped(t, level, 0, gzip.Header{}, append(append([]byte{}, e1...), e2...))
			cut := len(z) - 8 - 64
			var got []byte
			calls := 0
			next := func() ([]byte, error) {
				calls++
				switch calls {
				case 1:
					return z[:cut], nil
				case 2:
					if !bytes.HasPrefix(got, e1) {
						t.Errorf("before waiting for more input, %d bytes were handed out; want the first event (%d)", len(got), len(e1))
					}
					return z[cut:], nil
				}
				return nil, io.EOF
			}
			at := int64(0)
			err := gunzipEager(next, func(b []byte, ts int64) bool { got = append(got, b...); return true },
				func() int64 { at++; return at })
			if !errors.Is(err, io.EOF) || !bytes.Equal(got, append(e1, e2...)) {
				t.Fatalf("err %v, decoded %q", err, got)
			}
		})
	}
}
