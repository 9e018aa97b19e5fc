package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// goGunzip is the reference: what compress/gzip decodes from b (one member,
// as gunzipEager decodes), up to its error. compress/flate hands out what it
// decoded before an error or the end of its input, so for a prefix of a
// stream this is everything the prefix determines.
func goGunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	r.Multistream(false)
	return io.ReadAll(r)
}

// goRejectsLongHeaderString reports whether b's gzip header has a file name
// or comment compress/gzip refuses for its length alone (it reads them into
// a 512-byte buffer); RFC 1952 sets no limit, and neither does zlib nor
// gunzipEager, so such a header is no disagreement worth a finding.
func goRejectsLongHeaderString(b []byte) bool {
	if len(b) < 10 {
		return false
	}
	flg, p := b[3], b[10:]
	if flg&4 != 0 {
		if len(p) < 2 {
			return false
		}
		n := int(p[0]) | int(p[1])<<8
		if len(p) < 2+n {
			return false
		}
		p = p[2+n:]
	}
	for _, f := range []byte{8, 16} {
		if flg&f == 0 {
			continue
		}
		i := bytes.IndexByte(p, 0)
		if i < 0 {
			return len(p) >= 512
		}
		if i >= 512 {
			return true
		}
		p = p[i+1:]
	}
	return false
}

// withHeaderCRC returns the member z (as compress/gzip writes it, no
// FHCRC) with an FHCRC field added, right or wrong.
func withHeaderCRC(z []byte, right bool) []byte {
	// compress/gzip's header: 10 bytes, then FEXTRA/FNAME/FCOMMENT if set.
	n := 10
	flg := z[3]
	if flg&4 != 0 {
		n += 2 + (int(z[n]) | int(z[n+1])<<8)
	}
	for _, f := range []byte{8, 16} {
		if flg&f != 0 {
			n += bytes.IndexByte(z[n:], 0) + 1
		}
	}
	out := append([]byte{}, z[:n]...)
	out[3] |= 2
	c := crc32.ChecksumIEEE(out)
	if !right {
		c ^= 1
	}
	out = append(out, byte(c), byte(c>>8))
	return append(out, z[n:]...)
}

// FuzzGunzipEager holds gunzipEager to compress/gzip. For a stream
// compress/gzip wrote (from fuzzed data, level, header and flush points,
// optionally with one bit flipped) or for raw fuzzed bytes, fed in pieces
// of fuzzed sizes:
//   - it never panics, loops or emits more than DEFLATE can encode in the
//     bytes given (1032 per byte);
//   - before asking for the next piece, it has emitted at least everything
//     compress/gzip decodes from the bytes given so far (the eager property
//     the latency mode depends on);
//   - it never emits a byte compress/gzip would not, and it succeeds only
//     where compress/gzip does, with the same bytes;
//   - an unaltered compress/gzip stream decodes.
func FuzzGunzipEager(f *testing.F) {
	sse := sseEvents([]int64{1, 2, 3, 1796016246838663993}, 300)
	f.Add([]byte("hello, event stream"), false, uint8(6), uint64(0), uint64(1), uint16(1), uint32(0), uint8(0))
	f.Add(bytes.Repeat(sse, 20), false, uint8(1), uint64(3), uint64(2), uint16(7), uint32(0), uint8(1))
	f.Add(bytes.Repeat([]byte("data: abc\n\n"), 500), false, uint8(9), uint64(5), uint64(3), uint16(300), uint32(0), uint8(2))
	f.Add(sse, false, uint8(0), uint64(7), uint64(4), uint16(0), uint32(0), uint8(3))     // stored blocks
	f.Add(sse, false, uint8(11), uint64(9), uint64(5), uint16(2), uint32(0), uint8(0))    // HuffmanOnly
	f.Add(sse, false, uint8(6), uint64(11), uint64(6), uint16(5), uint32(1234), uint8(1)) // one bit flipped
	f.Add(sse, false, uint8(6), uint64(0), uint64(7), uint16(3), uint32(0), uint8(4))     // FHCRC, right
	f.Add(sse, false, uint8(6), uint64(0), uint64(8), uint16(3), uint32(0), uint8(5))     // FHCRC, wrong
	f.Add([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"), true, uint8(0), uint64(0), uint64(9), uint16(1), uint32(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, raw bool, level uint8, flushSeed, pieceSeed uint64, maxPiece uint16, flip uint32, hdrKind uint8) {
		if len(data) > 4<<10 {
			return // bounds the reference's output (1032 per byte) and the run time
		}
		z, valid := data, false
		if !raw {
			z, valid = fuzzGzipped(t, data, int(level)%11-2, flushSeed, hdrKind), true
			switch hdrKind % 8 {
			case 4:
				z = withHeaderCRC(z, true)
			case 5:
				z, valid = withHeaderCRC(z, false), false
			}
			if flip != 0 {
				i := int(flip>>3) % len(z)
				z[i] ^= 1 << (flip & 7)
				valid = false
			}
		}
		checkGunzipEager(t, z, valid, pieceSeed, int(maxPiece))
	})
}

