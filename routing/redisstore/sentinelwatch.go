package redisstore

import (
	"context"
	"net"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// A Sentinel subscription stays on the server it was dialed to for as
// long as that server answers: go-redis follows a failover (+switch-master)
// with its pooled connections, never with a subscription's. A master the
// sentinels failed over from but could not turn into a replica (a
// partition that cuts it off from them and not from the proxies, its
// sentinel credentials changed) runs on as a master and answers PINGs,
// and every invalidation published on the new master was lost, the cache
// never expired, for as long as it ran
// (TestInvalidationLeavesMasterTheSentinelsLeft). So the subscriber
// learns where its connection went (dialedAddr, filled in by the dial),
// asks the sentinels every pingIdle command timeouts which master they
// name (sentinelMasters), and leaves a server none of them names.

// dialedKey is the context key of a Sentinel subscription's dialedAddr.
type dialedKey struct{}

// dialedAddr is the address of the data node a subscription's connection
// was last dialed to ("" before any).
type dialedAddr struct {
	mu   sync.Mutex
	addr string
}

func (d *dialedAddr) get() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.addr
}

// noteDialed records addr in ctx's dialedAddr, if it carries one. go-redis
// dials a subscription's connection within the context of the call that
// needs it (Subscribe, Receive, Ping), and asks a sentinel for the
// master's address within it first: a sentinel it discovered is dialed
// here too, but always before the data node, whose address is the last.
func noteDialed(ctx context.Context, addr string) {
	if d, ok := ctx.Value(dialedKey{}).(*dialedAddr); ok {
		d.mu.Lock()
		d.addr = addr
		d.mu.Unlock()
	}
}

// sentinelMasters asks the configured sentinels for the master's address.
type sentinelMasters struct {
	name    string
	clients []*redis.SentinelClient
}

// newSentinelMasters returns clients of cfg's sentinels, built as the
// failover client's are (TLS, password, capped reads). Their TLS files
// are read on their own, and what reading them logs is the failover
// client's to say: logged by both, each line came twice.
func newSentinelMasters(cfg Config) (*sentinelMasters, error) {
	cfg = cfg.WithDefaults()
	cfg.Logger = nil
	tc, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	t := budget(cfg.CommandTimeout)
	dial := newSentinelDialer(cfg.Sentinel.Addrs, t, tc, cfg.OnShortage).dial
	m := &sentinelMasters{name: cfg.Sentinel.MasterName}
	for _, a := range cfg.Sentinel.Addrs {
		m.clients = append(m.clients, redis.NewSentinelClient(&redis.Options{
			Addr:                     a,
			Dialer:                   dial,
			Password:                 cfg.Sentinel.Password,
			OnConnect:                setClientName,
			Protocol:                 2,
			MaxRetries:               -1, // asked again at the next check
			DialTimeout:              t.dial,
			ReadTimeout:              t.read,
			WriteTimeout:             t.read,
			ContextTimeoutEnabled:    true,
			PoolSize:                 1,
			PipelinePoolSize:         noPipelinePool,
			TLSConfig:                tc.conf,
			DisableIdentity:          true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}))
	}
	return m, nil
}

// named returns the master's address as each sentinel that answers
// within ctx names it, asking them all at once.
func (m *sentinelMasters) named(ctx context.Context) []string {
	var mu sync.Mutex
	var addrs []string
	var wg sync.WaitGroup
	for _, c := range m.clients {
		wg.Go(func() {
			a, err := c.GetMasterAddrByName(ctx, m.name).Result()
			if err != nil || len(a) != 2 {
				return
			}
			mu.Lock()
			addrs = append(addrs, net.JoinHostPort(a[0], a[1]))
			mu.Unlock()
		})
	}
	wg.Wait()
	return addrs
}

func (m *sentinelMasters) close() {
	if m == nil {
		return
	}
	for _, c := range m.clients {
		_ = c.Close()
	}
}
