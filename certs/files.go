package certs

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// fileSource serves PEM pairs from disk, chosen by SNI, and re-reads them
// every interval. Files are compared by content, not mtime, so atomic
// renames, symlink swaps (Kubernetes secrets) and same-second rewrites are
// all seen. A pair that fails to load (for example the certificate was
// replaced but the key not yet) keeps serving the previous version and is
// retried on the next tick.
type fileSource struct {
	log      *slog.Logger
	pairs    []FilePair
	loaded   []loadedPair // owned by the watcher goroutine after start
	index    atomic.Pointer[certIndex]
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}
	// betweenReads, when set (tests), runs between the reads of a
	// pair's certificate and key at a reload.
	betweenReads func()
}

type loadedPair struct {
	certPEM, keyPEM []byte
	cert            *tls.Certificate
	failed          [sha256.Size]byte // content hash of the last bad version, to log it once
	warned          bool              // its expiry was logged for this version
}

// certIndex is an immutable lookup table, swapped atomically on reload.
// Each name maps to every pair that covers it, in the order listed.
type certIndex struct {
	exact    map[string][]*tls.Certificate // "api.cube.app"
	wildcard map[string][]*tls.Certificate // "*.cube.app" stored under "cube.app"
	// defs is the default: the first pair, then every later one that
	// names all it names (its RSA or ECDSA twin, its renewal), among
	// which pick chooses as for a name they cover.
	defs     []*tls.Certificate
	earliest time.Time // the soonest NotAfter of the pairs
}

func newFileSource(pairs []FilePair, interval time.Duration, log *slog.Logger) (*fileSource, error) {
	if len(pairs) == 0 {
		return nil, errors.New("files source needs at least one cert/key pair")
	}
	if interval <= 0 {
		interval = DefaultReloadInterval
	}
	s := &fileSource{
		log:      log,
		pairs:    append([]FilePair(nil), pairs...),
		loaded:   make([]loadedPair, len(pairs)),
		interval: interval,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i, p := range s.pairs {
		certPEM, keyPEM, err := readPair(p, nil)
		if err != nil {
			return nil, err
		}
		cert, err := parsePair(p, certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		log.Info("tls certificate loaded", "cert_file", p.CertFile, "names", cert.Leaf.DNSNames, "not_after", cert.Leaf.NotAfter)
		s.loaded[i] = loadedPair{certPEM: certPEM, keyPEM: keyPEM, cert: cert, warned: warnValidity(log, p, cert.Leaf, time.Now())}
	}
	s.index.Store(s.buildIndex())
	go s.watch()
	return s, nil
}

func (s *fileSource) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	idx := s.index.Load()
	name := hello.ServerName
	if noSNI(name) {
		return pickDefault(hello, idx.defs), nil
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	exact := idx.exact[name]
	var wild []*tls.Certificate
	if i := strings.IndexByte(name, '.'); i > 0 {
		wild = idx.wildcard[name[i+1:]]
	}
	if c := pick(hello, exact, wild); c != nil {
		return c, nil
	}
	// Like crypto/tls with static certificates: an unknown name gets the
	// default rather than a failed handshake.
	return pickDefault(hello, idx.defs), nil
}

// pickDefault is pick among the default pairs for a hello whose server
// name none of them may name (an IP literal, a name no pair covers):
// SupportsCertificate refuses a certificate that does not name it, which
// would leave the client's key types and schemes unweighed.
func pickDefault(hello *tls.ClientHelloInfo, defs []*tls.Certificate) *tls.Certificate {
	if len(defs) == 1 || hello.ServerName == "" {
		return pick(hello, defs)
	}
	h := *hello
	h.ServerName = ""
	return pick(&h, defs)
}

func (s *fileSource) earliestExpiry() time.Time { return s.index.Load().earliest }

// covers reports whether a pair names host (lower case), exactly or by
// its wildcard; other names get the default pair.
func (s *fileSource) covers(host string) bool {
	idx := s.index.Load()
	if len(idx.exact[host]) > 0 {
		return true
	}
	i := strings.IndexByte(host, '.')
	return i > 0 && len(idx.wildcard[host[i+1:]]) > 0
}

// pick chooses among the pairs covering a name (exact ones first, each
// list in the order configured): the first the client can use (key type,
// signature schemes, as crypto/tls chooses among static certificates) and
// that is within its validity, else the first the client can use, else
// the first. The first listed wins otherwise. Without this, the first
// listed always won: an ECDSA pair listed before an RSA one for the same
// names failed every client without ECDSA, and an expired pair shadowed
// a valid one that covers the same name.
func pick(hello *tls.ClientHelloInfo, lists ...[]*tls.Certificate) *tls.Certificate {
	var first *tls.Certificate
	n := 0
	for _, l := range lists {
		if first == nil && len(l) > 0 {
			first = l[0]
		}
		n += len(l)
	}
	if n <= 1 {
		return first // no choice: nothing to weigh
	}
	now := time.Now()
	best, bestScore := first, -1
	for _, l := range lists {
		for _, c := range l {
			score := 0
			if hello.SupportsCertificate(c) == nil {
				score += 2
			}
			if !now.Before(c.Leaf.NotBefore) && !now.After(c.Leaf.NotAfter) {
				score++
			}
			if score > bestScore {
				best, bestScore = c, score
			}
		}
	}
	return best
}

func (s *fileSource) close() error {
	close(s.stop)
	<-s.done
	return nil
}

func (s *fileSource) watch() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if s.reload() {
				s.index.Store(s.buildIndex())
			}
			s.warnExpired(time.Now())
		}
	}
}

