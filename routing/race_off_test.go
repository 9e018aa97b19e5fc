//go:build !race

package routing

// raceDetectorOn reports whether the race detector is on; it changes
// allocation counts, so allocation assertions only run without it.
const raceDetectorOn = false
