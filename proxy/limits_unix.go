//go:build unix

package proxy

import "syscall"

// openFilesLimit is the process's RLIMIT_NOFILE (soft), for the log line
// that says the proxy ran out of descriptors; 0 when unknown.
func openFilesLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return uint64(rl.Cur) // int64 on some BSDs
}
