package proxy

import "sync"

// sandboxLocks serialises the admin API's changes of one sandbox. A
// change is two steps, the route store's and the sandbox state's (DELETE
// forgets the pause, meta/delete kills, PUT lifts a kill), and two
// changes of one sandbox interleaved leave a mix that neither order
// gives: a DELETE that removed the route before a PUT, and forgot the
// sandbox's state after the pause set once the PUT was answered, lost the
// pause; a meta/delete whose kill came after a PUT's 200 answered the new
// route 410 for an hour. Changes of different sandboxes do not wait for
// each other, so the routes file writes they need are still shared.
type sandboxLocks struct {
	mu sync.Mutex
	m  map[string]*sandboxLock
}

// sandboxLock is one sandbox's lock; refs counts its holder and waiters,
// and the entry leaves the map when none is left.
type sandboxLock struct {
	sync.Mutex
	refs int
}

// lock takes id's lock and returns its unlock.
func (l *sandboxLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*sandboxLock)
	}
	e := l.m[id]
	if e == nil {
		e = new(sandboxLock)
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}
