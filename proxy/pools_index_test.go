package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/routing"
)

// checkIndex fails unless byID lists exactly m's keys, by sandbox id.
func checkIndex(t *testing.T, ps *pools) {
	t.Helper()
	n := 0
	for id, keys := range ps.byID {
		if len(keys) == 0 {
			t.Errorf("byID[%q] is empty but present", id)
		}
		for _, k := range keys {
			if k.id != id || ps.m[k] == nil {
				t.Errorf("byID[%q] lists %v, which m does not hold under that id", id, k)
			}
		}
		n += len(keys)
	}
	if n != len(ps.m) {
		t.Errorf("byID lists %d keys, m holds %d pools", n, len(ps.m))
	}
}

// A kill finds a sandbox's pools through the index by id, and pools
// created, swept and killed keep the index and the map in step: a pool
// missing from the index would survive its sandbox's kill and keep serving
// a killed VM's address.
func TestPoolsIndexFollowsTheMap(t *testing.T) {
	ps := &pools{m: make(map[poolKey]*upstream)}
	addr := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), port) }
	now := time.Now()
	for _, k := range []poolKey{
		{"a", 1, addr(1)}, {"a", 1, addr(2)}, // two ports of one sandbox
		{"a", 5, addr(1)}, // recreated after the kill below
		{"b", 1, addr(1)}, {"c", 1, addr(3)},
	} {
		ps.get(k, now.UnixNano())
	}
	ps.get(poolKey{"a", 1, addr(1)}, now.UnixNano()) // an existing pool is not indexed twice
	checkIndex(t, ps)

	ps.kill("a", 3)
	checkIndex(t, ps)
	var left []poolKey
	for k := range ps.m {
		left = append(left, k)
	}
	if len(left) != 3 || ps.m[poolKey{"a", 5, addr(1)}] == nil || ps.m[poolKey{"b", 1, addr(1)}] == nil || ps.m[poolKey{"c", 1, addr(3)}] == nil {
		t.Fatalf("after killing a (created at or before 3): pools %v, want a@5, b and c", left)
	}

	// c is used again now; a@5 and b stay unused past the pool idle time.
	later := now.Add(2 * time.Hour)
	ps.get(poolKey{"c", 1, addr(3)}, later.UnixNano())
	ps.sweep(later, time.Minute, time.Hour, 0, nil)
	checkIndex(t, ps)
	if len(ps.m) != 1 || ps.m[poolKey{"c", 1, addr(3)}] == nil {
		t.Fatalf("after the sweep: %d pools, want c's alone", len(ps.m))
	}
	ps.kill("c", 1)
	checkIndex(t, ps)
	if len(ps.m) != 0 || len(ps.byID) != 0 {
		t.Fatalf("after killing c: %d pools, %d ids indexed", len(ps.m), len(ps.byID))
	}
}

// A kill among 50,000 other sandboxes' pools: it holds the pool map's
// write lock, which every request's pool lookup waits for, so its cost
// must not grow with the pools of other sandboxes (a walk over all of
// them took ≈ 1 ms).
func BenchmarkPoolsKill(b *testing.B) {
	ps := &pools{m: make(map[poolKey]*upstream)}
	now := time.Now().UnixNano()
	for i := range 50000 {
		ps.get(poolKey{fmt.Sprintf("sbx%d", i), 1, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i))}, now)
	}
	victim := poolKey{"victim", 1, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), 1)}
	b.ReportAllocs()
	for b.Loop() {
		ps.get(victim, now)
		ps.kill("victim", 1)
	}
}

