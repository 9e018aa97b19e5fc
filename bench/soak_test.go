package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseProm(t *testing.T) {
	in := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
cubeproxy_streams_open{route_kind="http"} 2
cubeproxy_streams_open{route_kind="sse"} 3
go_memstats_next_gc_bytes 4.194304e+06
broken_line
`
	m, err := parseProm(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want float64
	}{
		{"go_goroutines", 42},
		{"cubeproxy_streams_open", 5},
		{"go_memstats_next_gc_bytes", 4194304},
		{"absent", 0},
	} {
		if got := sumOf(m[c.name]); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestHeapTrend(t *testing.T) {
	series := func(f func(min float64) float64) []soakPoint {
		var ps []soakPoint
		for i := range 36 { // 6 min at 10 s
			at := time.Duration(i) * 10 * time.Second
			ps = append(ps, soakPoint{at: at, phase: "load", nextGC: 2 * f(at.Minutes()) * (1 << 20)})
		}
		return append(ps, soakPoint{at: time.Hour, phase: "idle", nextGC: 1 << 40}) // other phases do not count
	}
	for _, c := range []struct {
		name        string
		points      []soakPoint
		slope, grow float64
	}{
		{"flat", series(func(float64) float64 { return 3 }), 0, 0},
		{"leak of 1 MiB/min", series(func(m float64) float64 { return 3 + m }), 1, 5.833},
		{"sawtooth around a level", series(func(m float64) float64 { return 3 + 0.5*math.Sin(m*20) }), 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := heapTrend(c.points, "load")
			if math.Abs(r.slopeMiBMin-c.slope) > 0.1 || math.Abs(r.growMiB-c.grow) > 0.6 {
				t.Errorf("slope %.3f MiB/min, growth %.3f MiB; want %.3f, %.3f", r.slopeMiBMin, r.growMiB, c.slope, c.grow)
			}
		})
	}
}

func TestDrift(t *testing.T) {
	base := soakPoint{fds: 19, sockets: 9, goroutines: 30, backendSockets: 2}
	for _, c := range []struct {
		name string
		end  soakPoint
		want string
	}{
		{"back to the baseline", soakPoint{fds: 21, sockets: 10, goroutines: 36, backendSockets: 3}, ""},
		{"goroutines", soakPoint{fds: 19, sockets: 9, goroutines: 60, backendSockets: 2}, "goroutines 60 (baseline 30)"},
		{"sockets", soakPoint{fds: 30, sockets: 20, goroutines: 30, backendSockets: 2}, "fds 30 (baseline 19), sockets 20 (baseline 9)"},
		{"backend", soakPoint{fds: 19, sockets: 9, goroutines: 30, backendSockets: 12}, "backend sockets 12 (baseline 2)"},
		{"a stream still open", soakPoint{fds: 19, sockets: 9, goroutines: 30, backendSockets: 2, streams: 1}, "streams_open 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := strings.Join(c.end.drift(base, 8, 4), ", "); got != c.want {
				t.Errorf("drift = %q, want %q", got, c.want)
			}
		})
	}
}
