package rfc2136_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libdns/libdns"
	"github.com/miekg/dns"

	"github.com/cube-sandbox/cubeproxy/certs/rfc2136"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

func provider(srv *testenv.DNSServer, network string) *rfc2136.Provider {
	return &rfc2136.Provider{
		Server:    srv.Addr,
		KeyName:   srv.KeyName,
		KeyAlg:    srv.KeyAlg,
		KeySecret: srv.KeySecret,
		Net:       network,
		Timeout:   5 * time.Second,
	}
}

// queryTXT asks the server like a resolver would, proving the records are
// published, not only stored.
func queryTXT(t *testing.T, addr, name string) []string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeTXT)
	resp, err := dns.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	var out []string
	for _, rr := range resp.Answer {
		if txt, ok := rr.(*dns.TXT); ok {
			out = append(out, strings.Join(txt.Txt, ""))
		}
	}
	slices.Sort(out)
	return out
}

func TestAppendAndDeleteByValue(t *testing.T) {
	srv := testenv.StartDNS(t, "cube.test")
	long := strings.Repeat("x", 300) // needs two TXT character-strings
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			ctx := context.Background()
			p := provider(srv, network)
			name := "_acme-challenge." + network
			fqdn := name + ".cube.test."

			got, err := p.AppendRecords(ctx, "cube.test.", []libdns.Record{
				libdns.TXT{Name: name, Text: "value-a", TTL: time.Minute},
				libdns.RR{Name: name, Type: "TXT", Data: long},
			})
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			if len(got) != 2 {
				t.Fatalf("append returned %d records, want one per input", len(got))
			}
			for i, want := range []string{"value-a", long} {
				txt, ok := got[i].(libdns.TXT)
				if !ok || txt.Name != name || txt.Text != want {
					t.Errorf("record %d = %#v, want libdns.TXT %s %q", i, got[i], name, want)
				}
			}
			if vals := queryTXT(t, srv.Addr, fqdn); !slices.Equal(vals, []string{"value-a", long}) {
				t.Fatalf("published TXT = %q", vals)
			}

			// Delete by value: the other value of the same name survives
			// (apex and wildcard challenges share one name).
			if _, err := p.DeleteRecords(ctx, "cube.test", []libdns.Record{got[0]}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if vals := queryTXT(t, srv.Addr, fqdn); !slices.Equal(vals, []string{long}) {
				t.Fatalf("after delete TXT = %q, want only the long value", vals)
			}

			// Empty data deletes the whole RRset.
			if _, err := p.DeleteRecords(ctx, "cube.test.", []libdns.Record{libdns.RR{Name: name, Type: "TXT"}}); err != nil {
				t.Fatalf("delete rrset: %v", err)
			}
			if vals := srv.TXT(fqdn); len(vals) != 0 {
				t.Fatalf("after rrset delete TXT = %q", vals)
			}
		})
	}
}