// reload re-reads every pair and reports whether any certificate changed.
func (s *fileSource) reload() bool {
	changed := false
	for i := range s.pairs {
		if s.reloadPair(i) {
			changed = true
		}
	}
	return changed
}

// reloadPair re-reads pair i and reports whether its certificate changed.
// A pair that fails to load is read again at once when its files changed
// under that reading: a Kubernetes secret volume swaps both files at once
// (a new "..data" symlink renamed over the old), and a reading of the
// certificate before the swap and the key after it, which is no pair on
// disk, was warned about as a failed reload and kept the old certificate
// one more interval, at random among rotations. A pair torn on disk (the
// key not written yet) reads the same twice and keeps the previous one.
func (s *fileSource) reloadPair(i int) bool {
	p, cur := s.pairs[i], &s.loaded[i]
	var certPEM, keyPEM []byte
	var cert *tls.Certificate
	var err error
	for try := range 2 {
		c, k, rerr := readPair(p, s.betweenReads)
		if rerr != nil {
			s.logFailure(cur, nil, nil, rerr)
			return false
		}
		if try > 0 && bytes.Equal(c, certPEM) && bytes.Equal(k, keyPEM) {
			break // unchanged since the failed reading
		}
		if bytes.Equal(c, cur.certPEM) && bytes.Equal(k, cur.keyPEM) {
			// Back to the pair in use: a failure after this is a new
			// one, to be logged even if it is the same as the last.
			cur.failed = [sha256.Size]byte{}
			return false
		}
		certPEM, keyPEM = c, k
		if cert, err = parsePair(p, certPEM, keyPEM); err == nil {
			break
		}
	}
	if err != nil {
		s.logFailure(cur, certPEM, keyPEM, err)
		return false
	}
	s.log.Info("tls certificate reloaded", "cert_file", p.CertFile, "names", cert.Leaf.DNSNames, "not_after", cert.Leaf.NotAfter)
	*cur = loadedPair{certPEM: certPEM, keyPEM: keyPEM, cert: cert, warned: warnValidity(s.log, p, cert.Leaf, time.Now())}
	return true
}

// warnValidity warns when a loaded certificate is expired or not yet
// valid at now, and reports whether it warned of its expiry (one not yet
// valid is still to be warned about when it expires: warnExpired). It is
// still served, like nginx does: refusing it would take HTTPS down for
// every client over a renewal that went wrong, and a client that skips
// verification still works.
func warnValidity(log *slog.Logger, p FilePair, leaf *x509.Certificate, now time.Time) bool {
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		log.Warn("tls certificate is outside its validity period; clients will refuse it",
			"cert_file", p.CertFile, "names", leaf.DNSNames, "not_before", leaf.NotBefore, "not_after", leaf.NotAfter)
	}
	return now.After(leaf.NotAfter)
}

// warnExpired warns, once per version, about a certificate that expired
// while it was served: an unchanged file is not reloaded, so without this a
// lapsed renewal went unlogged until the next restart.
func (s *fileSource) warnExpired(now time.Time) {
	for i := range s.loaded {
		lp := &s.loaded[i]
		if !lp.warned && now.After(lp.cert.Leaf.NotAfter) {
			lp.warned = warnValidity(s.log, s.pairs[i], lp.cert.Leaf, now)
		}
	}
}

