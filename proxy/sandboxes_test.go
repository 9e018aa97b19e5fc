package proxy

import (
	"strconv"
	"testing"
)

// A request that sees a sandbox killed must also see when: serve un-kills
// a sandbox whose route is newer than the kill (a sandbox re-created
// under the same id), so a kill seen with the time of an earlier change,
// or none, would be undone by the next request of the sandbox it killed.
func TestKillIsSeenWithItsTime(t *testing.T) {
	var s sandboxes
	for i := range 2000 {
		id := "sbx" + strconv.Itoa(i)
		e := s.get([]byte(id)) // made by traffic: its state never changed
		done := make(chan struct{})
		go func() {
			s.setState(id, stateKilled)
			close(done)
		}()
		for e.state.Load() != stateKilled {
		}
		if at := e.changedAt.Load(); at == 0 {
			t.Fatalf("round %d: sandbox seen killed before the time of its kill was set", i)
		}
		<-done
	}
}
