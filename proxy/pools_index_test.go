package proxy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
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