// A new pool at another IP than its sandbox's other pools, or of another
// CreatedAt, closes their idle connections (the route moved the sandbox
// to another node, or names one created again); one at another port of
// the same IP, an existing pool looked up again, or another sandbox's new
// pool closes none.
func TestPoolCreateClosesSupersededIdle(t *testing.T) {
	at := func(ip string, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ip), port)
	}
	a1, a2 := poolKey{"a", 1, at("10.0.0.1", 1)}, poolKey{"a", 1, at("10.0.0.1", 2)} // two ports of a
	b := poolKey{"b", 1, at("10.0.0.2", 1)}                                          // another sandbox, on a's new node
	for _, tc := range []struct {
		name   string
		next   poolKey
		closed []poolKey
	}{
		{"another port at the same IP", poolKey{"a", 1, at("10.0.0.1", 3)}, nil},
		{"moved to another node", poolKey{"a", 1, at("10.0.0.2", 1)}, []poolKey{a1, a2}},
		{"created again at the same address", poolKey{"a", 2, at("10.0.0.1", 1)}, []poolKey{a1, a2}},
		{"an existing pool", a1, nil},
		{"another sandbox's first pool", poolKey{"c", 1, at("10.0.0.1", 1)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := &pools{m: make(map[poolKey]*upstream)}
			now := time.Now().UnixNano()
			closes := make(map[poolKey]*atomic.Int64)
			for _, k := range []poolKey{a1, a2, b} {
				u := ps.get(k, now)
				closes[k] = new(atomic.Int64)
				for range 2 {
					mine, theirs := net.Pipe()
					t.Cleanup(func() { _ = theirs.Close() })
					u.idle = append(u.idle, &upstreamConn{Conn: closeCounter{mine, closes[k]}, pool: u})
					u.conns.Add(1)
				}
			}
			ps.get(tc.next, now)
			checkIndex(t, ps)
			for _, k := range []poolKey{a1, a2, b} {
				want := 0
				if slices.Contains(tc.closed, k) {
					want = 2
				}
				u := ps.m[k]
				if n := closes[k].Load(); n != int64(want) || len(u.idle) != 2-want || u.conns.Load() != int32(2-want) {
					t.Errorf("pool %s@%d %s: %d idle connections closed, %d idle, %d open; want %d closed", k.id, k.createdAt, k.addr, n, len(u.idle), u.conns.Load(), want)
				}
			}
		})
	}
}

// routesTo names a pool exactly when the route would dial its address
// for one of its ports: on another node its host port there, on this node
// (NodeIP) the sandbox's own address and any container port, mapped or
// not, and only for the incarnation the pool was made for.
func TestRoutesTo(t *testing.T) {
	at := func(ip string, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ip), port)
	}
	route := &routing.Route{ID: "a", HostIP: netip.MustParseAddr("10.0.0.1"), SandboxIP: netip.MustParseAddr("192.168.0.5"),
		CreatedAt: 1, Ports: map[uint16]uint16{8080: 30001, 50005: 30002}}
	for _, tc := range []struct {
		name   string
		nodeIP string // "" = none
		r      *routing.Route
		k      poolKey
		want   bool
	}{
		{"a mapped host port", "", route, poolKey{"a", 1, at("10.0.0.1", 30002)}, true},
		{"a host port no longer mapped", "", route, poolKey{"a", 1, at("10.0.0.1", 30003)}, false},
		{"another node", "", route, poolKey{"a", 1, at("10.0.0.2", 30001)}, false},
		{"another incarnation", "", route, poolKey{"a", 2, at("10.0.0.1", 30001)}, false},
		{"no route", "", nil, poolKey{"a", 1, at("10.0.0.1", 30001)}, false},
		{"the sandbox's own address, on another node", "", route, poolKey{"a", 1, at("192.168.0.5", 8080)}, false},
		{"on this node: the sandbox's own address", "10.0.0.1", route, poolKey{"a", 1, at("192.168.0.5", 8080)}, true},
		{"on this node: a port it does not map", "10.0.0.1", route, poolKey{"a", 1, at("192.168.0.5", 8081)}, true},
		{"on this node: another address", "10.0.0.1", route, poolKey{"a", 1, at("192.168.0.6", 8080)}, false},
		{"on this node: the host port", "10.0.0.1", route, poolKey{"a", 1, at("10.0.0.1", 30001)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{}
			if tc.nodeIP != "" {
				p.cfg.NodeIP = netip.MustParseAddr(tc.nodeIP)
			}
			if got := p.routesTo(tc.r, tc.k); got != tc.want {
				t.Fatalf("routesTo(%s@%d) = %v, want %v", tc.k.addr, tc.k.createdAt, got, tc.want)
			}
		})
	}
}

// stats reports the number of pools, their open connections, and the
// requests waiting for response headers on them. Only the tests read
// these (the metrics take gauges), so it lives here, out of the binary.
func (ps *pools) stats() (pools, conns, pending int) {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	for _, u := range ps.m {
		conns += int(u.conns.Load())
		pending += int(u.pending.Load())
	}
	return len(ps.m), conns, pending
}
