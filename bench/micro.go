package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// microResult is one line of `go test -bench -benchmem` output.
type microResult struct {
	name      string // without the -GOMAXPROCS suffix
	nsPerOp   float64
	allocsOp  float64
	hasAllocs bool
}

// parseMicro reads the benchmark lines of `go test -bench -benchmem`
// output; anything else (PASS, ok, goos lines) is skipped.
func parseMicro(r io.Reader) ([]microResult, error) {
	var out []microResult
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || f[3] != "ns/op" {
			continue
		}
		m := microResult{name: trimProcs(f[0]), allocsOp: math.NaN()}
		var err error
		if m.nsPerOp, err = strconv.ParseFloat(f[2], 64); err != nil {
			return nil, fmt.Errorf("micro-benchmark line %q: %w", sc.Text(), err)
		}
		// The unit follows each value: "0 B/op 0 allocs/op".
		for i := 5; i < len(f); i += 2 {
			if f[i] == "allocs/op" {
				if m.allocsOp, err = strconv.ParseFloat(f[i-1], 64); err != nil {
					return nil, fmt.Errorf("micro-benchmark line %q: %w", sc.Text(), err)
				}
				m.hasAllocs = true
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// trimProcs drops the -N that go test appends to a benchmark's name when
// GOMAXPROCS is above 1 (compare.sh runs them at 1, which has none).
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}

// microTarget judges the benchmarks named family (BenchmarkCacheHit and
// its sub-benchmarks) against at most maxNs per op (0: no time bound) and
// 0 allocs/op: every one must meet it. measured names each sub-benchmark's
// figure; have is false when none ran.
func microTarget(results []microResult, family string, maxNs float64) (measured string, ok, have bool) {
	var parts []string
	ok = true
	for _, m := range results {
		if m.name != family && !strings.HasPrefix(m.name, family+"/") {
			continue
		}
		have = true
		sub := strings.TrimPrefix(strings.TrimPrefix(m.name, family), "/")
		fig := fmt.Sprintf("%.0f ns", m.nsPerOp)
		if m.hasAllocs {
			fig += fmt.Sprintf(", %.0f allocs/op", m.allocsOp)
		} else {
			fig += ", allocs not counted"
		}
		if sub != "" {
			fig = sub + " " + fig
		}
		parts = append(parts, fig)
		if !m.hasAllocs || m.allocsOp != 0 || (maxNs > 0 && m.nsPerOp > maxNs) {
			ok = false
		}
	}
	if !have {
		return "", false, false
	}
	return strings.Join(parts, "; ") + " (`" + family + "`)", ok, true
}
