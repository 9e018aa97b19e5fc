package proxy

import (
	"net"
	"syscall"
	"testing"
)

// A stream whose write to its client fails as the hangups watch reports
// that client's hang-up is the client's end, whichever of the two the
// stream looks at first: hangUp marks the client gone, then the sandbox
// connection interrupted (never to be pooled), and a stream that looked
// at the first before the watch came and at the second after took the
// mark for the drain's cut. Its log line said drain_timeout (its status
// the sandbox's, not the 499 of a client gone before its head), its
// stream ended as "drain" and both spans were errors. Seen under load in
// TestClientGoneBeforeHijackedHeadIsTheClients; forced here by running
// the watch's hangUp between the two looks.
func TestStreamClientEndedRacingTheHangupWatch(t *testing.T) {
	p := &Proxy{}
	reset := &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	for _, tc := range []struct {
		name   string
		hangUp bool // the watch reports the hang-up between the looks
		drain  bool // the drain interrupted the stream before it ended
		want   string
	}{
		{"the watch comes between the looks", true, false, CodeClientClosed},
		{"no watch", false, false, CodeClientClosed},
		{"the drain's cut", false, true, CodeDrainTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &bodyStream{p: p, conn: &upstreamConn{}}
			s.conn.interrupted.Store(tc.drain)
			p.afterLeftLook = func(s *bodyStream) {
				if tc.hangUp {
					s.hangUp()
				}
			}
			s.clientEnded(reset)
			if s.x.errCode != tc.want {
				t.Errorf("error code %q, want %q", s.x.errCode, tc.want)
			}
		})
	}
}
