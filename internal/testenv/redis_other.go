//go:build !unix

package testenv

// Pause would freeze the server with SIGSTOP, which this system lacks.
func (r *Redis) Pause() { r.t.Helper(); r.t.Fatal("testenv: Redis.Pause needs SIGSTOP (unix only)") }

// Resume would continue a server frozen by Pause.
func (r *Redis) Resume() { r.t.Helper(); r.t.Fatal("testenv: Redis.Resume needs SIGCONT (unix only)") }
