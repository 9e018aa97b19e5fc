//go:build !linux

package proxy

// hangups needs epoll; elsewhere a stream's departed client is found when
// its next heartbeat is due.
type hangups struct{}

func newHangups() (*hangups, error) { return nil, nil }

func (h *hangups) watch(*bodyStream)   {}
func (h *hangups) unwatch(*bodyStream) {}
func (h *hangups) run()                {}
func (h *hangups) close()              {}
