package main

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
)

// gunzipEager decodes one gzip member (RFC 1952, DEFLATE of RFC 1951) read
// piece by piece from next, and hands the decoded bytes to emit before it
// waits for more input: every byte the input received so far encodes
// reaches emit, with at (unix nanos) the time the last of that input was
// read. emit returning false stops the decoding (nil error).
//
// compress/flate cannot serve the latency mode: it hands out decoded bytes
// only at the end of a block or when its 32 KiB window is full. A peer that
// compresses event streams (nginx with gzip) sends output buffers that end
// mid-block, so events whose bytes had arrived were held until a later
// buffer came: about twice the latency a browser or curl (zlib, which
// inflates as far as its input goes) sees from the same peer. This decoder
// follows zlib's puff.c: simple, bit by bit, fast enough for the event
// rates of the latency mode.
func gunzipEager(next func() ([]byte, error), emit func(b []byte, at int64) bool, now func() int64) error {
	z := &inflater{next: next, emit: emit, now: now, out: make([]byte, 0, 64<<10)}
	err := z.member()
	if errors.Is(err, errEmitStop) {
		return nil
	}
	return err
}

var (
	errEmitStop   = errors.New("stopped by the consumer")
	errBadDeflate = errors.New("malformed deflate stream")
)

// inflater is the state of one gunzipEager call.
type inflater struct {
	next func() ([]byte, error)
	emit func([]byte, int64) bool
	now  func() int64

	in     []byte // input not yet consumed
	at     int64  // when in was read
	bitbuf uint32
	nbits  uint

	window [1 << 15]byte
	wpos   int   // next write position in window
	total  int64 // bytes decoded so far
	out    []byte
	crc    uint32

	lencode, distcode huffman
}

// byte returns the next input byte, first handing out everything decoded
// when the input on hand is exhausted.
func (z *inflater) byte() (byte, error) {
	for len(z.in) == 0 {
		if err := z.flush(); err != nil {
			return 0, err
		}
		b, err := z.next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		z.in, z.at = b, z.now()
	}
	c := z.in[0]
	z.in = z.in[1:]
	return c, nil
}

func (z *inflater) flush() error {
	if len(z.out) == 0 {
		return nil
	}
	z.crc = crc32.Update(z.crc, crc32.IEEETable, z.out)
	ok := z.emit(z.out, z.at)
	z.out = z.out[:0]
	if !ok {
		return errEmitStop
	}
	return nil
}

func (z *inflater) put(c byte) error {
	z.window[z.wpos] = c
	z.wpos = (z.wpos + 1) & (len(z.window) - 1)
	z.total++
	z.out = append(z.out, c)
	if len(z.out) == cap(z.out) {
		return z.flush()
	}
	return nil
}

// bits returns the next n (≤ 16) bits, least significant first.
func (z *inflater) bits(n uint) (int, error) {
	for z.nbits < n {
		c, err := z.byte()
		if err != nil {
			return 0, err
		}
		z.bitbuf |= uint32(c) << z.nbits
		z.nbits += 8
	}
	v := int(z.bitbuf & (1<<n - 1))
	z.bitbuf >>= n
	z.nbits -= n
	return v, nil
}

func (z *inflater) member() error {
	var hdr [10]byte
	for i := range hdr {
		c, err := z.byte()
		if err != nil {
			return fmt.Errorf("gzip header: %w", err)
		}
		hdr[i] = c
	}
	if hdr[0] != 0x1f || hdr[1] != 0x8b || hdr[2] != 8 {
		return errors.New("gzip header: not a deflate gzip member")
	}
	flg := hdr[3]
	// The header CRC (FHCRC) covers every header byte before it; zlib
	// checks it, and so does compress/gzip.
	hcrc := crc32.ChecksumIEEE(hdr[:])
	hbyte := func() (byte, error) {
		c, err := z.byte()
		hcrc = crc32.Update(hcrc, crc32.IEEETable, []byte{c})
		return c, err
	}
	if flg&4 != 0 { // FEXTRA
		lo, err := hbyte()
		if err != nil {
			return err
		}
		hi, err := hbyte()
		if err != nil {
			return err
		}
		for range int(lo) | int(hi)<<8 {
			if _, err := hbyte(); err != nil {
				return err
			}
		}
	}
	for _, f := range []byte{8, 16} { // FNAME, FCOMMENT: zero-terminated
		for flg&f != 0 {
			c, err := hbyte()
			if err != nil {
				return err
			}
			if c == 0 {
				break
			}
		}
	}
	if flg&2 != 0 { // FHCRC: the low 16 bits of the CRC-32 of the header
		v, err := z.bits(16)
		if err != nil {
			return err
		}
		if uint16(v) != uint16(hcrc) {
			return errors.New("gzip header: checksum mismatch")
		}
	}
	for last := false; !last; {
		h, err := z.bits(3)
		if err != nil {
			return err
		}
		last = h&1 != 0
		switch h >> 1 {
		case 0:
			err = z.stored()
		case 1:
			z.fixed()
			err = z.codes()
		case 2:
			if err = z.dynamic(); err == nil {
				err = z.codes()
			}
		default:
			err = errBadDeflate
		}
		if err != nil {
			return err
		}
	}
	if err := z.flush(); err != nil {
		return err
	}
	z.align() // the trailer starts on a byte boundary
	var tr [8]byte
	for i := range tr {
		c, err := z.alignedByte()
		if err != nil {
			return fmt.Errorf("gzip trailer: %w", err)
		}
		tr[i] = c
	}
	crc := uint32(tr[0]) | uint32(tr[1])<<8 | uint32(tr[2])<<16 | uint32(tr[3])<<24
	size := uint32(tr[4]) | uint32(tr[5])<<8 | uint32(tr[6])<<16 | uint32(tr[7])<<24
	if crc != z.crc || size != uint32(z.total) {
		return errors.New("gzip trailer: checksum or size mismatch")
	}
	return io.EOF
}

