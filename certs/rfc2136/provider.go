// Package rfc2136 is a libdns provider that edits a zone on an authoritative
// DNS server with standard DNS UPDATE messages (RFC 2136), signed with TSIG
// (RFC 8945). It works with BIND, Knot, PowerDNS and any other server that
// accepts dynamic updates.
package rfc2136

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/libdns/libdns"
	"github.com/miekg/dns"
)

// DefaultKeyAlg is the TSIG algorithm used when Provider.KeyAlg is empty.
const DefaultKeyAlg = "hmac-sha256"

// defaultTimeout bounds one UPDATE exchange when Provider.Timeout is zero.
const defaultTimeout = 10 * time.Second

// attempts is how often a network failure is retried. Retrying is safe because
// adding an RR that exists and deleting one that does not are both no-ops.
const attempts = 3

// Provider sends DNS UPDATE messages to one authoritative server.
// The zero value is not usable: Server is required. Provider is stateless and
// safe for concurrent use.
type Provider struct {
	// Server is the primary server's address, host:port.
	Server string
	// KeyName is the TSIG key name; empty sends unsigned updates (only for
	// servers that authorise updates by source address).
	KeyName string
	// KeyAlg is the TSIG algorithm: hmac-sha256 (default), hmac-sha1,
	// hmac-sha224, hmac-sha384 or hmac-sha512.
	KeyAlg string
	// KeySecret is the base64 TSIG secret.
	KeySecret string
	// Net is "udp" (default) or "tcp".
	Net string
	// Timeout bounds one exchange; zero means 10 s.
	Timeout time.Duration
}

// ServerError reports an UPDATE the server answered with a non-success rcode
// (for example NOTAUTH for a bad TSIG signature, REFUSED for a missing grant).
type ServerError struct {
	Zone  string // zone the UPDATE was for
	Rcode int    // DNS rcode of the answer (dns.RcodeNotAuth, ...)
}

// Error names the zone and the rcode.
func (e *ServerError) Error() string {
	return fmt.Sprintf("rfc2136 update of zone %s refused: %s", e.Zone, dns.RcodeToString[e.Rcode])
}

