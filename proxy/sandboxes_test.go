package proxy

import (
	"runtime"
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
		// Spin, to read the state the moment it changes, but yield now and
		// then: the writer may be waiting for this goroutine's P (one P,
		// or a P whose thread the OS does not run), and a bare spin then
		// lasts until the 10 ms preemption, every round.
		for n := 1; e.state.Load() != stateKilled; n++ {
			if n%(1<<12) == 0 {
				runtime.Gosched()
			}
		}
		if at := e.changedAt.Load(); at == 0 {
			t.Fatalf("round %d: sandbox seen killed before the time of its kill was set", i)
		}
		<-done
	}
}

// A last_active poll that finds a sandbox's request done must also find
// the time of its answer: respond, a stream's end and a tunnel's release
// store the time before lowering the count, and the poll must read them in
// the opposite order. Read the other way round, a poll that read the time
// while the request was in flight and the count once it was done reported
// the sandbox idle since the request began (here: not active since 2).
func TestLastActiveSeesTheAnswerOfADoneRequest(t *testing.T) {
	var s sandboxes
	e := new(sandboxState)
	for i := range 1000 { // one sandbox, many times: the poll reads it over and over
		s.m.Store("sbx"+strconv.Itoa(i), e)
	}
	for round := range 300 {
		e.lastActive.Store(1) // the request's start
		e.active.Store(1)
		start, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			e.lastActive.Store(2) // its answer
			e.active.Add(-1)
			close(done)
		}()
		close(start)
		got := s.lastActive(2, 3)
		<-done
		if len(got) != 1000 {
			t.Fatalf("round %d: the poll lost %d of 1000 readings of a sandbox active until 2", round, 1000-len(got))
		}
	}
}
