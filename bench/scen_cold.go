package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// routeKeyPrefix is the control plane's Redis key of a sandbox route.
const routeKeyPrefix = "cube:v1:shared:sandbox:proxy:"

// writeRoutes stores one route hash per id, in pipelined batches. The
// sandboxes run on this node (HostIP is the proxy's node IP), each on one of
// ips loopback addresses the backend also listens on (127.0.1.1 …, see
// bench/backend -sandbox-ips), or on 127.0.0.1 when ips is 0. In production
// every sandbox has an address of its own; with all of them on one address,
// a cold run's 20,000 new connections would exhaust the ephemeral ports to
// it (TIME_WAIT) and measure the kernel's port search instead of the proxy.
func writeRoutes(ctx context.Context, rdb *redis.Client, ids []string, port, ips int) error {
	p := strconv.Itoa(port)
	for start := 0; start < len(ids); start += 1000 {
		pipe := rdb.Pipeline()
		for i, id := range ids[start:min(start+1000, len(ids))] {
			ip := "127.0.0.1"
			if ips > 0 {
				ip = "127.0.1." + strconv.Itoa((start+i)%ips+1)
			}
			pipe.HSet(ctx, routeKeyPrefix+id, "HostIP", "127.0.0.1", "SandboxIP", ip,
				"CreatedAt", "1", p, p)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redis hset routes: %w", err)
		}
	}
	return nil
}

func deleteRoutes(ctx context.Context, rdb *redis.Client, ids []string) {
	for start := 0; start < len(ids); start += 1000 {
		keys := make([]string, 0, 1000)
		for _, id := range ids[start:min(start+1000, len(ids))] {
			keys = append(keys, routeKeyPrefix+id)
		}
		_ = rdb.Del(ctx, keys...).Err()
	}
}

// runCold requests r sandbox ids that were just written to Redis, each
// exactly once, so every request is a cache miss in the proxy.
func runCold(o *options, args []string) (*Sample, error) {
	fs := flag.NewFlagSet("cold", flag.ContinueOnError)
	o.register(fs, 20001)
	r := fs.Int("r", 20000, "distinct sandbox ids, each requested once")
	c := fs.Int("c", 32, "concurrent keep-alive connections")
	ips := fs.Int("sandbox-ips", 64, "spread the sandboxes over this many loopback addresses (bench/backend -sandbox-ips; 0: all on 127.0.0.1)")
	redisAddr := fs.String("redis", "", "Redis address to write the routes to (empty: do not write, e.g. for direct)")
	if err := o.parse(fs, args); err != nil {
		return nil, err
	}
	ctx := context.Background()
	nonce := strconv.FormatInt(time.Now().UnixNano()%1e12, 36)
	ids := make([]string, *r)
	for i := range ids {
		ids[i] = "cold" + nonce + "-" + strconv.Itoa(i)
	}
	if *redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
		defer rdb.Close()
		if err := writeRoutes(ctx, rdb, []string{o.id}, o.port, 0); err != nil {
			return nil, err
		}
		if err := writeRoutes(ctx, rdb, ids, o.port, *ips); err != nil {
			return nil, err
		}
		defer deleteRoutes(ctx, rdb, ids)
	}

	deadline := time.Now().Add(o.warm + 2*time.Minute)
	warmReq := buildGET("/small", o.host(o.id))
	var next atomic.Int64
	type worker struct {
		rc *rawConn
		tally
	}
	workers := make([]*worker, *c)
	for i := range workers {
		workers[i] = &worker{rc: newRawConn(o.addr, 16<<10), tally: tally{h: newHist()}}
		workers[i].rc.deadline = deadline
	}
	// Warm the connections on a route that is already cached.
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				_, _, _ = w.rc.roundTrip(warmReq)
			}
		}()
	}
	wg.Wait()
	time.Sleep(o.warm)

	m := o.newMeter()
	m.start()
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, 0, 256)
			for {
				i := next.Add(1) - 1
				if i >= int64(len(ids)) {
					return
				}
				req = append(req[:0], "GET /small HTTP/1.1\r\nHost: "...)
				req = append(req, o.host(ids[i])...)
				req = append(req, "\r\nUser-Agent: cube-bench\r\n\r\n"...)
				t0 := time.Now()
				status, _, err := w.rc.roundTrip(req)
				el := time.Since(t0)
				switch {
				case err != nil:
					w.errs++
					w.err = err
				case status != 200:
					w.errs++
					w.err = fmt.Errorf("status %d for %s", status, ids[i])
				default:
					w.ops++
					w.h.record(int64(el))
				}
			}
		}()
	}
	wg.Wait()
	m.stop()

	s := o.newSample("cold", fmt.Sprintf("r=%d c=%d", *r, *c), m)
	for _, w := range workers {
		w.rc.close()
	}
	h, firstErr := mergeTallies(s, workers)
	s.Metrics["lookups_per_s"] = float64(s.Ops) / m.wall.Seconds()
	s.Metrics["p50_us"] = us(h.quantile(0.5))
	s.Metrics["p99_us"] = us(h.quantile(0.99))
	s.Metrics["p999_us"] = us(h.quantile(0.999))
	s.Metrics["max_us"] = us(h.max)
	if len(m.subject) > 0 && s.Ops > 0 {
		s.Metrics["cpu_us_per_req"] = m.subjectCPU.Seconds() * 1e6 / float64(s.Ops)
	}
	o.checkErrors(s, firstErr)
	return s, nil
}
