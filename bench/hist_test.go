package main

import (
	"math"
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

// The edges a sample can hit: one observation, all observations equal,
// values past the last bucket (clamped into it) and a negative latency (a
// wall-clock step between the backend's stamp and the arrival). Every
// quantile must be an observed value's neighbourhood within the
// histogram's precision, and q=1 must be the exact maximum: a run that
// clamped into the top bucket reported 2^41 ns for a max of 2^42 ns, and
// a negative-only histogram claimed a max of 0 above its p100.
func TestHistQuantileEdges(t *testing.T) {
	cases := []struct {
		name string
		vals []int64
	}{
		{"one sample below 512 ns", []int64{7}},
		{"one sample", []int64{123_456_789}},
		{"all equal", []int64{5_000, 5_000, 5_000, 5_000, 5_000}},
		{"two values", []int64{1_000, 9_000}},
		{"overflow bucket", []int64{1 << 41, 1 << 42}},
		{"overflow with normal values", []int64{1_000, 2_000, 3_000, 1 << 42}},
		{"overflow tail", append(slices.Repeat([]int64{10_000}, 98), 1<<41, 1<<42)},
		{"negative", []int64{-3}},
		{"zero", []int64{0, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHist()
			for _, v := range tc.vals {
				h.record(v)
			}
			sorted := slices.Clone(tc.vals)
			for i, v := range sorted {
				sorted[i] = max(v, 0) // latencies below zero are recorded as 0
			}
			slices.Sort(sorted)
			if h.min != sorted[0] || h.max != sorted[len(sorted)-1] {
				t.Errorf("min/max = %d/%d, want %d/%d", h.min, h.max, sorted[0], sorted[len(sorted)-1])
			}
			for _, q := range []float64{0.5, 0.99, 0.999, 1} {
				// Nearest rank, as quantile documents: the smallest value
				// with at least q of the observations at or below it.
				rank := int(math.Ceil(q * float64(len(sorted))))
				want := sorted[max(rank, 1)-1]
				got := h.quantile(q)
				if q == 1 && got != want {
					t.Errorf("q1 = %d, want the exact max %d", got, want)
				}
				if want >= 1<<histMaxLog {
					// Past the last bucket only "at least 2^40 ns" is known.
					if got < 1<<histMaxLog-1<<(histMaxLog-histSubBits) || got > h.max {
						t.Errorf("q%g = %d, want a value in the top bucket up to the max %d", q, got, h.max)
					}
					continue
				}
				if diff := math.Abs(float64(got-want)) / float64(max(want, 1)); diff > 0.005 {
					t.Errorf("q%g = %d, want %d (±0.5%%)", q, got, want)
				}
			}
		})
	}
}