// logFailure logs a bad version of a pair once, not on every tick.
func (s *fileSource) logFailure(cur *loadedPair, certPEM, keyPEM []byte, err error) {
	sum := sha256.Sum256(append(append([]byte(err.Error()), certPEM...), keyPEM...))
	if sum == cur.failed {
		return
	}
	cur.failed = sum
	s.log.Warn("tls certificate reload failed; keeping the previous one", "error", err)
}

func (s *fileSource) buildIndex() *certIndex {
	idx := &certIndex{
		exact:    make(map[string][]*tls.Certificate),
		wildcard: make(map[string][]*tls.Certificate),
		defs:     defaultPairs(s.loaded),
	}
	// In the order listed: pick prefers earlier pairs among equals.
	for _, lp := range s.loaded {
		if na := lp.cert.Leaf.NotAfter; idx.earliest.IsZero() || na.Before(idx.earliest) {
			idx.earliest = na
		}
		for _, n := range lp.cert.Leaf.DNSNames {
			n = strings.ToLower(n)
			m, key := idx.exact, n
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				m, key = idx.wildcard, rest
			}
			if !slices.Contains(m[key], lp.cert) { // a name listed twice in one certificate
				m[key] = append(m[key], lp.cert)
			}
		}
	}
	return idx
}

// defaultPairs returns the first pair's certificate, then those of the
// later pairs that name every DNS name and IP address it names: the
// first one alone was the default, so a client without SNI (dialing the
// node's IP) or naming no pair got it even where it could not use it (an
// ECDSA pair listed before its RSA twin, for a client without ECDSA) or
// it had expired (listed before its renewal), as a client naming the
// same names did not. A first pair that names nothing is the default
// alone.
func defaultPairs(loaded []loadedPair) []*tls.Certificate {
	first := loaded[0].cert.Leaf
	defs := []*tls.Certificate{loaded[0].cert}
	if len(first.DNSNames) == 0 && len(first.IPAddresses) == 0 {
		return defs
	}
	for _, lp := range loaded[1:] {
		if namesAll(lp.cert.Leaf, first) && !slices.Contains(defs, lp.cert) {
			defs = append(defs, lp.cert)
		}
	}
	return defs
}

// namesAll reports whether c names every DNS name (in any case) and IP
// address that of names.
func namesAll(c, of *x509.Certificate) bool {
	for _, n := range of.DNSNames {
		if !slices.ContainsFunc(c.DNSNames, func(m string) bool { return strings.EqualFold(m, n) }) {
			return false
		}
	}
	for _, ip := range of.IPAddresses {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// readPair reads a pair's certificate, then its key; between, when not
// nil, runs between the two reads.
func readPair(p FilePair, between func()) (certPEM, keyPEM []byte, err error) {
	certPEM, err = namedfile.Read(p.CertFile, namedfile.MaxSmall)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p.certKey(), err)
	}
	if between != nil {
		between()
	}
	keyPEM, err = namedfile.Read(p.KeyFile, namedfile.MaxSmall)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p.keyKey(), err)
	}
	return certPEM, keyPEM, nil
}

func parsePair(p FilePair, certPEM, keyPEM []byte) (*tls.Certificate, error) {
	if incompletePEM(certPEM) {
		if err := misplacedPEM(p, certPEM, keyPEM); err != nil {
			return nil, err
		}
		// X509KeyPair stops at the first block it cannot decode: a chain
		// cut mid-write would load as its leaf alone, which clients that
		// need the intermediate cannot verify.
		return nil, fmt.Errorf("%s: load %s: it ends inside a PEM block (truncated, or still being written)", p.certKey(), p.CertFile)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if err := misplacedPEM(p, certPEM, keyPEM); err != nil {
			return nil, err
		}
		if i, n := keyCertificate(certPEM, keyPEM); i > 0 {
			// X509KeyPair takes the first certificate for the server's and
			// calls the key a mismatch, which sends the operator after the
			// key file; nginx refuses this order too.
			return nil, fmt.Errorf("%s: load %s: the key in %s belongs to certificate %d of %d in %s, not the first: list the server's certificate first, then its intermediates",
				p.pairKeys(), p.CertFile, p.KeyFile, i+1, n, p.CertFile)
		}
		if encryptedKey(keyPEM) {
			// crypto/tls only says "failed to parse private key".
			return nil, fmt.Errorf("%s: load %s + %s: the key is encrypted (passphrase-protected), which the proxy cannot read: write it unencrypted (openssl pkey -in %s -out NEW) and keep that file readable by the proxy alone",
				p.keyKey(), p.CertFile, p.KeyFile, p.KeyFile)
		}
		return nil, fmt.Errorf("%s: load %s + %s: %w", p.pairKeys(), p.CertFile, p.KeyFile, err)
	}
	if cert.Leaf == nil { // GODEBUG=x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s: parse %s: %w", p.certKey(), p.CertFile, err)
		}
	}
	return &cert, nil
}

