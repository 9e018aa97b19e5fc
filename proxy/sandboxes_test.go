package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
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
		for n := 1; e.state() != stateKilled; n++ {
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
	t.Parallel()
	var s sandboxes
	e := new(sandboxState)
	for i := range 1000 { // one sandbox, many times: the poll reads it over and over
		s.m.Store("sbx"+strconv.Itoa(i), e)
	}
	for round := range 300 {
		e.lastActive.Store(1) // the request's start
		e.enter()
		start, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			e.lastActive.Store(2) // its answer
			e.leave()
			close(done)
		}()
		close(start)
		_, got := s.appendLastActive(nil, 2, 3)
		<-done
		if got != 1000 {
			t.Fatalf("round %d: the poll lost %d of 1000 readings of a sandbox active until 2", round, 1000-got)
		}
	}
}

// sandboxCount is how many sandboxes the proxy holds state for.
func sandboxCount(p *Proxy) int {
	n := 0
	p.sandboxes.m.Range(func(any, any) bool { n++; return true })
	return n
}

// The admin API's route churn (store a sandbox, serve it, maybe pause it,
// delete it) must not leave an entry behind per sandbox: the soak test
// found the state map one entry larger for every sandbox that ever got a
// request, and a paused one is never swept, so a node whose sandboxes are
// paused and deleted grew without end. A kill's tombstone stays: the id
// answers 410 for its hour, deleted route or not.
func TestDeletedRouteForgetsSandboxState(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
	const perCase = 40
	cases := []struct {
		name string
		// then runs after the sandbox served a request, before its route is deleted.
		then  func(id string)
		kept  bool
		after int // status of a request once the route is deleted
	}{
		{"running", func(string) {}, false, 404},
		{"paused", func(id string) { h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, "") }, false, 404},
		{"pausing", func(id string) { h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"pausing"}`, "") }, false, 404},
		{"killed", func(id string) { h.proxy.kill(id) }, true, 410},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := sandboxCount(h.proxy)
			for i := range perCase {
				id := "churn-" + tc.name + "-" + strconv.Itoa(i)
				host := itoa(port) + "-" + id + ".cube.test"
				if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
					t.Fatalf("PUT %s: %d %s", id, st, body)
				}
				if st, _, _ := h.get(host, "/"); st != 200 {
					t.Fatalf("GET %s: %d", id, st)
				}
				tc.then(id)
				if st, body := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 || !strings.Contains(body, `"deleted":true`) {
					t.Fatalf("DELETE %s: %d %s", id, st, body)
				}
				if st, _, _ := h.get(host, "/"); st != tc.after {
					t.Fatalf("GET %s after DELETE: %d, want %d", id, st, tc.after)
				}
			}
			want := before
			if tc.kept {
				want += perCase
			}
			testenv.WaitFor(t, 5*time.Second, "sandbox entries back to "+strconv.Itoa(want), func() bool {
				return sandboxCount(h.proxy) == want
			})
		})
	}

	// Stored again, a deleted paused sandbox is a new one: it is served,
	// not answered 503 for the pause of the one deleted.
	id := "churn-paused-0"
	if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
		t.Fatalf("PUT %s again: %d %s", id, st, body)
	}
	if st, _, _ := h.get(itoa(port)+"-"+id+".cube.test", "/"); st != 200 {
		t.Fatalf("GET re-created %s: %d, want 200", id, st)
	}
}

// A paused sandbox deleted while a request of its is still in flight keeps
// its entry (the request's count) but not its pause: a paused entry is
// never swept, so it would outlive the request for ever.
func TestDeletedRouteInFlightLosesItsPause(t *testing.T) {
	h := newHarness(t)
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
	const id = "held"
	if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
		t.Fatalf("PUT: %d %s", st, body)
	}
	before := sandboxCount(h.proxy)
	// The delete would cut the request (rejudge: its route is gone) at
	// some point after forget: held until it is answered, so that forget
	// always finds it in flight.
	judge := make(chan struct{})
	judged := sync.OnceFunc(func() { close(judge) })
	t.Cleanup(judged) // before Shutdown's wait for the re-read
	h.proxy.beforeRejudge = func(string) { <-judge }
	answered := h.goStatus(h.req("GET", itoa(port)+"-"+id+".cube.test", "/", nil))
	// At the sandbox, not only admitted: a delete before its checkout
	// cuts it there (judgeLate, 502 route_changed), which a loaded
	// machine let happen.
	testenv.Recv(t, arrived, 10*time.Second, "the held request at the sandbox")
	if sb := h.proxy.sandboxes.peek(id); sb == nil || sb.inFlight() != 1 {
		t.Fatal("the request at the sandbox is not counted in flight")
	}
	h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, "")
	if st, body := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	close(release)
	if st := <-answered; st != 200 {
		t.Fatalf("request in flight: %d, want 200", st)
	}
	judged()
	testenv.WaitFor(t, 5*time.Second, "the request done", func() bool {
		// Gone is done too: the delete's re-read may forget the entry
		// once its request ended.
		sb := h.proxy.sandboxes.peek(id)
		return sb == nil || sb.inFlight() == 0
	})
	// A day and more later the sweep forgets it, as any idle sandbox.
	h.proxy.sandboxes.sweep(time.Now().Add(25*time.Hour), 24*time.Hour, time.Hour, nil)
	if n := sandboxCount(h.proxy); n != before {
		t.Fatalf("sandbox entries after the sweep: %d, want %d (state %s)", n, before, stateNames[h.proxy.sandboxes.peek(id).state()])
	}
}

// A pause set for an id the store has no route for (or whose route went
// without an invalidation reaching this instance) stayed for good: the
// sweep forgets idle running sandboxes, never pauses. A pause a day old
// is now read for once a day and forgotten when its route is gone; a
// paused sandbox whose route is there keeps its pause, and a fresh
// pause is not read for at all.
func TestOldPauseWithoutRouteIsForgotten(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	kept := h.route("kept", port)
	for _, id := range []string{"ghost", "kept"} {
		if st, body := h.adminDo("POST", "/admin/state", `{"sandbox_id":"`+id+`","state":"paused"}`, ""); st != 200 {
			t.Fatalf("pause %s: %d %s", id, st, body)
		}
	}
	sweepRecheck := func(at time.Time) int64 {
		before := h.counts.n.Load()
		h.proxy.sandboxes.sweep(at, 24*time.Hour, time.Hour, nil)
		h.proxy.recheckInvalidated(context.Background())
		return h.counts.n.Load() - before
	}
	if n := sweepRecheck(time.Now()); n != 0 {
		t.Fatalf("fresh pauses: %d store reads, want 0", n)
	}
	if c := sandboxCount(h.proxy); c != 2 {
		t.Fatalf("%d sandbox entries after a sweep of fresh pauses, want 2", c)
	}
	if n := sweepRecheck(time.Now().Add(25 * time.Hour)); n != 2 {
		t.Errorf("pauses a day old: %d store reads, want 2 (one per paused id)", n)
	}
	if sb := h.proxy.sandboxes.peek("ghost"); sb != nil {
		t.Errorf("the pause of an id with no route is still held (state %s)", stateNames[sb.state()])
	}
	if sb := h.proxy.sandboxes.peek("kept"); sb == nil || sb.state() != statePaused {
		t.Fatal("the pause of a sandbox whose route is there was lost")
	}
	// Its route is cached, so a read would not reach the store: the mark
	// is what says whether the janitor would ask.
	h.proxy.sandboxes.sweep(time.Now().Add(26*time.Hour), 24*time.Hour, time.Hour, nil)
	if h.proxy.sandboxes.peek("kept").unsure.Load() {
		t.Error("an hour after its check, the kept pause is marked to be read for again")
	}
	if st, _, _ := h.get(kept, "/"); st != 503 {
		t.Errorf("the kept paused sandbox answered %d, want 503", st)
	}
}

// An invalidation does not make every instance read the route of each
// running sandbox it knows at once: the janitor's round asks about them
// through the cache, so a sandbox that had a request since (its route
// read again then) costs no store read; only idle ones do.
func TestRecheckReadsOnlyIdleSandboxes(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	busy, idle := h.route("busy", port), h.route("idle", port)
	for _, host := range []string{busy, idle} {
		if st, _, _ := h.get(host, "/"); st != 200 {
			t.Fatalf("GET %s: %d", host, st)
		}
	}
	before := h.counts.n.Load()
	h.proxy.Invalidate("busy")
	h.proxy.Invalidate("idle")
	if n := h.counts.n.Load(); n != before {
		t.Fatalf("invalidating running sandboxes read the store %d times, want 0 until the janitor's round", n-before)
	}
	if st, _, _ := h.get(busy, "/"); st != 200 {
		t.Fatalf("GET busy: %d", st)
	}
	h.proxy.recheckInvalidated(context.Background())
	if n := h.counts.n.Load() - before; n != 2 { // busy's request, idle's check
		t.Errorf("%d store reads, want 2: the request for busy and the check of idle", n)
	}
	if c := sandboxCount(h.proxy); c != 2 {
		t.Errorf("%d sandbox entries, want 2: both routes are there", c)
	}
}

// A kill cuts its sandbox's WebSockets through the sandbox's own pools.
// It walked every tunnel of the instance instead, under the registry lock
// that every event stream and WebSocket registers with: ≈ 1 ms a kill at
// 10k open WebSockets, at the platform's 100-300 kills a second, while
// new streams waited. With that lock held (a walk in progress), a kill
// must still go through.
func TestKillDoesNotWaitForTheStreamRegistry(t *testing.T) {
	h := newHarness(t)
	h.proxy.streams.mu.Lock()
	done := make(chan struct{})
	go func() {
		h.proxy.kill("gone")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("kill waited for the stream registry's lock")
	}
	h.proxy.streams.mu.Unlock()
	<-done
}

// forget and sweep judge an entry forgettable, then take it out of the
// map. A kill, a pause or a request landing on the entry in between used
// to be lost with it: the kill's 410 became a 404 (or the sandbox was
// served), a request's count sat on an entry no other request saw. The
// hook lands each on the entry at that moment; the map must then hold
// what it did.
func TestRetireKeepsWhatLandsMeanwhile(t *testing.T) {
	const id = "sbx"
	now := time.Now()
	sweep := func(s *sandboxes) { s.sweep(now, 24*time.Hour, time.Hour, nil) }
	forget := func(s *sandboxes) { s.forget(id, time.Now().UnixNano()) }
	idle := func(s *sandboxes) { s.get([]byte(id)).lastActive.Store(now.Add(-25 * time.Hour).UnixMilli()) }
	oldKill := func(s *sandboxes) {
		s.setState(id, stateKilled)
		s.peek(id).changedAt.Store(now.Add(-2 * time.Hour).UnixNano())
	}
	kill := func(s *sandboxes) { s.setState(id, stateKilled) }
	// start is a request's lookup and count, as serve does them.
	start := func(s *sandboxes) {
		e := s.get([]byte(id))
		if _, ok := e.enter(); !ok {
			t.Error("a request counted on an entry get returned forgotten")
		}
		e.lastActive.Store(now.UnixMilli())
	}
	// startEnd is a whole request: the count is back where it was, only
	// its time changed.
	startEnd := func(s *sandboxes) {
		start(s)
		s.peek(id).done(now.UnixMilli())
	}
	wantState := func(st uint32) func(*sandboxState) string {
		return func(e *sandboxState) string {
			if got := e.state(); got != st {
				return "state " + stateNames[got] + ", want " + stateNames[st]
			}
			return ""
		}
	}
	wantCount := func(e *sandboxState) string {
		if n := e.inFlight(); n != 1 {
			return "requests in flight " + strconv.FormatInt(n, 10) + ", want 1"
		}
		return ""
	}
	wantActive := func(e *sandboxState) string {
		if la := e.lastActive.Load(); la != now.UnixMilli() {
			return "last active " + strconv.FormatInt(la, 10) + ", want the request's " + strconv.FormatInt(now.UnixMilli(), 10)
		}
		return ""
	}
	wantRecentKill := func(e *sandboxState) string {
		if msg := wantState(stateKilled)(e); msg != "" {
			return msg
		}
		if at := e.changedAt.Load(); at < now.Add(-time.Hour).UnixNano() {
			return "the kill's time is the old one's: the tombstone goes at the next sweep"
		}
		return ""
	}
	cases := []struct {
		name    string
		setup   func(*sandboxes)
		retire  func(*sandboxes)
		between func(*sandboxes)
		check   func(*sandboxState) string
	}{
		{"forget, then kill", idle, forget, kill, wantState(stateKilled)},
		{"forget, then request", idle, forget, start, wantCount},
		{"sweep idle, then kill", idle, sweep, kill, wantState(stateKilled)},
		{"sweep idle, then request", idle, sweep, start, wantCount},
		{"sweep idle, then a whole request", idle, sweep, startEnd, wantActive},
		{"sweep old kill, then kill again", oldKill, sweep, kill, wantRecentKill},
		{"sweep old kill, then request", oldKill, sweep, start, wantCount},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s sandboxes
			tc.setup(&s)
			fired := false
			s.beforeRetire = func(string) {
				if !fired {
					fired = true
					tc.between(&s)
				}
			}
			tc.retire(&s)
			if !fired {
				t.Fatal("the entry was kept without a race: the case tests nothing")
			}
			e := s.peek(id)
			if e == nil {
				t.Fatal("entry forgotten")
			}
			if msg := tc.check(e); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// A request that looked its sandbox up before the entry was forgotten
// must not count on that entry: enter fails, and get gives the entry the
// map holds now, which the next request sees too.
func TestRequestMovesOffAForgottenEntry(t *testing.T) {
	var s sandboxes
	const id = "sbx"
	e := s.get([]byte(id))
	s.forget(id, time.Now().UnixNano())
	if _, ok := e.enter(); ok {
		t.Fatal("a request counted on a forgotten entry")
	}
	if e.inFlight() != 0 {
		t.Errorf("a failed enter left a count of %d", e.inFlight())
	}
	live := s.get([]byte(id))
	if live == e {
		t.Fatal("get returned the forgotten entry")
	}
	if n, ok := live.enter(); !ok || n != 1 {
		t.Fatalf("enter on the live entry: %d %v", n, ok)
	}
	if got := s.get([]byte(id)); got != live || got.inFlight() != 1 {
		t.Errorf("the next request sees %d in flight, want 1", got.inFlight())
	}
}

// A kill or a request that lands while the proxy forgets a sandbox
// (between the look at its entry and the delete) stands: a sandbox killed
// while DELETE /admin/routes or the sweep forgot it answers 410, not 404
// or 200, and a request that began while the sweep forgot its idle
// sandbox stays counted on the entry the next request finds.
func TestForgetRacingKillAndRequest(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	route := `{"HostIP":"127.0.0.1","SandboxIP":"127.0.0.1","CreatedAt":"1","` + itoa(port) + `":"` + itoa(port) + `"}`
	deleteRoute := func(t *testing.T, id string) {
		if st, body := h.adminDo("DELETE", "/admin/routes/"+id, "", ""); st != 200 {
			t.Errorf("DELETE: %d %s", st, body)
		}
	}
	sweepIdle := func(_ *testing.T, id string) {
		h.proxy.sandboxes.peek(id).lastActive.Store(time.Now().Add(-25 * time.Hour).UnixMilli())
		h.proxy.sandboxes.sweep(time.Now(), 24*time.Hour, time.Hour, nil)
	}
	kill := func(id, _ string) { h.proxy.kill(id) }
	wantKilled := func(t *testing.T, _, host string) {
		if st, _, _ := h.get(host, "/"); st != 410 {
			t.Errorf("GET after the kill: %d, want 410", st)
		}
	}
	held := make(chan int, 1)
	request := func(_, host string) {
		go func() {
			resp, err := h.client.Do(h.req("GET", host, "/hold", nil))
			if err != nil {
				held <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			held <- resp.StatusCode
		}()
		select {
		case <-arrived: // counted: it reached the sandbox
		case st := <-held: // answered without: the check reports it
			held <- st
		}
	}
	wantCounted := func(t *testing.T, id, _ string) {
		sb := h.proxy.sandboxes.peek(id)
		if sb == nil || sb.inFlight() != 1 {
			t.Error("the request in flight is no longer counted for its sandbox")
		}
		close(release)
		if st := <-held; st != 200 {
			t.Errorf("request in flight: %d, want 200", st)
		}
		if sb != nil {
			testenv.WaitFor(t, 5*time.Second, "the request's count released", func() bool {
				return sb.inFlight() == 0
			})
		}
	}
	cases := []struct {
		name   string
		forget func(t *testing.T, id string)
		// between runs between the look at the entry and its delete.
		between func(id, host string)
		check   func(t *testing.T, id, host string)
	}{
		{"route deleted, then kill", deleteRoute, kill, wantKilled},
		{"idle swept, then kill", sweepIdle, kill, wantKilled},
		{"idle swept, then request", sweepIdle, request, wantCounted},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := "racing-" + strconv.Itoa(i)
			host := itoa(port) + "-" + id + ".cube.test"
			if st, body := h.adminDo("PUT", "/admin/routes/"+id, route, ""); st != 200 {
				t.Fatalf("PUT: %d %s", st, body)
			}
			if st, _, _ := h.get(host, "/"); st != 200 {
				t.Fatalf("GET: %d", st)
			}
			// The hook runs on the goroutine that forgets: the admin
			// server's for DELETE, this one for the sweep.
			var fired atomic.Bool
			h.proxy.sandboxes.beforeRetire = func(got string) {
				if got == id && fired.CompareAndSwap(false, true) {
					tc.between(id, host)
				}
			}
			tc.forget(t, id)
			h.proxy.sandboxes.beforeRetire = nil
			if !fired.Load() {
				t.Fatal("the sandbox was not forgotten: the case tests nothing")
			}
			tc.check(t, id, host)
		})
	}
}

// blockingStore is a real store whose lookups of the id block wait until
// released (or their context ends); entered receives each such lookup.
type blockingStore struct {
	routing.Store
	block   string
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Lookup(ctx context.Context, id string) (*routing.Route, error) {
	if id == b.block {
		b.entered <- struct{}{}
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return b.Store.Lookup(ctx, id)
}

// Invalidate re-reads a paused sandbox's route in a goroutine of its own.
// It ran on after Shutdown returned, for as long as the store took to
// answer (up to the lookup timeout); started after Shutdown, it was never
// waited for at all. Shutdown cuts it short and waits for it, and nothing
// starts once it has.
func TestShutdownWaitsForInvalidateRereads(t *testing.T) {
	bs := &blockingStore{Store: routing.NewMemoryStore(), block: "paused-gone", entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(bs.release) })
	h := newHarness(t, func(o *harnessOpts) {
		o.store = bs
		o.cache.LookupTimeout = time.Minute // longer than the test: only Shutdown may end the wait
	})
	rereads := func() string {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var found []string
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "rereadRoute") || strings.Contains(g, "created by github.com/cube-sandbox/cubeproxy/proxy.(*Proxy).Invalidate") {
				found = append(found, g)
			}
		}
		return strings.Join(found, "\n\n")
	}

	h.proxy.sandboxes.setState("paused-gone", statePaused)
	h.proxy.Invalidate("paused-gone")
	select {
	case <-bs.entered: // the re-read waits on the store
	case <-time.After(5 * time.Second):
		t.Fatal("the invalidation of a paused sandbox read no route")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.server.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if g := rereads(); g != "" {
		t.Fatalf("a re-read started before Shutdown outlived it:\n%s", g)
	}

	h.proxy.sandboxes.setState("paused-late", statePaused)
	h.proxy.Invalidate("paused-late")
	if g := rereads(); g != "" {
		t.Fatalf("an invalidation after Shutdown started a re-read:\n%s", g)
	}
}

// BenchmarkKillTombstoneBytes measures what a kill's tombstone holds on
// the heap for its hour (killedTTL): the heap in use before and after
// 100k kills of distinct sandboxes, ids of 20 bytes. At 300 kills a
// second an instance holds 1.08M of them.
func BenchmarkKillTombstoneBytes(b *testing.B) {
	const n = 100_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sbx%017d", i)
	}
	for b.Loop() {
		var s sandboxes
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, id := range ids {
			s.setState(id, stateKilled)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/tombstone")
		runtime.KeepAlive(&s)
	}
}

// The janitor's recheckInvalidated reads, through the cache, the route of
// each idle sandbox invalidated since its last round. Shutdown waited for
// a read the store held until the lookup timeout; it now cuts it short.
func TestShutdownCutsRecheckRead(t *testing.T) {
	bs := &blockingStore{Store: routing.NewMemoryStore(), block: "unsure-idle", entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(bs.release) })
	const lookupTimeout = 20 * time.Second
	h := newHarness(t, func(o *harnessOpts) {
		o.store = bs
		o.cache.LookupTimeout = lookupTimeout       // only Shutdown may end the wait sooner
		o.cfg.UpstreamIdleConnTimeout = time.Second // the janitor's first round within 250 ms
	})
	// Seen now (the sweep keeps it), then its route invalidated: the
	// janitor asks about it.
	h.proxy.sandboxes.get([]byte("unsure-idle")).lastActive.Store(time.Now().UnixMilli())
	h.proxy.Invalidate("unsure-idle")
	select {
	case <-bs.entered: // the recheck waits on the store
	case <-time.After(10 * time.Second):
		t.Fatal("the janitor did not recheck the invalidated sandbox")
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	start := time.Now()
	if err := h.server.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > lookupTimeout/2 {
		t.Fatalf("Shutdown took %v: it waited for the recheck's read", took)
	}
}

// serve un-kills a killed sandbox whose route is newer than the kill (a
// sandbox re-created under the id). It judged the kill's time, then
// swapped any killed state to running: a kill of the re-created sandbox
// landing in between (newer than its route) was undone, and the sandbox
// the control plane had just killed was served, its tombstone lost. The
// hook lands each change there; the entry must then say what it did.
func TestUnkillKeepsWhatLandsMeanwhile(t *testing.T) {
	const id = "sbx"
	cases := []struct {
		name    string
		newer   bool // the route is newer than the first kill
		between func(s *sandboxes)
		want    bool // unkill's answer: the request may go on
		state   uint32
	}{
		{"route older than the kill", false, nil, false, stateKilled},
		{"route newer than the kill", true, nil, true, stateRunning},
		{"newer route, then a kill of the new sandbox", true, func(s *sandboxes) { s.setState(id, stateKilled) }, false, stateKilled},
		{"newer route, then a pause", true, func(s *sandboxes) { s.setState(id, statePaused) }, true, statePaused},
		{"newer route, then another request's un-kill", true, func(s *sandboxes) { s.peek(id).casState(stateKilled, stateRunning) }, true, stateRunning},
		{"newer route, then a request's start", true, func(s *sandboxes) { s.peek(id).enter() }, true, stateRunning},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s sandboxes
			killedAt := s.setState(id, stateKilled)
			createdAt := killedAt
			if tc.newer {
				createdAt++
			}
			fired := false
			s.beforeUnkill = func() {
				if !fired && tc.between != nil {
					fired = true
					tc.between(&s)
				}
			}
			e := s.peek(id)
			if got := s.unkill(e, createdAt); got != tc.want {
				t.Errorf("unkill: %v, want %v", got, tc.want)
			}
			if tc.between != nil && !fired {
				t.Fatal("nothing landed between the look and the swap: the case tests nothing")
			}
			if got := e.state(); got != tc.state {
				t.Errorf("state %s, want %s", stateNames[got], stateNames[tc.state])
			}
		})
	}
}

// The same through serve: a kill that lands while a request un-kills the
// sandbox it killed before (its route re-created since, as the control
// plane writes it to Redis, without PUT /admin/routes lifting the kill)
// is answered 410, now and for the requests after.
func TestKillDuringUnkillStands(t *testing.T) {
	h := newHarness(t)
	port := backend(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	const id = "rekilled"
	host := h.route(id, port)
	if st, _, _ := h.get(host, "/"); st != 200 {
		t.Fatalf("GET: %d", st)
	}
	h.proxy.kill(id)
	// Re-created after the kill: its route is newer.
	h.put(id, map[string]string{
		"HostIP": "127.0.0.1", "SandboxIP": "127.0.0.1",
		"CreatedAt": strconv.FormatInt(h.proxy.sandboxes.peek(id).changedAt.Load()+1, 10),
		itoa(port):  itoa(port),
	})
	var fired atomic.Bool
	h.proxy.sandboxes.beforeUnkill = func() {
		if fired.CompareAndSwap(false, true) {
			h.proxy.kill(id) // the re-created sandbox killed in turn
		}
	}
	st, _, _ := h.get(host, "/")
	h.proxy.sandboxes.beforeUnkill = nil
	if !fired.Load() {
		t.Fatal("the request did not un-kill the sandbox: the case tests nothing")
	}
	if st != 410 {
		t.Errorf("GET as the kill lands: %d, want 410", st)
	}
	if st, _, _ := h.get(host, "/"); st != 410 {
		t.Errorf("GET after: %d, want 410", st)
	}
}

// A last_active poll and the janitor's sweep of sandbox entries pause
// every sweepChunk entries: at 100,000 sandboxes each took 5-45 ms of the
// only P in one go, and every request waited for it.
func TestSandboxWalksLetNetworkWaitersRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 100_000
	var s sandboxes
	now := time.Now()
	for i := range n {
		s.get([]byte("sbx-" + strconv.Itoa(i))).lastActive.Store(now.UnixMilli())
	}
	for _, tc := range []struct {
		what string
		work func()
	}{
		{"a last_active poll over 100,000 sandboxes", func() {
			if _, got := s.appendLastActive(nil, 0, now.UnixMilli()); got != n {
				t.Errorf("last_active listed %d of %d sandboxes", got, n)
			}
		}},
		{"the sweep of 100,000 idle sandboxes", func() {
			s.sweep(now.Add(25*time.Hour), 24*time.Hour, time.Hour, nil)
		}},
	} {
		echoesDuring(t, tc.what, tc.work)
	}
	if _, left := s.appendLastActive(nil, 0, now.UnixMilli()); left != 0 {
		t.Fatalf("the sweep left %d of %d idle sandboxes", left, n)
	}
}
