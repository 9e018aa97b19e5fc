package main

import (
	"math"
	"math/bits"
)

// histSubBits sets the histogram precision: each power-of-two range is split
// into 2^(histSubBits-1) linear buckets, so a recorded value is off by at
// most 1/256 (0.4 %) of itself. Values below 512 ns are exact.
const (
	histSubBits = 9
	histHalf    = 1 << (histSubBits - 1)
	histMaxLog  = 40 // 2^40 ns ≈ 18 minutes; larger values are clamped
	histBuckets = (histMaxLog-histSubBits+2)*histHalf + histHalf
)

// hist is an HDR-style latency histogram over nanoseconds with fixed
// buckets: recording never allocates and histograms merge by addition.
// Count, sum, min and max are exact.
type hist struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      float64
	min, max int64
}

func newHist() *hist { return &hist{min: math.MaxInt64} }

func histIndex(v int64) int {
	if v < 0 {
		v = 0
	}
	u := uint64(v)
	if u >= 1<<histMaxLog {
		u = 1<<histMaxLog - 1
	}
	shift := max(bits.Len64(u)-histSubBits, 0)
	return shift*histHalf + int(u>>shift)
}

// histValue returns the midpoint of bucket i.
func histValue(i int) int64 {
	if i < 2*histHalf {
		return int64(i)
	}
	shift := i/histHalf - 1
	top := uint64(i - shift*histHalf)
	return int64(top<<shift + (1<<shift)/2)
}

// record adds one observation. A negative value (a latency across a
// wall-clock step) is recorded as 0, so that min, max and the quantiles
// stay consistent: max starts at 0, not at the lowest int64.
func (h *hist) record(v int64) {
	v = max(v, 0)
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile returns the value at quantile q (0..1) by nearest rank, clamped
// to [min, max]. The last rank is the exact max: the top bucket also holds
// every value past 2^40 ns, whose midpoint would understate them.
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	if rank >= h.n {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(max(histValue(i), h.min), h.max)
		}
	}
	return h.max
}

func (h *hist) mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}
