//go:build !linux

package proxy

import (
	"testing"
	"time"
)

// threadCPU returns how long f took: without Linux's thread CPU clock,
// wall time, which a loaded machine stretches.
func threadCPU(t testing.TB, f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}
