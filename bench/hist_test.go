package main

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistQuantilesMatchSortedSlice(t *testing.T) {
	cases := []struct {
		name string
		gen  func(r *rand.Rand) int64
	}{
		{"small exact", func(r *rand.Rand) int64 { return r.Int64N(500) }},
		{"microseconds", func(r *rand.Rand) int64 { return 20_000 + r.Int64N(200_000) }},
		{"heavy tail", func(r *rand.Rand) int64 { return int64(r.ExpFloat64() * 1e6) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			h := newHist()
			vals := make([]int64, 100_000)
			for i := range vals {
				vals[i] = tc.gen(r)
				h.record(vals[i])
			}
			slices.Sort(vals)
			for _, q := range []float64{0.5, 0.99, 0.999, 1} {
				want := vals[int(q*float64(len(vals)))-1]
				got := h.quantile(q)
				if diff := float64(got-want) / float64(max(want, 1)); diff > 0.005 || diff < -0.005 {
					t.Errorf("q%.3f = %d, want %d (±0.5%%)", q, got, want)
				}
			}
			if h.max != vals[len(vals)-1] || h.min != vals[0] {
				t.Errorf("min/max = %d/%d, want %d/%d", h.min, h.max, vals[0], vals[len(vals)-1])
			}
		})
	}
}

func TestHistMerge(t *testing.T) {
	a, b := newHist(), newHist()
	for i := int64(1); i <= 1000; i++ {
		a.record(i * 1000)
		b.record(i * 1000)
	}
	a.merge(b)
	if a.n != 2000 || a.quantile(0.5) < 495_000 || a.quantile(0.5) > 505_000 {
		t.Fatalf("merged n=%d p50=%d", a.n, a.quantile(0.5))
	}
}

func TestHistRecordDoesNotAllocate(t *testing.T) {
	h := newHist()
	if n := testing.AllocsPerRun(1000, func() { h.record(123456) }); n != 0 {
		t.Fatalf("record allocates %.1f times", n)
	}
}