// fuzzGzipped compresses data as compress/gzip does for a peer that
// flushes at points drawn from flushSeed.
func fuzzGzipped(t *testing.T, data []byte, level int, flushSeed uint64, hdrKind uint8) []byte {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		t.Fatal(err)
	}
	if hdrKind&1 != 0 {
		w.Header = gzip.Header{Name: "events.txt", Comment: "c", Extra: []byte{1, 2, 3}}
	}
	r := rand.New(rand.NewPCG(flushSeed, 1))
	for rest := data; len(rest) > 0; {
		n := len(rest)
		if flushSeed != 0 {
			n = min(n, 1+r.IntN(2048))
		}
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		if flushSeed != 0 && r.IntN(2) == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		rest = rest[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func checkGunzipEager(t *testing.T, z []byte, valid bool, pieceSeed uint64, maxPiece int) {
	t.Helper()
	r := rand.New(rand.NewPCG(pieceSeed, 2))
	maxPiece = 1 + maxPiece%(len(z)+1)
	var cuts []int // piece ends
	for end := 0; end < len(z); {
		end = min(len(z), end+1+r.IntN(maxPiece))
		cuts = append(cuts, end)
	}
	// Checking a cut costs a decode of the prefix: check about 32 of
	// them, always the first few (headers, first block).
	every := max(1, len(cuts)/32)

	goAll, goErr := goGunzip(z)
	lenient := goRejectsLongHeaderString(z)
	var got []byte
	given, calls := 0, 0
	next := func() ([]byte, error) {
		if calls > 0 && (calls < 8 || calls%every == 0) {
			want, _ := goGunzip(z[:given])
			if !bytes.HasPrefix(got, want) {
				t.Fatalf("after %d of %d bytes: emitted %d bytes, compress/gzip decodes %d from them (prefix equal: %v); the rest waits for input",
					given, len(z), len(got), len(want), bytes.Equal(got[:min(len(got), len(want))], want[:min(len(got), len(want))]))
			}
		}
		if calls == len(cuts) {
			calls++
			return nil, io.EOF
		}
		if calls > len(cuts) {
			t.Fatalf("next called again after io.EOF")
		}
		p := z[given:cuts[calls]]
		given = cuts[calls]
		calls++
		return p, nil
	}
	emit := func(b []byte, _ int64) bool {
		if len(b) == 0 {
			t.Fatalf("empty emit")
		}
		from := len(got)
		got = append(got, b...)
		if len(got) > 1032*given+(64<<10) {
			t.Fatalf("emitted %d bytes from %d input bytes: more than DEFLATE can encode", len(got), given)
		}
		// got[:from] was checked by the earlier calls.
		if !lenient && (len(got) > len(goAll) || !bytes.Equal(goAll[from:len(got)], b)) {
			t.Fatalf("emitted bytes %d to %d, compress/gzip does not decode them (it decodes %d, err %v)", from, len(got), len(goAll), goErr)
		}
		return true
	}
	// A loop would stall the fuzzer without a report: crash instead, so
	// that it keeps the input.
	watchdog := time.AfterFunc(10*time.Second, func() {
		panic(fmt.Sprintf("gunzipEager still running after 10s on %d input bytes (given %d, emitted %d)", len(z), given, len(got)))
	})
	err := gunzipEager(next, emit, func() int64 { return 0 })
	watchdog.Stop()
	switch {
	case err == nil:
		t.Fatalf("nil error, yet emit never stopped the decoding")
	case errors.Is(err, io.EOF):
		if lenient {
			break
		}
		if goErr != nil {
			t.Fatalf("decoded %d bytes and the trailer; compress/gzip fails: %v", len(got), goErr)
		}
		if !bytes.Equal(got, goAll) {
			t.Fatalf("decoded %d bytes, compress/gzip %d", len(got), len(goAll))
		}
	case valid:
		t.Fatalf("a stream compress/gzip wrote: %v (compress/gzip: %v)", err, goErr)
	}
}

// bitWriter writes a DEFLATE stream by hand: fields least significant bit
// first, Huffman codes most significant bit first (RFC 1951 3.1.1).
type bitWriter struct {
	out   []byte
	nbits uint
}

func (w *bitWriter) bits(v, n uint) {
	for i := range n {
		if w.nbits%8 == 0 {
			w.out = append(w.out, 0)
		}
		w.out[len(w.out)-1] |= byte(v>>i&1) << (w.nbits % 8)
		w.nbits++
	}
}

func (w *bitWriter) code(c, n uint) {
	for i := n; i > 0; i-- {
		w.bits(c>>(i-1)&1, 1)
	}
}

// gzipMember wraps a raw DEFLATE stream in a gzip member whose trailer
// matches want.
func gzipMember(deflate, want []byte) []byte {
	z := []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}
	z = append(z, deflate...)
	c, n := crc32.ChecksumIEEE(want), uint32(len(want))
	return append(z, byte(c), byte(c>>8), byte(c>>16), byte(c>>24), byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
}

// emptyDistanceCodeStream is a fixed block with "a", then a dynamic block
// whose distance code is empty (legal: a block of literals) that uses a
// length code anyway, then "a" copies at distance 1: invalid, as no
// distance can be decoded. Its trailer is that of "aaaaa", what a decoder
// that still has the fixed block's distance code would produce.
func emptyDistanceCodeStream() []byte {
	var w bitWriter
	w.bits(0, 1) // BFINAL 0
	w.bits(1, 2) // fixed Huffman
	w.code(0x30+'a', 8)
	w.code(0, 7) // end of block
	w.bits(1, 1) // BFINAL 1
	w.bits(2, 2) // dynamic Huffman
	w.bits(258-257, 5)
	w.bits(0, 5) // HDIST: 1 distance code (1-1)
	w.bits(18-4, 4)
	// Code-length code: 0, 1, 2 and 18 of length 2 (codes 00 01 10 11).
	for _, sym := range clOrder[:18] {
		l := uint(0)
		if sym <= 2 || sym == 18 {
			l = 2
		}
		w.bits(l, 3)
	}
	zeros := func(n uint) { w.code(3, 2); w.bits(n-11, 7) }
	zeros(97)    // 0..96
	w.code(1, 2) // 'a': length 1
	zeros(138)   // 98..235
	zeros(20)    // 236..255
	w.code(2, 2) // 256: length 2
	w.code(2, 2) // 257: length 2
	w.code(0, 2) // the one distance code: length 0
	w.code(0, 1) // 'a'
	w.code(3, 2) // 257: a copy of length 3
	w.bits(0, 5) // a distance, had there been a code
	w.code(2, 2) // end of block
	return gzipMember(w.out, []byte("aaaaa"))
}

// A block may have an empty distance code, and then no length code may
// decode; a decoder that keeps the previous block's distance table there
// takes an invalid stream (compress/gzip and zlib refuse it).
func TestGunzipEagerRejectsLengthWithEmptyDistanceCode(t *testing.T) {
	z := emptyDistanceCodeStream()
	if got, err := goGunzip(z); err == nil {
		t.Fatalf("compress/gzip decodes the stream (%q): not the invalid stream it should be", got)
	}
	var got []byte
	err := gunzipEager(pieces(z, rand.New(rand.NewPCG(1, 2)), len(z)), func(b []byte, _ int64) bool { got = append(got, b...); return true },
		func() int64 { return 0 })
	if err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("decoded %q, err %v; want an error", got, err)
	}
	if len(got) > 2 {
		t.Fatalf("emitted %q: bytes of a copy whose distance cannot be decoded", got)
	}
}

// A header CRC (FHCRC) that does not match is a corrupt header: zlib and
// compress/gzip refuse the member, and so must the latency mode.
func TestGunzipEagerChecksHeaderCRC(t *testing.T) {
	data := []byte("data: 1796016246838663993 abc\n\n")
	for _, tc := range []struct {
		name  string
		right bool
		hdr   gzip.Header
	}{
		{"right", true, gzip.Header{}},
		{"right, all fields", true, gzip.Header{Name: "n.txt", Comment: "c", Extra: []byte{1, 2, 3}}},
		{"wrong", false, gzip.Header{}},
		{"wrong, all fields", false, gzip.Header{Name: "n.txt", Comment: "c", Extra: []byte{1, 2, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			z := withHeaderCRC(gzipped(t, gzip.DefaultCompression, 0, tc.hdr, data), tc.right)
			var got []byte
			err := gunzipEager(pieces(z, rand.New(rand.NewPCG(1, 3)), 5), func(b []byte, _ int64) bool { got = append(got, b...); return true },
				func() int64 { return 0 })
			switch {
			case tc.right && (!errors.Is(err, io.EOF) || !bytes.Equal(got, data)):
				t.Fatalf("err %v, decoded %q; want io.EOF and %q", err, got, data)
			case !tc.right && (err == nil || errors.Is(err, io.EOF) || len(got) > 0):
				t.Fatalf("err %v, decoded %q; want a header error before any byte", err, got)
			}
		})
	}
}