// align drops the bits left of the current byte; whole bytes that the
// decoder's look-ahead took stay in bitbuf.
func (z *inflater) align() {
	z.bitbuf >>= z.nbits % 8
	z.nbits -= z.nbits % 8
}

// alignedByte returns the next byte once aligned, look-ahead first.
func (z *inflater) alignedByte() (byte, error) {
	if z.nbits >= 8 {
		c := byte(z.bitbuf)
		z.bitbuf >>= 8
		z.nbits -= 8
		return c, nil
	}
	return z.byte()
}

func (z *inflater) stored() error {
	z.align()
	n, err := z.bits(16)
	if err != nil {
		return err
	}
	nc, err := z.bits(16)
	if err != nil {
		return err
	}
	if n != ^nc&0xffff {
		return errBadDeflate
	}
	for range n {
		c, err := z.alignedByte()
		if err != nil {
			return err
		}
		if err := z.put(c); err != nil {
			return err
		}
	}
	return nil
}

// huffman is a canonical Huffman code: how many codes each length has and
// the symbols in code order (puff.c), plus a table that decodes codes of
// up to fastBits bits in one look-up.
type huffman struct {
	count  [16]uint16
	symbol [288]uint16
	// fast is indexed by the next fastBits input bits (least significant
	// first): symbol<<4 | code length, or 0 for a longer code.
	fast [1 << fastBits]uint16
}

const fastBits = 9

// build makes h from code lengths and returns how many codes are left
// unused: 0 for a complete code, negative when oversubscribed.
func (h *huffman) build(lengths []uint8) int {
	// Clear the last block's table first: an empty code (a distance code
	// of a block of literals) must decode nothing, not the codes before.
	h.fast = [1 << fastBits]uint16{}
	h.count = [16]uint16{}
	for _, l := range lengths {
		h.count[l]++
	}
	if int(h.count[0]) == len(lengths) {
		return 0
	}
	left := 1
	for l := 1; l < 16; l++ {
		left = left<<1 - int(h.count[l])
		if left < 0 {
			return left
		}
	}
	var offs [16]uint16
	for l := 1; l < 15; l++ {
		offs[l+1] = offs[l] + h.count[l]
	}
	for sym, l := range lengths {
		if l != 0 {
			h.symbol[offs[l]] = uint16(sym)
			offs[l]++
		}
	}
	// Canonical codes (RFC 1951 3.2.2), bit-reversed since input bits
	// come least significant first.
	var next [16]int
	for l, code := 1, 0; l < 16; l++ {
		if l > 1 {
			code = (code + int(h.count[l-1])) << 1
		}
		next[l] = code
	}
	for sym, l := range lengths {
		if l == 0 || l > fastBits {
			continue
		}
		rev := int(bits.Reverse16(uint16(next[l])) >> (16 - l))
		next[l]++
		for i := rev; i < len(h.fast); i += 1 << l {
			h.fast[i] = uint16(sym)<<4 | uint16(l)
		}
	}
	return left
}

