//go:build !race

package accesslog

// raceEnabled reports whether the race detector is on; it adds allocations,
// so allocation assertions only run without it.
const raceEnabled = false
