package accesslog

import (
	"os"
	"path/filepath"
)

// NamesStdout reports whether path puts the access log on stdout: "" or
// "-", or a name of stdout as nginx configurations write it
// (/dev/stdout, /dev/fd/1, /proc/self/fd/1), directly or through links
// (nginx images link access.log to /dev/stdout). Opened as a file, such a
// name was a second open of stdout beside the process log's: with stdout
// a file opened without O_APPEND (a shell's `>`), the process log wrote at
// its own offset over the access log's lines, and with stdout a socket
// (journald) the open failed (ENXIO) and the proxy did not start. Only
// names are looked at, never what stdout is.
func NamesStdout(path string) bool {
	if path == "" {
		return true
	}
	for range 8 { // links followed, as open(2) would, up to a bound
		switch filepath.Clean(path) {
		case "-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1":
			return true
		}
		target, err := os.Readlink(path)
		if err != nil {
			return false
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return false
}
