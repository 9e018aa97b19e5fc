package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// DNSServer is an authoritative DNS server for one zone on loopback. It answers
// over UDP and TCP on the same port (certmagic asks over UDP, pebble's
// validator over TCP), serves SOA/NS at the apex, TXT records written through
// RFC 2136 UPDATE, and A 127.0.0.1 for every name in the zone. Updates must be
// signed with the server's TSIG key.
type DNSServer struct {
	// Addr is host:port for both UDP and TCP.
	Addr string
	// Zone is the served zone, lower-case and fully qualified ("cube.test.").
	Zone string
	// KeyName is the TSIG key name (fully qualified).
	KeyName string
	// KeyAlg is the TSIG algorithm, as the rfc2136 provider spells it.
	KeyAlg string
	// KeySecret is the base64 TSIG secret.
	KeySecret string

	mu      sync.Mutex
	records []dns.RR // records added through UPDATE
	updates int      // UPDATE messages applied
}

// StartDNS starts a DNS server authoritative for zone and stops it when the
// test ends.
func StartDNS(t testing.TB, zone string) *DNSServer {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatalf("dns: tsig secret: %v", err)
	}
	s := &DNSServer{
		Zone:      dns.CanonicalName(zone),
		KeyName:   "cubeproxy-test.",
		KeyAlg:    "hmac-sha256",
		KeySecret: base64.StdEncoding.EncodeToString(secret),
	}

	pc, ln := listenSamePort(t)
	s.Addr = pc.LocalAddr().String()
	tsig := map[string]string{s.KeyName: s.KeySecret}
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: s, TsigSecret: tsig, MsgAcceptFunc: acceptQueriesAndUpdates},
		{Listener: ln, Handler: s, TsigSecret: tsig, MsgAcceptFunc: acceptQueriesAndUpdates},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				t.Logf("dns server stopped: %v", err)
			}
		}()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return s
}

// listenSamePort opens UDP and TCP listeners on one loopback port.
func listenSamePort(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var lastErr error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("dns: listen udp: %v", err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		lastErr = err
		_ = pc.Close()
	}
	t.Fatalf("dns: no port free for both udp and tcp: %v", lastErr)
	return nil, nil
}

// acceptQueriesAndUpdates lets UPDATE messages through; miekg/dns's default
// accept function answers them with NOTIMP.
func acceptQueriesAndUpdates(h dns.Header) dns.MsgAcceptAction {
	const qrBit = 1 << 15
	if h.Bits&qrBit != 0 {
		return dns.MsgIgnore
	}
	opcode := int(h.Bits>>11) & 0xF
	if opcode != dns.OpcodeQuery && opcode != dns.OpcodeUpdate {
		return dns.MsgRejectNotImplemented
	}
	if h.Qdcount != 1 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// TXT returns the TXT values currently published for name (absolute or not).
func (s *DNSServer) TXT(name string) []string {
	name = dns.CanonicalName(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, rr := range s.records {
		if txt, ok := rr.(*dns.TXT); ok && txt.Hdr.Name == name {
			out = append(out, strings.Join(txt.Txt, ""))
		}
	}
	return out
}

// Updates returns how many UPDATE messages were applied.
func (s *DNSServer) Updates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates
}

// ServeDNS implements dns.Handler.
func (s *DNSServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	var m *dns.Msg
	switch r.Opcode {
	case dns.OpcodeQuery:
		m = s.query(r)
	case dns.OpcodeUpdate:
		m = s.update(w, r)
	default:
		m = new(dns.Msg)
		m.SetRcode(r, dns.RcodeNotImplemented)
	}
	_ = w.WriteMsg(m)
}

func (s *DNSServer) soa() dns.RR {
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: s.Zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
		Ns:      "ns1." + s.Zone,
		Mbox:    "hostmaster." + s.Zone,
		Serial:  1,
		Refresh: 60, Retry: 60, Expire: 600, Minttl: 1,
	}
}

func (s *DNSServer) query(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	q := r.Question[0]
	name := dns.CanonicalName(q.Name)
	if !dns.IsSubDomain(s.Zone, name) {
		m.SetRcode(r, dns.RcodeRefused)
		return m
	}
	m.SetReply(r)
	m.Authoritative = true
	apex := name == s.Zone
	switch {
	case q.Qtype == dns.TypeSOA && apex:
		m.Answer = append(m.Answer, s.soa())
	case q.Qtype == dns.TypeNS && apex:
		m.Answer = append(m.Answer, &dns.NS{
			Hdr: dns.RR_Header{Name: s.Zone, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: 60},
			Ns:  "ns1." + s.Zone,
		})
	case q.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   net.IPv4(127, 0, 0, 1),
		})
	default:
		s.mu.Lock()
		for _, rr := range s.records {
			h := rr.Header()
			if h.Name == name && (q.Qtype == dns.TypeANY || h.Rrtype == q.Qtype) {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
		}
		s.mu.Unlock()
	}
	if len(m.Answer) == 0 {
		m.Ns = append(m.Ns, s.soa())
	}
	return m
}

// update applies an RFC 2136 UPDATE: class IN adds, NONE deletes one RR by
// value, ANY deletes an RRset or a whole name. Prerequisites are ignored.
func (s *DNSServer) update(w dns.ResponseWriter, r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	sig := r.IsTsig()
	if sig == nil {
		m.SetRcode(r, dns.RcodeRefused)
		return m
	}
	if w.TsigStatus() != nil {
		m.SetRcode(r, dns.RcodeNotAuth)
		return m
	}
	m.SetReply(r)
	m.SetTsig(sig.Hdr.Name, sig.Algorithm, 300, time.Now().Unix())
	if dns.CanonicalName(r.Question[0].Name) != s.Zone {
		m.Rcode = dns.RcodeNotAuth
		return m
	}
	// Check everything first so a bad message changes nothing.
	for _, rr := range r.Ns {
		h := rr.Header()
		if !dns.IsSubDomain(s.Zone, dns.CanonicalName(h.Name)) {
			m.Rcode = dns.RcodeNotZone
			return m
		}
		if h.Class != dns.ClassINET && h.Class != dns.ClassNONE && h.Class != dns.ClassANY {
			m.Rcode = dns.RcodeFormatError
			return m
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rr := range r.Ns {
		h := rr.Header()
		h.Name = dns.CanonicalName(h.Name)
		switch h.Class {
		case dns.ClassINET:
			if !s.hasLocked(rr) {
				s.records = append(s.records, dns.Copy(rr))
			}
		case dns.ClassNONE:
			h.Class = dns.ClassINET
			s.removeLocked(func(x dns.RR) bool { return dns.IsDuplicate(x, rr) })
		case dns.ClassANY:
			s.removeLocked(func(x dns.RR) bool {
				return x.Header().Name == h.Name && (h.Rrtype == dns.TypeANY || x.Header().Rrtype == h.Rrtype)
			})
		}
	}
	s.updates++
	return m
}

func (s *DNSServer) hasLocked(rr dns.RR) bool {
	for _, x := range s.records {
		if dns.IsDuplicate(x, rr) {
			return true
		}
	}
	return false
}

func (s *DNSServer) removeLocked(match func(dns.RR) bool) {
	kept := s.records[:0]
	for _, x := range s.records {
		if !match(x) {
			kept = append(kept, x)
		}
	}
	s.records = kept
}

// String describes the server for test logs.
func (s *DNSServer) String() string {
	return fmt.Sprintf("dns %s zone %s", s.Addr, s.Zone)
}
