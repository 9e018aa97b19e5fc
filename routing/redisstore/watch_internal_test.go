package redisstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// replyError is an error reply of the server's, as go-redis hands it to
// a PubSub's reader (a redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// countingInvalidator is an Invalidator that only counts.
type countingInvalidator struct{ expired int }

func (c *countingInvalidator) Invalidate(string) int { return 0 }
func (c *countingInvalidator) ExpireAll() int        { c.expired++; return 0 }

// A subscription the server refused (an ACL without the channel), whose
// connection was then cut, and which go-redis's new connection then
// subscribed (the ACL fixed meanwhile), is a subscription like any other:
// PINGed when quiet, not replaced at the next tick as a refused one is,
// which cost a needless new connection and a re-read of every cached
// route. The messages are handed to watch as go-redis's reader would, all
// of them before its first tick, and its result does not depend on when
// that tick comes: the PING (to a port that refuses, so it fails) comes
// at the first quiet tick after the subscription, and watch ends at the
// next, with no reply, saying the subscription was not refused.
func TestWatchRefusalThenAcceptedResubscribeIsPinged(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: testenv.RefusingAddr(t), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	ps := client.Subscribe(context.Background()) // no channel: nothing dialed
	t.Cleanup(func() { _ = ps.Close() })
	cache := &countingInvalidator{}
	sub := &Subscriber{client: client, channel: "ch", cache: cache, logger: slog.New(slog.DiscardHandler),
		idle: 20 * time.Millisecond, timeout: 20 * time.Millisecond,
		ready: make(chan struct{}), stop: make(chan struct{}), base: context.Background()}
	in := make(chan any, 3)
	in <- error(replyError("NOPERM User cube has no permissions to access the 'ch' channel"))
	in <- error(io.EOF) // the connection cut
	in <- &redis.Subscription{Kind: "subscribe", Channel: "ch", Count: 1}
	done := make(chan [4]bool, 1)
	go func() {
		stopped, subscribed, refused, left := sub.watch(ps, nil, in)
		done <- [4]bool{stopped, subscribed, refused, left}
	}()
	got := testenv.Recv(t, done, 10*time.Second, "watch to end after its unanswered PING")
	if stopped, subscribed, refused, left := got[0], got[1], got[2], got[3]; stopped || !subscribed || refused || left {
		t.Errorf("watch = stopped %v, subscribed %v, refused %v, left %v; want subscribed only: the server took the later SUBSCRIBE", stopped, subscribed, refused, left)
	}
	if sub.broken == nil {
		t.Error("no PING was sent (its failed dial would be the reason kept): the subscription was replaced as a refused one")
	}
	if cache.expired != 1 {
		t.Errorf("%d ExpireAll, want 1 (the subscription's)", cache.expired)
	}
}

// timeoutError is a net.Error that timed out (a dial's i/o timeout).
type timeoutError struct{}

func (timeoutError) Error() string   { return "dial tcp 10.0.0.1:6379: i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// The reason kept for a subscription without a connection is the most
// telling one since the last reply: under load a dial ran out of its
// budget after the server's refusal (a certificate not trusted) had been
// met, and the reconnect warning said only "context deadline exceeded".
// A timeout is kept only when nothing else was met; anything else
// replaces what was kept.
func TestNoteBrokenKeepsTheTellingReason(t *testing.T) {
	refused := errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority")
	reset := errors.New("read tcp: connection reset by peer")
	for _, tc := range []struct {
		name string
		errs []error
		want error
	}{
		{"a refusal, then a deadline", []error{refused, context.DeadlineExceeded}, refused},
		{"a refusal, then a dial's i/o timeout", []error{refused, timeoutError{}}, refused},
		{"a deadline alone", []error{context.DeadlineExceeded}, context.DeadlineExceeded},
		{"a deadline, then a refusal", []error{context.DeadlineExceeded, refused}, refused},
		{"a refusal, then a reset", []error{refused, reset}, reset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := &Subscriber{}
			for _, err := range tc.errs {
				sub.noteBroken(err)
			}
			if sub.broken != tc.want {
				t.Errorf("kept %v, want %v", sub.broken, tc.want)
			}
		})
	}
}
