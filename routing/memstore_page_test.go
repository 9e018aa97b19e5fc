package routing

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// tableOf returns a store holding routes with the given ids, put straight
// into its map: Page reads only ids, and 100k validated Puts would take
// the test's time.
func tableOf(ids []string) *MemoryStore {
	s := NewMemoryStore()
	for _, id := range ids {
		s.routes[id] = &Route{ID: id}
	}
	return s
}

// listPage is the page Page must return, from the sorted full list.
func listPage(s *MemoryStore, after string, limit int) ([]string, bool) {
	var ids []string
	for _, r := range s.List() {
		if r.ID > after {
			ids = append(ids, r.ID)
		}
	}
	if limit > 0 && len(ids) > limit {
		return ids[:limit], true
	}
	return ids, false
}

func pageIDs(page []*Route) []string {
	ids := make([]string, len(page))
	for i, r := range page {
		ids[i] = r.ID
	}
	return ids
}

// Page agrees with slicing the sorted list, for every position of after
// (before, on, between and past the ids) and limits around the table's
// size and the page boundaries.
func TestMemoryStorePageMatchesSortedList(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 7, 64, 300} {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("sb-%x", rng.Uint64())
		}
		s := tableOf(ids)
		afters := []string{"", "a", "sb-", "sb-8", "zz"}
		for _, id := range ids[:min(n, 10)] {
			afters = append(afters, id, id+"0", id[:len(id)-1])
		}
		for _, after := range afters {
			for _, limit := range []int{0, 1, 2, 3, 5, n - 1, n, n + 1, 100} {
				got, more := s.Page(after, limit)
				want, wantMore := listPage(s, after, limit)
				if !slices.Equal(pageIDs(got), want) || more != wantMore {
					t.Fatalf("n=%d Page(%q, %d) = %v, %v; want %v, %v", n, after, limit, pageIDs(got), more, want, wantMore)
				}
			}
		}
	}
}

// Paging through the whole table, each page starting after the last one's
// final id, returns every route once, in order.
func TestMemoryStorePagesCoverTable(t *testing.T) {
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb-%04d", (i*7919)%1000) // all 1000, out of order
	}
	s := tableOf(ids)
	var seen []string
	after := ""
	for pages := 0; ; pages++ {
		page, more := s.Page(after, 64)
		seen = append(seen, pageIDs(page)...)
		if !more {
			break
		}
		if pages > 20 {
			t.Fatal("more pages than the table holds")
		}
		after = page[len(page)-1].ID
	}
	slices.Sort(ids)
	if !slices.Equal(seen, ids) {
		t.Fatalf("pages returned %d ids, want the table's %d in order", len(seen), len(ids))
	}
}

// A page of a large table costs its own size, not the table's: the old
// listing copied and sorted all 100k routes (800 KB of pointers) for a
// page of 10.
func TestMemoryStorePageDoesNotCopyTable(t *testing.T) {
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb-%06d", i)
	}
	s := tableOf(ids)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	page, more := s.Page("sb-050000", 10)
	runtime.ReadMemStats(&after)
	if got := pageIDs(page); !more || len(got) != 10 || got[0] != "sb-050001" || got[9] != "sb-050010" {
		t.Fatalf("page %v more %v", got, more)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Fatalf("a page of 10 from 100k routes allocated %d bytes, want the page's own (< 64 KiB)", n)
	}
}

func BenchmarkMemoryStorePage(b *testing.B) {
	ids := make([]string, 100_000)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-%04x-sandbox", rand.Uint32(), i)
	}
	s := tableOf(ids)
	after := "80000000"
	b.Run("Page", func(b *testing.B) {
		for b.Loop() {
			if page, _ := s.Page(after, 1000); len(page) != 1000 {
				b.Fatal(len(page))
			}
		}
	})
	// What a page cost before Page: the sorted list, searched for after.
	b.Run("SortedList", func(b *testing.B) {
		for b.Loop() {
			all := s.List()
			i, _ := slices.BinarySearchFunc(all, after, func(r *Route, id string) int { return strings.Compare(r.ID, id) })
			if page := all[i : i+1000]; len(page) != 1000 {
				b.Fatal(len(page))
			}
		}
	})
}
