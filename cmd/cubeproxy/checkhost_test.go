package main

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/config"
)

// check must accept every listener address serve can bind: a refusal of
// one serve would serve on stops a rollout for nothing. Each address is
// bound as serve binds it (listenTCP, port 0 so no port is taken) and,
// when that works, given to checkListenHosts under each listener key.
// Every address of this machine's interfaces is tried too, a link-local
// IPv6 one with its zone (serve binds it only so). Addresses the machine
// cannot bind (no IPv6, no such name) are skipped,
// not failed: the test holds check to serve, on whatever machine it runs.
// CUBEPROXY_TEST_LISTEN_HOSTS adds comma-separated host:0 addresses (a
// name in /etc/hosts with both an A and an AAAA address, a host without
// IPv6 in a network namespace) for a manual run.
func TestCheckAcceptsWhatServeBinds(t *testing.T) {
	addrs := []string{
		":0", "0.0.0.0:0", "[::]:0", "127.0.0.1:0", "[::1]:0", "localhost:0",
		"[::ffff:127.0.0.1]:0", "127.0.0.2:0",
	}
	addrs = append(addrs, interfaceAddrs(t)...)
	if extra := os.Getenv("CUBEPROXY_TEST_LISTEN_HOSTS"); extra != "" {
		addrs = append(addrs, strings.Split(extra, ",")...)
	}
	for _, addr := range addrs {
		t.Run(addr, func(t *testing.T) {
			ln, err := listenTCP(context.Background(), addr, false)
			if err != nil {
				t.Skipf("serve cannot bind %s here either: %v", addr, err)
			}
			_ = ln.Close()
			for _, cfg := range []*config.Config{{HTTPAddr: addr}, {HTTPSAddr: addr}, {AdminAddr: addr}} {
				if err := checkListenHosts(cfg); err != nil {
					t.Errorf("serve binds %s, check refuses it: %v", addr, err)
				}
			}
		})
	}
}

// interfaceAddrs lists an address with port 0 for each IP address of this
// machine's interfaces, a link-local IPv6 one with its interface as zone.
func interfaceAddrs(t *testing.T) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatalf("interfaces: %v", err)
	}
	var out []string
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			t.Fatalf("addresses of %s: %v", ifc.Name, err)
		}
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			host := n.IP.String()
			if n.IP.To4() == nil && n.IP.IsLinkLocalUnicast() {
				host += "%" + ifc.Name
			}
			out = append(out, net.JoinHostPort(host, "0"))
		}
	}
	return out
}
