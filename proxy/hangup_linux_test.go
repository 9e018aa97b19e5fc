package proxy

// watchedHangups is how many clients h watches for a hang-up.
func watchedHangups(h *hangups) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watched)
}
