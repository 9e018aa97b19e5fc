package main

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The drain begins when the signal comes, also while an ACME order holds
// a storage lock that it is slow to release: certmagic deletes the DNS-01
// record after a cancel with a context of its own (up to its propagation
// timeout, 2 min by default), and the certificates' close waits up to 5 s
// for the lock. That wait came before the drain, so for those 5 s the
// listeners still took new connections and /readyz did not say draining.
func TestDrainDoesNotWaitForACMELocks(t *testing.T) {
	dnsSrv := testenv.StartDNS(t, "cube.test")
	pb := testenv.StartPebble(t, dnsSrv.Addr)
	relay, deleting := stallingDNSRelay(t, dnsSrv.Addr)
	section := acmeTLSSection(t, pb, dnsSrv, "")
	section = strings.Replace(section, fmt.Sprintf("server: %q", dnsSrv.Addr), fmt.Sprintf("server: %q", relay), 1)
	p := startTLSProxy(t, tlsConfigYAML(t, map[string]int{"abc": tlsWhoami(t, "abc")}, section))
	select {
	case <-deleting: // the order holds its lock until the delete is answered
	case <-time.After(60 * time.Second):
		t.Fatalf("the wildcard's order never came to deleting its DNS record\n%s", p.logs)
	}

	start := time.Now()
	stopped := make(chan struct{})
	go func() { defer close(stopped); p.stop() }()
	testenv.WaitFor(t, 10*time.Second, "the HTTP listener to close", func() bool {
		c, err := net.DialTimeout("tcp", p.http, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the listeners closed %v after the stop (an ACME lock held); want the drain to begin at once", took.Round(time.Millisecond))
	}
	<-stopped
}

// stallingDNSRelay passes DNS messages (UDP) to upstream, except UPDATEs
// that delete records, which it never answers; deleting is closed at the
// first. It returns its address.
func stallingDNSRelay(t *testing.T, upstream string) (addr string, deleting <-chan struct{}) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	del := make(chan struct{})
	var once sync.Once
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			msg := append([]byte(nil), buf[:n]...)
			var m dns.Msg
			if m.Unpack(msg) == nil && m.Opcode == dns.OpcodeUpdate && deletes(&m) {
				once.Do(func() { close(del) })
				continue
			}
			go func() {
				c, err := net.Dial("udp", upstream)
				if err != nil {
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(msg); err != nil {
					return
				}
				reply := make([]byte, 64<<10)
				n, err := c.Read(reply)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(reply[:n], from)
			}()
		}
	}()
	return pc.LocalAddr().String(), del
}

// deletes reports whether an UPDATE removes records (class NONE or ANY).
func deletes(m *dns.Msg) bool {
	for _, rr := range m.Ns {
		if c := rr.Header().Class; c == dns.ClassNONE || c == dns.ClassANY {
			return true
		}
	}
	return false
}
