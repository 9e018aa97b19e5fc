package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// benchIDs is how many distinct routes the cold-lookup benchmarks cycle through.
const benchIDs = 10000

func benchStore(b *testing.B) *redisstore.Store {
	r := testenv.StartRedis(b)
	s := openStore(b, r)
	pipe := r.Client().Pipeline()
	for i := range benchIDs {
		pipe.HSet(context.Background(), fmt.Sprintf("%sbench-%d", redisstore.DefaultKeyPrefix, i), controlPlaneFields("10.0.0.5")...)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkLookupCold measures one store lookup (one HGETALL of an existing
// route over loopback, plus parsing) with no cache in front, from parallel
// goroutines: ns/op is the inverse of cold lookups per second.
func BenchmarkLookupCold(b *testing.B) {
	s := benchStore(b)
	ids := make([]string, benchIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Lookup(context.Background(), ids[i%benchIDs]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkLookupNotFound measures a miss for an unknown id: two HGETALLs
// (new and legacy key).
func BenchmarkLookupNotFound(b *testing.B) {
	s := benchStore(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Lookup(context.Background(), "unknown"); err != routing.ErrNotFound {
				b.Error(err)
				return
			}
		}
	})
}
