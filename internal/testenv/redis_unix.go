//go:build unix

package testenv

import "syscall"

// Pause freezes the server with SIGSTOP: the kernel still accepts its
// connections and buffers what clients write, but nothing is answered, as
// with a hung host or a network path that drops packets silently. Resume
// (or cleanup) ends it.
func (r *Redis) Pause() { r.signal(syscall.SIGSTOP) }

// Resume continues a server frozen by Pause.
func (r *Redis) Resume() { r.signal(syscall.SIGCONT) }