// AppendRecords adds recs to zone in one UPDATE message and returns one
// record per input, in order, as libdns typed records.
func (p *Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	zone = dns.Fqdn(zone)
	rrs := make([]dns.RR, 0, len(recs))
	out := make([]libdns.Record, 0, len(recs))
	for _, rec := range recs {
		rr, err := toDNS(rec.RR(), zone)
		if err != nil {
			return nil, err
		}
		parsed, err := rec.RR().Parse()
		if err != nil {
			return nil, fmt.Errorf("rfc2136 parse record %s: %w", rec.RR().Name, err)
		}
		rrs = append(rrs, rr)
		out = append(out, parsed)
	}
	m := new(dns.Msg)
	m.SetUpdate(zone)
	m.Insert(rrs)
	if err := p.exchange(ctx, zone, m); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteRecords removes recs from zone by value (name, type and data; the TTL
// is ignored, as DNS UPDATE does). An empty Data deletes the whole RRset of
// that type; an empty Type as well deletes every RRset of the name. DNS
// UPDATE does not report which records existed, so the input records are
// returned.
func (p *Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	zone = dns.Fqdn(zone)
	m := new(dns.Msg)
	m.SetUpdate(zone)
	out := make([]libdns.Record, 0, len(recs))
	for _, rec := range recs {
		r := rec.RR()
		if r.Name == "" {
			return nil, errors.New("rfc2136 delete: record name is required")
		}
		name := libdns.AbsoluteName(r.Name, zone)
		switch {
		case r.Type == "":
			m.RemoveName([]dns.RR{&dns.ANY{Hdr: dns.RR_Header{Name: name}}})
		case r.Data == "":
			t, ok := dns.StringToType[strings.ToUpper(r.Type)]
			if !ok {
				return nil, fmt.Errorf("rfc2136 delete %s: unknown record type %q", name, r.Type)
			}
			m.RemoveRRset([]dns.RR{&dns.ANY{Hdr: dns.RR_Header{Name: name, Rrtype: t}}})
		default:
			rr, err := toDNS(r, zone)
			if err != nil {
				return nil, err
			}
			m.Remove([]dns.RR{rr})
		}
		parsed, err := r.Parse()
		if err != nil {
			parsed = r
		}
		out = append(out, parsed)
	}
	if err := p.exchange(ctx, zone, m); err != nil {
		return nil, err
	}
	return out, nil
}

// Validate reports configuration errors before the first update.
func (p *Provider) Validate() error {
	if p.Server == "" {
		return errors.New("rfc2136: server address is required")
	}
	if _, _, err := net.SplitHostPort(p.Server); err != nil {
		return fmt.Errorf("rfc2136: server %q: %w", p.Server, err)
	}
	if p.Timeout < 0 {
		// miekg/dns would set every deadline in the past: each update
		// fails with a timeout, at the first issuance, not at start.
		return fmt.Errorf("rfc2136: timeout must not be negative, got %s", p.Timeout)
	}
	switch p.Net {
	case "", "udp", "tcp":
	default:
		return fmt.Errorf("rfc2136: net must be udp or tcp, got %q", p.Net)
	}
	if p.KeyName == "" {
		return nil
	}
	if _, err := tsigAlgorithm(p.KeyAlg); err != nil {
		return err
	}
	if _, err := base64.StdEncoding.DecodeString(p.KeySecret); err != nil || p.KeySecret == "" {
		return fmt.Errorf("rfc2136: key secret for %s must be non-empty base64", p.KeyName)
	}
	return nil
}

// exchange signs m, sends it and checks the answer, retrying network errors.
func (p *Provider) exchange(ctx context.Context, zone string, m *dns.Msg) error {
	if p.Server == "" {
		return errors.New("rfc2136: server address is not configured")
	}
	c := &dns.Client{Net: p.Net, Timeout: p.Timeout}
	if c.Net == "" {
		c.Net = "udp"
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	var key, alg string
	if p.KeyName != "" {
		var err error
		if alg, err = tsigAlgorithm(p.KeyAlg); err != nil {
			return err
		}
		key = dns.CanonicalName(p.KeyName)
		c.TsigSecret = map[string]string{key: p.KeySecret}
	}

	var lastErr error
	for range attempts {
		// Signed afresh each attempt: miekg/dns strips the TSIG record
		// from the message it sends, so a retry of m itself would go out
		// unsigned and be refused.
		msg := m
		if key != "" {
			msg = m.Copy()
			msg.SetTsig(key, alg, 300, time.Now().Unix())
		}
		resp, err := exchangeOnce(ctx, c, msg, p.Server)
		// miekg/dns reports a signed NOTAUTH answer as a TSIG error; the
		// rcode is the better explanation, so it wins.
		if resp != nil && resp.Rcode != dns.RcodeSuccess {
			return &ServerError{Zone: zone, Rcode: resp.Rcode}
		}
		if err == nil {
			return nil
		}
		lastErr = err
		var netErr net.Error
		if ctx.Err() != nil || !errors.As(err, &netErr) {
			break
		}
	}
	return fmt.Errorf("rfc2136 update of zone %s via %s: %w", zone, p.Server, lastErr)
}

// exchangeOnce sends m and reads the answer, ending when ctx is
// cancelled: miekg/dns's ExchangeContext reads only the context's
// deadline, so a cancelled update (a handshake given up, the proxy
// closing) waited for a server that never answered up to Timeout, holding
// its order and the certificate's storage lock.
func exchangeOnce(ctx context.Context, c *dns.Client, m *dns.Msg, server string) (*dns.Msg, error) {
	conn, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil && ctx.Err() != nil {
		// "use of closed network connection" says less than the cause.
		err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return resp, err
}

// toDNS converts a libdns record into a miekg/dns RR with an absolute name.
func toDNS(r libdns.RR, zone string) (dns.RR, error) {
	if r.Name == "" {
		return nil, errors.New("rfc2136: record name is required")
	}
	name := libdns.AbsoluteName(r.Name, zone)
	ttl := uint32(r.TTL / time.Second)
	if strings.EqualFold(r.Type, "TXT") {
		// Built directly: libdns TXT data is unescaped text of any length,
		// while the wire format wants strings of at most 255 bytes.
		return &dns.TXT{
			Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: ttl},
			Txt: splitTXT(r.Data),
		}, nil
	}
	rr, err := dns.NewRR(fmt.Sprintf("%s %d IN %s %s", name, ttl, strings.ToUpper(r.Type), r.Data))
	if err != nil {
		return nil, fmt.Errorf("rfc2136: record %s %s %q: %w", name, r.Type, r.Data, err)
	}
	if rr == nil {
		return nil, fmt.Errorf("rfc2136: record %s %s has no data", name, r.Type)
	}
	return rr, nil
}

// splitTXT cuts s into the 255-byte character-strings a TXT RR is made of,
// escaping backslashes because miekg/dns reads \DDD and \X escapes in them.
func splitTXT(s string) []string {
	var parts []string
	for len(s) > 255 {
		parts = append(parts, strings.ReplaceAll(s[:255], `\`, `\\`))
		s = s[255:]
	}
	return append(parts, strings.ReplaceAll(s, `\`, `\\`))
}

// tsigAlgorithm maps a configured algorithm name to its miekg/dns constant.
func tsigAlgorithm(name string) (string, error) {
	if name == "" {
		name = DefaultKeyAlg
	}
	switch alg := dns.Fqdn(strings.ToLower(name)); alg {
	case dns.HmacSHA1, dns.HmacSHA224, dns.HmacSHA256, dns.HmacSHA384, dns.HmacSHA512:
		return alg, nil
	}
	return "", fmt.Errorf("rfc2136: unsupported TSIG algorithm %q", name)
}

var (
	_ libdns.RecordAppender = (*Provider)(nil)
	_ libdns.RecordDeleter  = (*Provider)(nil)
)
