// Command backend is the origin server of the benchmark harness: it plays the
// sandbox ports that CubeProxy, nginx and the direct subject forward to.
//
// Fast ports (fasthttp) serve /small, /bytes and /sse; std ports (net/http)
// serve /ws (coder/websocket echo) and /mcp (go-sdk streamable HTTP server).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	fastPorts := flag.String("fast-ports", "20001", "comma-separated loopback ports served by fasthttp (/small, /bytes, /sse)")
	stdPorts := flag.String("std-ports", "20002", "comma-separated loopback ports served by net/http (/ws, /mcp)")
	maxHold := flag.Duration("max-hold", 120*time.Second, "upper bound for any stream the backend holds open")
	sandboxIPs := flag.Int("sandbox-ips", 64, "also serve the fast ports on 127.0.1.1 … 127.0.1.N: the cold scenario's sandboxes, each with an address of its own as in production")
	flag.Parse()
	if *sandboxIPs < 0 || *sandboxIPs > 250 {
		log.Fatalf("backend: -sandbox-ips %d: want 0 to 250", *sandboxIPs)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fb := newFastBackend(*maxHold)
	fastAddrs := []string{"127.0.0.1"}
	for i := 1; i <= *sandboxIPs; i++ {
		fastAddrs = append(fastAddrs, sandboxIP(i-1))
	}
	for _, p := range splitPorts(*fastPorts) {
		for _, ip := range fastAddrs {
			ln, err := net.Listen("tcp4", ip+":"+p)
			if err != nil {
				log.Fatalf("backend: listen fast port %s:%s: %v", ip, p, err)
			}
			srv := fb.server()
			if ip != "127.0.0.1" {
				// A cold sandbox's connection serves one request and then
				// idles until the proxy closes it. Holding its 16 KiB reader
				// and 64 KiB writer meanwhile grew this process to a
				// gigabyte and stole the load generator's core (page faults,
				// 100 ms GC cycles); a real sandbox is a VM of its own.
				srv.ReduceMemoryUsage = true
			}
			go func() {
				if err := srv.Serve(ln); err != nil {
					log.Printf("backend: fasthttp serve %s:%s: %v", ip, p, err)
				}
			}()
		}
	}
	for _, p := range splitPorts(*stdPorts) {
		ln, err := net.Listen("tcp4", "127.0.0.1:"+p)
		if err != nil {
			log.Fatalf("backend: listen std port %s: %v", p, err)
		}
		srv := &http.Server{Handler: newStdMux(*maxHold), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Printf("backend: net/http serve %s: %v", p, err)
			}
		}()
	}
	fmt.Println("backend ready")

	// Streams held open by the benchmark end with the process: no graceful
	// shutdown is needed for a load-test origin, and none can hang the harness.
	<-ctx.Done()
}

// sandboxIP is the i-th extra loopback address (i < 250). The load
// generator's cold scenario computes the same addresses (bench/scen_cold.go).
func sandboxIP(i int) string { return fmt.Sprintf("127.0.1.%d", i+1) }

func splitPorts(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
