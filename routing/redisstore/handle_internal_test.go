package redisstore

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// recordingInvalidator is an Invalidator that records the ids it is asked
// to drop.
type recordingInvalidator struct{ ids []string }

func (r *recordingInvalidator) Invalidate(id string) int { r.ids = append(r.ids, id); return 1 }
func (r *recordingInvalidator) ExpireAll() int           { return 0 }

// An invalidation names a sandbox as a publisher writes it: the id is
// trimmed and lowercased (sandbox ids are lowercase, as a Host is read),
// so "SBX-1\n" from a script drops the route of sbx-1 instead of being
// logged as a bad id while the stale route is served.
func TestInvalidationPayloadNormalized(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    []string // ids invalidated
	}{
		{"sbx-1", []string{"sbx-1"}},
		{"SBX-1", []string{"sbx-1"}},
		{" sbx-1\n", []string{"sbx-1"}},
		{"Bad*Id", nil},
		{"", nil},
	} {
		cache := &recordingInvalidator{}
		sub := &Subscriber{cache: cache, logger: slog.New(slog.DiscardHandler)}
		subscribed := false
		if !sub.handle(&redis.Message{Channel: "ch", Payload: tc.payload}, &subscribed) {
			t.Errorf("%q: handle asked to replace the subscription", tc.payload)
		}
		if !slices.Equal(cache.ids, tc.want) {
			t.Errorf("payload %q invalidated %q, want %q", tc.payload, cache.ids, tc.want)
		}
		if want := int64(len(tc.want)); sub.Applied() != want {
			t.Errorf("payload %q: Applied() = %d, want %d", tc.payload, sub.Applied(), want)
		}
	}
}
