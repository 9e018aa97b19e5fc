package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func sseEvents(stamps []int64, size int) []byte {
	var b bytes.Buffer
	for _, ts := range stamps {
		ev := fmt.Sprintf("data: %019d ", ts)
		ev += strings.Repeat("p", size-len(ev)-2) + "\n\n"
		b.WriteString(ev)
	}
	return b.Bytes()
}

func TestSSEParserAcrossEveryReadBoundary(t *testing.T) {
	stamps := []int64{1796016246838663993, 1, 42, 1796016246838685545}
	stream := sseEvents(stamps, 64)
	for cut1 := 0; cut1 <= len(stream); cut1++ {
		for _, cut2 := range []int{cut1, min(cut1+7, len(stream)), len(stream)} {
			var p sseParser
			var got []int64
			on := func(ts int64) { got = append(got, ts) }
			n := p.feed(stream[:cut1], on) + p.feed(stream[cut1:cut2], on) + p.feed(stream[cut2:], on)
			if n != len(stamps) || fmt.Sprint(got) != fmt.Sprint(stamps) || p.bad {
				t.Fatalf("cuts %d/%d: %d events %v bad=%v, want %v", cut1, cut2, n, got, p.bad, stamps)
			}
		}
	}
}

func TestSSEParserRejectsForeignFormat(t *testing.T) {
	var p sseParser
	p.feed([]byte(": heartbeat comment\n\n"), nil)
	if !p.bad {
		t.Fatal("comment line accepted as a bench event")
	}
}

// chunked encodes parts as an HTTP/1.1 chunked body with a trailer.
func chunked(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(p), p)
	}
	b.WriteString("0\r\nX-Trailer: 1\r\n\r\n")
	return b.String()
}

func TestBodyStreamFramings(t *testing.T) {
	const want = "hello, streaming world"
	cases := []struct {
		name string
		raw  string
		cl   int
	}{
		{"content-length", want + "NEXT", len(want)},
		{"chunked", chunked("hello, ", "streaming", " world") + "NEXT", -1},
		{"chunked with extension", "7;ext=1\r\nhello, \r\n" + chunked("streaming world") + "NEXT", -1},
		{"until EOF", want, -2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.raw), 16)
			bs := newBodyStream(br, tc.cl)
			var got []byte
			for {
				b, err := bs.next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("next: %v", err)
				}
				got = append(got, b...)
			}
			if string(got) != want {
				t.Fatalf("body %q, want %q", got, want)
			}
			rest, _ := io.ReadAll(br)
			if tc.cl != -2 && string(rest) != "NEXT" {
				t.Fatalf("left %q after the body, want the next response", rest)
			}
		})
	}
}

func TestDiscardBody(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		cl   int
		n    int64
	}{
		{"content-length", "abcdefNEXT", 6, 6},
		{"chunked", chunked("abc", "defgh") + "NEXT", -1, 8},
		{"empty chunked", "0\r\n\r\nNEXT", -1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tc.raw))
			n, err := discardBody(br, tc.cl)
			if err != nil || n != tc.n {
				t.Fatalf("discardBody = %d, %v; want %d", n, err, tc.n)
			}
			if rest, _ := io.ReadAll(br); string(rest) != "NEXT" {
				t.Fatalf("left %q, want NEXT", rest)
			}
		})
	}
	if _, err := discardBody(bufio.NewReader(strings.NewReader("zz\r\n")), -1); err == nil {
		t.Fatal("malformed chunk size accepted")
	}
}

func TestWSFrameEncodesLengthAndMask(t *testing.T) {
	for _, size := range []int{0, 64, 125, 126, 65535, 65536} {
		f := newWSFrame(size)
		if f[0] != 0x82 || f[1]&0x80 == 0 {
			t.Fatalf("size %d: header % x", size, f[:2])
		}
		ln, off := int(f[1]&0x7f), 2
		switch ln {
		case 126:
			ln, off = int(binary.BigEndian.Uint16(f[2:])), 4
		case 127:
			ln, off = int(binary.BigEndian.Uint64(f[2:])), 10
		}
		key, payload := f[off:off+4], f[off+4:]
		if ln != size || len(payload) != size {
			t.Fatalf("size %d: encoded length %d, payload %d", size, ln, len(payload))
		}
		for i, c := range payload {
			if c^key[i%4] != byte('a'+i%26) {
				t.Fatalf("size %d: byte %d unmasks to %q", size, i, c^key[i%4])
			}
		}
	}
}

// Busy CPU is capacity minus idle, whatever the tick-sampled user/system
// columns say: they drift from the processes' exact times by several
// percent, which read as foreign load (or hid it).
func TestCPUShares(t *testing.T) {
	c0 := cpuTotals{user: 1000, system: 500, idle: 10000, ncpu: 2}
	for _, tc := range []struct {
		name              string
		c1                cpuTotals
		own               uint64
		other, busy, stol float64
	}{
		// 1 s on 2 CPUs = 200 ticks; 100 idle, so 100 busy, 90 of it ours.
		{"foreign load", cpuTotals{user: 1070, system: 530, idle: 10100, ncpu: 2}, 90, 5, 50, 0},
		// The same window with user/system sampled 7 ticks high: no change.
		{"tick-sampled columns ignored", cpuTotals{user: 1077, system: 530, idle: 10100, ncpu: 2}, 90, 5, 50, 0},
		// Processes' exact time above busy: a small negative, shown.
		{"accounting error shown", cpuTotals{user: 1070, system: 530, idle: 10100, ncpu: 2}, 102, -1, 50, 0},
		{"steal kept apart", cpuTotals{user: 1070, system: 530, idle: 10100, steal: 20, ncpu: 2}, 80, 0, 40, 10},
	} {
		other, steal, busy := cpuShares(time.Second, c0, tc.c1, tc.own)
		if other != tc.other || busy != tc.busy || steal != tc.stol {
			t.Errorf("%s: other %v busy %v steal %v, want %v %v %v", tc.name, other, busy, steal, tc.other, tc.busy, tc.stol)
		}
	}
}
