//go:build !linux

package accesslog

// pipeAtomicWrite is POSIX's smallest PIPE_BUF (macOS's): a pipe takes a
// write of up to this many bytes whole, never interleaved with another
// writer's.
const pipeAtomicWrite = 512
