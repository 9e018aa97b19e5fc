package accesslog

// pipeAtomicWrite is PIPE_BUF on Linux: a pipe takes a write of up to this
// many bytes whole, never interleaved with another writer's.
const pipeAtomicWrite = 4096
