package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Lines as compare.sh's micro() writes them (GOMAXPROCS=1: no -N suffix),
// taken from a real run, plus a -2 suffix as go test writes it at 2.
const microOut = `BenchmarkCacheHit/serial         	22731804	        52.23 ns/op	       0 B/op	       0 allocs/op
BenchmarkCacheHit/parallel-2     	23049519	        51.94 ns/op	       0 B/op	       0 allocs/op
BenchmarkParse/host              	19023146	        63.15 ns/op	       0 B/op	       0 allocs/op
BenchmarkParse/headers           	11243917	       106.8 ns/op	       0 B/op	       0 allocs/op
ok  	routing
BenchmarkLookupCold 	    2000	     15647 ns/op	    1955 B/op	      46 allocs/op
`

func TestMicroTargets(t *testing.T) {
	cases := []struct {
		name, micro string
		want        []string
	}{
		{"met", microOut, []string{
			"| cache hit | ≤ 100 ns and 0 allocs/op | serial 52 ns, 0 allocs/op; parallel 52 ns, 0 allocs/op (`BenchmarkCacheHit`) | met |",
			"| host parsing | 0 allocs/op | host 63 ns, 0 allocs/op; headers 107 ns, 0 allocs/op (`BenchmarkParse`) | met |",
		}},
		{"slow hit", strings.Replace(microOut, "51.94 ns/op", "101.2 ns/op", 1), []string{
			"| cache hit | ≤ 100 ns and 0 allocs/op | serial 52 ns, 0 allocs/op; parallel 101 ns, 0 allocs/op (`BenchmarkCacheHit`) | **missed** |",
		}},
		{"allocating parse, no time bound", strings.Replace(microOut, "106.8 ns/op	       0 B/op	       0 allocs/op", "9999 ns/op	      16 B/op	       1 allocs/op", 1), []string{
			"| host parsing | 0 allocs/op | host 63 ns, 0 allocs/op; headers 9999 ns, 1 allocs/op (`BenchmarkParse`) | **missed** |",
			"| cache hit | ≤ 100 ns and 0 allocs/op | serial 52 ns, 0 allocs/op; parallel 52 ns, 0 allocs/op (`BenchmarkCacheHit`) | met |",
		}},
		{"without -benchmem", "BenchmarkCacheHit/serial 100 52.0 ns/op\n", []string{
			"| cache hit | ≤ 100 ns and 0 allocs/op | serial 52 ns, allocs not counted (`BenchmarkCacheHit`) | **missed** |",
			"| host parsing | 0 allocs/op | no `BenchmarkParse` in the micro-benchmarks | n/a |",
		}},
		{"not run", "", []string{
			"| cache hit | ≤ 100 ns and 0 allocs/op | no micro-benchmark output (`--only` runs none; a failed build or run gives none either) | n/a |",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "s.jsonl")
			if err := appendSample(in, &Sample{Label: "http", Scenario: "http", Subject: subjCube, Rep: 1, Metrics: map[string]float64{"rps": 95}}); err != nil {
				t.Fatal(err)
			}
			args := []string{"-in", in, "-out", filepath.Join(dir, "R.md"), "-mode", "test"}
			if tc.micro != "" {
				mf := filepath.Join(dir, "micro.txt")
				if err := os.WriteFile(mf, []byte(tc.micro), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "-micro", mf)
			}
			if err := runReport(args); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dir, "R.md"))
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("report lacks %q\n%s", w, b)
				}
			}
		})
	}
}

func TestMicroReportRefusesAMissingFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "s.jsonl")
	if err := appendSample(in, &Sample{Label: "http", Scenario: "http", Subject: subjCube, Rep: 1}); err != nil {
		t.Fatal(err)
	}
	err := runReport([]string{"-in", in, "-out", filepath.Join(dir, "R.md"), "-micro", filepath.Join(dir, "none.txt")})
	if err == nil || !strings.Contains(err.Error(), "micro-benchmarks") {
		t.Fatalf("err = %v, want one naming the micro-benchmarks", err)
	}
}
