//go:build race

package proxy

const raceDetectorOn = true