func (z *inflater) decode(h *huffman) (int, error) {
	// Look the code up in the bits already received; never wait for input
	// a shorter code does not need.
	for z.nbits < fastBits && len(z.in) > 0 {
		z.bitbuf |= uint32(z.in[0]) << z.nbits
		z.in = z.in[1:]
		z.nbits += 8
	}
	if e := h.fast[z.bitbuf&(1<<fastBits-1)]; e != 0 && uint(e&15) <= z.nbits {
		z.bitbuf >>= e & 15
		z.nbits -= uint(e & 15)
		return int(e >> 4), nil
	}
	code, first, index := 0, 0, 0
	for l := 1; l < 16; l++ {
		b, err := z.bits(1)
		if err != nil {
			return 0, err
		}
		code |= b
		count := int(h.count[l])
		if code-count < first {
			return int(h.symbol[index+code-first]), nil
		}
		index += count
		first = (first + count) << 1
		code <<= 1
	}
	return 0, errBadDeflate
}

var (
	lenBase  = [29]uint16{3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258}
	lenExtra = [29]uint8{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0}
	distBase = [30]uint16{1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577}
	distExtr = [30]uint8{0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13}
	clOrder  = [19]uint8{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15}
)

func (z *inflater) codes() error {
	for {
		sym, err := z.decode(&z.lencode)
		if err != nil {
			return err
		}
		switch {
		case sym < 256:
			if err := z.put(byte(sym)); err != nil {
				return err
			}
			continue
		case sym == 256:
			return nil
		}
		sym -= 257
		if sym >= len(lenBase) {
			return errBadDeflate
		}
		extra, err := z.bits(uint(lenExtra[sym]))
		if err != nil {
			return err
		}
		n := int(lenBase[sym]) + extra
		dsym, err := z.decode(&z.distcode)
		if err != nil {
			return err
		}
		if dsym >= len(distBase) {
			return errBadDeflate
		}
		if extra, err = z.bits(uint(distExtr[dsym])); err != nil {
			return err
		}
		dist := int(distBase[dsym]) + extra
		if int64(dist) > z.total || dist > len(z.window) {
			return errBadDeflate
		}
		for range n {
			if err := z.put(z.window[(z.wpos-dist)&(len(z.window)-1)]); err != nil {
				return err
			}
		}
	}
}

func (z *inflater) fixed() {
	var l [288]uint8
	for i := range l {
		switch {
		case i < 144:
			l[i] = 8
		case i < 256:
			l[i] = 9
		case i < 280:
			l[i] = 7
		default:
			l[i] = 8
		}
	}
	z.lencode.build(l[:])
	var d [30]uint8
	for i := range d {
		d[i] = 5
	}
	z.distcode.build(d[:])
}

func (z *inflater) dynamic() error {
	nlen, err := z.bits(5)
	if err != nil {
		return err
	}
	ndist, err := z.bits(5)
	if err != nil {
		return err
	}
	ncode, err := z.bits(4)
	if err != nil {
		return err
	}
	nlen, ndist, ncode = nlen+257, ndist+1, ncode+4
	if nlen > 286 || ndist > 30 {
		return errBadDeflate
	}
	var lengths [286 + 30]uint8
	for i := range ncode {
		v, err := z.bits(3)
		if err != nil {
			return err
		}
		lengths[clOrder[i]] = uint8(v)
	}
	if z.lencode.build(lengths[:19]) != 0 {
		return errBadDeflate // code-length codes must be complete
	}
	lengths = [286 + 30]uint8{}
	for i := 0; i < nlen+ndist; {
		sym, err := z.decode(&z.lencode)
		if err != nil {
			return err
		}
		if sym < 16 {
			lengths[i] = uint8(sym)
			i++
			continue
		}
		var val uint8
		var rep int
		switch sym {
		case 16:
			if i == 0 {
				return errBadDeflate
			}
			val = lengths[i-1]
			rep, err = z.bits(2)
			rep += 3
		case 17:
			rep, err = z.bits(3)
			rep += 3
		default:
			rep, err = z.bits(7)
			rep += 11
		}
		if err != nil {
			return err
		}
		if i+rep > nlen+ndist {
			return errBadDeflate
		}
		for ; rep > 0; rep-- {
			lengths[i] = val
			i++
		}
	}
	if lengths[256] == 0 {
		return errBadDeflate // no end-of-block code
	}
	// An incomplete code is allowed only as a single code of length 1.
	if left := z.lencode.build(lengths[:nlen]); left < 0 || (left > 0 && nlen != int(z.lencode.count[0]+z.lencode.count[1])) {
		return errBadDeflate
	}
	if left := z.distcode.build(lengths[nlen : nlen+ndist]); left < 0 || (left > 0 && ndist != int(z.distcode.count[0]+z.distcode.count[1])) {
		return errBadDeflate
	}
	return nil
}
