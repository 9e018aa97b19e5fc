//go:build race

package routing

const raceDetectorOn = true
