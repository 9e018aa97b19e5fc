//go:build !race

package auth

// raceEnabled reports whether the race detector is on: it makes sync.Pool
// drop items at random, so allocation assertions only run without it.
const raceEnabled = false
