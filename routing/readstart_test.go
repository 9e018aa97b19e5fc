package routing

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// Every caller answered "no route" by one store read, whether it started
// the read, joined it later or was answered by the negative entry it left,
// learns when that read began: a caller acting on the answer against
// changes it knows the times of (the proxy forgetting a pause) must not
// date it at its own call. An outage's error says no read time.
func TestCacheReadStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := newCountingStore(func(context.Context, string) (*Route, error) {
			<-release
			return nil, ErrNotFound
		})
		c := newTestCache(t, s, nil)
		began := time.Now().UnixNano()
		answers := make(chan error, 2)
		go func() {
			_, _, err := get(t, c, "gone")
			answers <- err
		}()
		synctest.Wait() // the read is in flight
		time.Sleep(100 * time.Millisecond)
		go func() {
			_, _, err := get(t, c, "gone")
			answers <- err
		}()
		synctest.Wait() // the second caller waits on the same read
		close(release)
		errs := []error{<-answers, <-answers}
		time.Sleep(time.Second)
		_, res, err := get(t, c, "gone")
		if res != CacheNegativeHit {
			t.Fatalf("third Get: %v, want a negative hit", res)
		}
		errs = append(errs, err)
		for i, err := range errs {
			if start, ok := ReadStart(err); !errors.Is(err, ErrNotFound) || !ok || start != began {
				t.Errorf("answer %d: %v, read start %d %v; want ErrNotFound read at %d", i, err, start, ok, began)
			}
		}
		if n := s.calls.Load(); n != 1 {
			t.Errorf("%d store calls, want 1", n)
		}

		s.set(answerDown)
		if _, _, err := get(t, c, "down"); err == nil {
			t.Fatal("Get with the store down: no error")
		} else if _, ok := ReadStart(err); ok {
			t.Errorf("an outage's error %v has a read start", err)
		}
	})
}