func TestRejectedUpdates(t *testing.T) {
	srv := testenv.StartDNS(t, "cube.test")
	wrong := base64.StdEncoding.EncodeToString([]byte("not the secret of this server!!"))
	tests := []struct {
		name      string
		edit      func(p *rfc2136.Provider)
		zone      string
		wantRcode int
	}{
		{"wrong tsig secret", func(p *rfc2136.Provider) { p.KeySecret = wrong }, "cube.test.", dns.RcodeNotAuth},
		{"unknown key name", func(p *rfc2136.Provider) { p.KeyName = "other-key." }, "cube.test.", dns.RcodeNotAuth},
		{"unsigned", func(p *rfc2136.Provider) { p.KeyName = "" }, "cube.test.", dns.RcodeRefused},
		{"foreign zone", func(*rfc2136.Provider) {}, "other.test.", dns.RcodeNotAuth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := provider(srv, "udp")
			tt.edit(p)
			before := srv.Updates()
			_, err := p.AppendRecords(context.Background(), tt.zone, []libdns.Record{
				libdns.TXT{Name: "_acme-challenge", Text: "nope"},
			})
			var se *rfc2136.ServerError
			if !errors.As(err, &se) || se.Rcode != tt.wantRcode {
				t.Fatalf("err = %v, want ServerError %s", err, dns.RcodeToString[tt.wantRcode])
			}
			if srv.Updates() != before || len(srv.TXT("_acme-challenge.cube.test.")) != 0 {
				t.Fatal("a rejected update changed the zone")
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := rfc2136.Provider{Server: "127.0.0.1:53", KeyName: "k.", KeySecret: "c2VjcmV0"}
	tests := []struct {
		name    string
		edit    func(p *rfc2136.Provider)
		wantErr string
	}{
		{"valid", func(*rfc2136.Provider) {}, ""},
		{"valid unsigned", func(p *rfc2136.Provider) { p.KeyName, p.KeySecret = "", "" }, ""},
		{"no server", func(p *rfc2136.Provider) { p.Server = "" }, "server address is required"},
		{"server without port", func(p *rfc2136.Provider) { p.Server = "127.0.0.1" }, "missing port"},
		{"bad net", func(p *rfc2136.Provider) { p.Net = "quic" }, "net must be"},
		{"bad alg", func(p *rfc2136.Provider) { p.KeyAlg = "hmac-md5" }, "unsupported TSIG algorithm"},
		{"secret not base64", func(p *rfc2136.Provider) { p.KeySecret = "%%%" }, "base64"},
		{"secret missing", func(p *rfc2136.Provider) { p.KeySecret = "" }, "base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.edit(&p)
			err := p.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestRetryAfterLostUpdateIsSigned loses the first UPDATE datagram, as a
// congested link to the primary would: the retry must be signed like the
// first attempt, or the server refuses it and DNS-01 fails on a packet loss
// the retry exists to absorb.
func TestRetryAfterLostUpdateIsSigned(t *testing.T) {
	srv := testenv.StartDNS(t, "cube.test")
	relay := lossyRelay(t, srv.Addr)
	p := provider(srv, "udp")
	p.Server = relay
	p.Timeout = 300 * time.Millisecond

	_, err := p.AppendRecords(context.Background(), "cube.test.", []libdns.Record{
		libdns.TXT{Name: "_acme-challenge", Text: "after-a-loss"},
	})
	if err != nil {
		t.Fatalf("append after one lost datagram: %v", err)
	}
	if vals := queryTXT(t, srv.Addr, "_acme-challenge.cube.test."); !slices.Equal(vals, []string{"after-a-loss"}) {
		t.Fatalf("published TXT = %q", vals)
	}
}

// lossyRelay forwards UDP datagrams to upstream and back, dropping the
// first one it receives.
func lossyRelay(t *testing.T, upstream string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for first := true; ; first = false {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if first {
				continue
			}
			up, err := net.Dial("udp", upstream)
			if err != nil {
				return
			}
			_ = up.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := up.Write(buf[:n]); err == nil {
				resp := make([]byte, 64<<10)
				if m, err := up.Read(resp); err == nil {
					_, _ = pc.WriteTo(resp[:m], from)
				}
			}
			_ = up.Close()
		}
	}()
	return pc.LocalAddr().String()
}

// TestCancelEndsUpdate cancels an UPDATE the server never answers: it must
// end with the context, as libdns and acmez ask of a provider. miekg/dns
// reads a context's deadline only, not its cancellation, so a cancelled
// update (an on-demand handshake given up, the proxy closing) held its
// order, and the storage lock the order holds, for the whole timeout.
func TestCancelEndsUpdate(t *testing.T) {
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = udp.Close() })
	servers := map[string]string{
		"udp": udp.LocalAddr().String(), // reads nothing, answers nothing
		"tcp": testenv.StartSilentServer(t).Addr,
	}
	for network, addr := range servers {
		t.Run(network, func(t *testing.T) {
			p := &rfc2136.Provider{Server: addr, Net: network, Timeout: 20 * time.Second}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			_, err := p.AppendRecords(ctx, "cube.test.", []libdns.Record{libdns.TXT{Name: "_acme-challenge", Text: "x"}})
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("cancelled update returned after %v: %v", took, err)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled update: %v, want context.Canceled", err)
			}
		})
	}
}