// keyCertificate returns the index of the certificate in certPEM that
// keyPEM belongs to, and how many certificates certPEM holds; -1 when the
// key matches none.
func keyCertificate(certPEM, keyPEM []byte) (index, count int) {
	index = -1
	for rest := certPEM; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return index, count
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if index < 0 {
			if _, err := tls.X509KeyPair(pem.EncodeToMemory(block), keyPEM); err == nil {
				index = count
			}
		}
		count++
	}
}

// encryptedKey reports whether keyPEM's first private key is encrypted:
// PKCS#8 ("ENCRYPTED PRIVATE KEY") or the legacy OpenSSL form (a
// Proc-Type header), what openssl writes when given a passphrase.
func encryptedKey(keyPEM []byte) bool {
	for {
		var block *pem.Block
		if block, keyPEM = pem.Decode(keyPEM); block == nil {
			return false
		}
		if strings.HasSuffix(block.Type, "PRIVATE KEY") {
			return block.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(block.Headers["Proc-Type"], "ENCRYPTED")
		}
	}
}

// misplacedPEM names a misplaced PEM line (misplacedPEMLine) of a pair
// that failed to load, or returns nil. Asked only then: the block of such a
// line is skipped, and what is left reads as cut or mismatched, which sent
// the operator after the wrong cause; a pair that loads without the block
// (a BOM before the EC PARAMETERS block openssl writes ahead of a key)
// still loads.
func misplacedPEM(p FilePair, certPEM, keyPEM []byte) error {
	if line, why := misplacedPEMLine(certPEM); line > 0 {
		return fmt.Errorf("%s: load %s: line %d: %s", p.certKey(), p.CertFile, line, why)
	}
	if line, why := misplacedPEMLine(keyPEM); line > 0 {
		return fmt.Errorf("%s: load %s + %s: line %d of %s: %s", p.keyKey(), p.CertFile, p.KeyFile, line, p.KeyFile, why)
	}
	return nil
}

// misplacedPEMLine finds the first PEM BEGIN or END line that does not
// stand alone at the start of its line, which no PEM reader takes (Go's
// skips the block, nginx refuses the file with "no start line" or "bad
// end line"): after a byte-order mark (a file saved as UTF-8 with BOM),
// indented (pasted from YAML or a document), or two on one line (files
// concatenated when the first lacked its last newline). It returns the
// line's number (from 1) and what is wrong with it, or 0.
func misplacedPEMLine(b []byte) (int, string) {
	n := 0
	for line := range bytes.Lines(b) {
		n++
		i := pemMarker(line)
		if i < 0 {
			continue
		}
		switch {
		case i == 0 && pemMarker(line[1:]) < 0:
			continue // where it belongs
		case bytes.HasPrefix(line, []byte("\uFEFF")):
			return n, "the file starts with a byte-order mark (saved as UTF-8 with BOM); save it without one"
		case i > 0 && len(bytes.TrimLeft(line[:i], " \t")) == 0:
			return n, "a PEM BEGIN or END line is indented; it must start at the beginning of its line"
		default:
			return n, "a PEM BEGIN or END line shares its line with other text (files concatenated without a newline between them?); put it on a line of its own"
		}
	}
	return 0, ""
}

// pemMarker is the index in line of the first "-----BEGIN" or "-----END",
// or -1.
func pemMarker(line []byte) int {
	i := bytes.Index(line, []byte("-----BEGIN"))
	if j := bytes.Index(line, []byte("-----END")); j >= 0 && (i < 0 || j < i) {
		i = j
	}
	return i
}

// incompletePEM reports whether b ends inside a PEM block: one that begins
// and never ends, or the start of a "-----BEGIN" line.
func incompletePEM(b []byte) bool {
	begin := []byte("-----BEGIN")
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			rest := bytes.TrimSpace(b)
			return bytes.Contains(rest, begin) || len(rest) > 0 && bytes.HasPrefix(begin, rest)
		}
	}
}

// noSNI reports whether a ClientHello's server name cannot select a
// certificate: absent, or an IP literal (RFC 6066 forbids IPs in SNI, but
// some clients that dial the node IP send one).
func noSNI(name string) bool {
	if name == "" {
		return true
	}
	_, err := netip.ParseAddr(strings.Trim(name, "[]"))
	return err == nil
}
