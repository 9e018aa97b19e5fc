//go:build !linux

package routing

// isMountPoint reports false: outside Linux the first admin change finds
// a routes file that cannot be replaced.
func isMountPoint(string) bool { return false }
