package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"
)

// MinKeyLen is the minimum length in bytes of a signing key. Keys are used
// as the raw bytes of the configured string (e.g. `openssl rand -hex 32`).
const MinKeyLen = 32

// MaxSandboxIDLen is the longest sandbox id a signed token can carry.
const MaxSandboxIDLen = 255

// Signed token layout, before base64url (no padding) encoding:
//
//	version (1) | expiry unix seconds, int64 big-endian (8) | port, big-endian (2) | sandbox id | HMAC-SHA256 (32)
//
// The MAC covers every byte before it, version included.
const (
	tokenVersion = 1
	headerLen    = 1 + 8 + 2
	macLen       = sha256.Size
	minRawLen    = headerLen + 1 + macLen
	maxRawLen    = headerLen + MaxSandboxIDLen + macLen
	// maxTokenLen is the unpadded base64 length of maxRawLen bytes; it
	// bounds the work done on hostile input.
	maxTokenLen = (maxRawLen*8 + 5) / 6
)

// Signer issues and checks signed browser tokens bound to one sandbox, one
// port and an expiry. The first key signs; every key verifies, so a key is
// rotated by putting the new key first, waiting out the longest token TTL,
// then removing the old one. Safe for concurrent use.
type Signer struct {
	keys [][]byte
	enc  *base64.Encoding
	// pool holds per-key HMAC states plus scratch space, so verifying (done
	// on every cookie-authorized request) allocates nothing.
	pool sync.Pool
}

type macScratch struct {
	hashes []hash.Hash
	sum    [macLen]byte
	raw    [maxRawLen]byte
	chunk  [64]byte // a string on its way into a hash (Write takes bytes)
}

// NewSigner returns a Signer for the given keys, first one signing. It
// refuses an empty list and any key shorter than MinKeyLen bytes; errors
// name the key by position, never by value.
func NewSigner(keys []string) (*Signer, error) {
	if len(keys) == 0 {
		return nil, errors.New("signed tokens: no signing key configured")
	}
	s := &Signer{enc: base64.RawURLEncoding.Strict()}
	for i, k := range keys {
		if len(k) < MinKeyLen {
			return nil, fmt.Errorf("signed tokens: key %d is %d bytes, need at least %d", i+1, len(k), MinKeyLen)
		}
		s.keys = append(s.keys, []byte(k))
	}
	s.pool.New = func() any {
		m := &macScratch{hashes: make([]hash.Hash, len(s.keys))}
		for i, k := range s.keys {
			m.hashes[i] = hmac.New(sha256.New, k)
		}
		return m
	}
	return s, nil
}

// Sign issues a token for sandboxID and port that is valid until expiry
// (truncated to whole seconds). The token is URL-safe and is also the value
// of the browser cookie. It fails only for an empty or over-long id or port 0.
func (s *Signer) Sign(sandboxID string, port uint16, expiry time.Time) (string, error) {
	if sandboxID == "" || len(sandboxID) > MaxSandboxIDLen {
		return "", fmt.Errorf("signed tokens: sandbox id must be 1..%d bytes, got %d", MaxSandboxIDLen, len(sandboxID))
	}
	if port == 0 {
		return "", errors.New("signed tokens: port must be 1..65535")
	}
	raw := make([]byte, headerLen, headerLen+len(sandboxID)+macLen)
	raw[0] = tokenVersion
	binary.BigEndian.PutUint64(raw[1:9], uint64(expiry.Unix()))
	binary.BigEndian.PutUint16(raw[9:11], port)
	raw = append(raw, sandboxID...)

	m := s.pool.Get().(*macScratch)
	defer s.pool.Put(m)
	h := m.hashes[0]
	h.Reset()
	h.Write(raw)
	raw = h.Sum(raw)
	return s.enc.EncodeToString(raw), nil
}

// Verify checks a token (from the query parameter or the cookie) for the
// sandbox and port being requested at time now and returns its expiry. Every
// failure is a *Rejection: malformed, invalid (no key's MAC matches),
// wrong_target (authentic but for another sandbox or port) or expired.
func (s *Signer) Verify(token string, sandboxID string, port uint16, now time.Time) (time.Time, error) {
	return s.VerifyBytes([]byte(token), sandboxID, port, now)
}

// VerifyBytes is Verify for a token held in a byte slice (as fasthttp returns
// cookie and query values); it allocates nothing when the token is valid.
func (s *Signer) VerifyBytes(token []byte, sandboxID string, port uint16, now time.Time) (time.Time, error) {
	if len(token) < 1 || len(token) > maxTokenLen || !isBase64URL(token) {
		return time.Time{}, rejTokenMalformed
	}
	m := s.pool.Get().(*macScratch)
	defer s.pool.Put(m)
	n, err := s.enc.Decode(m.raw[:], token)
	if err != nil || n < minRawLen || m.raw[0] != tokenVersion {
		return time.Time{}, rejTokenMalformed
	}
	msg, mac := m.raw[:n-macLen], m.raw[n-macLen:n]
	if !s.macValid(m, msg, mac) {
		return time.Time{}, rejTokenInvalid
	}
	expiry := int64(binary.BigEndian.Uint64(msg[1:9]))
	if !sameTarget(msg, sandboxID, port) {
		return time.Time{}, rejTokenWrongTarget
	}
	if now.Unix() >= expiry {
		return time.Time{}, rejTokenExpired
	}
	return time.Unix(expiry, 0), nil
}

// macValid reports whether any key produces mac over msg. Every key is
// tried (no early exit) and each compare is constant time.
func (s *Signer) macValid(m *macScratch, msg, mac []byte) bool {
	ok := 0
	for _, h := range m.hashes {
		h.Reset()
		h.Write(msg)
		ok |= subtle.ConstantTimeCompare(h.Sum(m.sum[:0]), mac)
	}
	return ok == 1
}

// sameTarget compares the authenticated payload's port and sandbox id with
// the request's. Neither is secret, so a plain compare is fine here.
func sameTarget(msg []byte, sandboxID string, port uint16) bool {
	return binary.BigEndian.Uint16(msg[9:11]) == port && string(msg[headerLen:]) == sandboxID
}

// isBase64URL rejects bytes the decoder would skip (CR, LF) or refuse, so
// exactly one spelling of each token verifies.
func isBase64URL(b []byte) bool {
	for _, c := range b {
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// Cookie values: the signed token, '.', and a binding MAC (truncated to
// bindLen bytes, base64url) over the token and the route's traffic token.
const (
	bindLen      = 16
	bindTextLen  = (bindLen*8 + 5) / 6
	bindSep      = '.'
	bindingLabel = "cube-proxy cookie binding v1"
)

// CookieValue returns the cookie value a verified signed token is traded for
// on a route whose traffic token is traffic: the token plus a MAC that binds
// it to that traffic token, so rotating the route's token ends every cookie
// issued before (a browser session must not outlive the credential the
// platform revokes). The first key signs the binding.
func (s *Signer) CookieValue(token []byte, traffic string) string {
	m := s.pool.Get().(*macScratch)
	defer s.pool.Put(m)
	bind := s.binding(m, m.hashes[0], token, traffic)
	out := make([]byte, 0, len(token)+1+bindTextLen)
	out = append(append(out, token...), bindSep)
	return string(s.enc.AppendEncode(out, bind[:bindLen]))
}

// VerifyCookie checks a cookie value made by CookieValue for the sandbox
// and port being requested, on a route whose traffic token is now traffic.
// The token is checked first (malformed, invalid, wrong_target, expired, as
// Verify); a value without a binding, or whose binding no key produces for
// this traffic token, is refused too (malformed, invalid). It returns the
// token's expiry, and allocates nothing when the value is valid.
func (s *Signer) VerifyCookie(value []byte, sandboxID string, port uint16, traffic string, now time.Time) (time.Time, error) {
	i := len(value) - bindTextLen - 1
	if i < 1 || value[i] != bindSep {
		return time.Time{}, rejCookieMalformed
	}
	token, bindText := value[:i], value[i+1:]
	exp, err := s.VerifyBytes(token, sandboxID, port, now)
	if err != nil {
		return time.Time{}, err
	}
	var bind [bindLen]byte
	if !isBase64URL(bindText) {
		return time.Time{}, rejCookieMalformed
	}
	if n, err := s.enc.Decode(bind[:], bindText); err != nil || n != bindLen {
		return time.Time{}, rejCookieMalformed
	}
	m := s.pool.Get().(*macScratch)
	defer s.pool.Put(m)
	ok := 0
	for _, h := range m.hashes {
		// Every key, no early exit, as for the token's own MAC.
		ok |= subtle.ConstantTimeCompare(s.binding(m, h, token, traffic)[:bindLen], bind[:])
	}
	if ok != 1 {
		return time.Time{}, rejCookieRebound
	}
	return exp, nil
}

// binding computes the binding MAC of traffic and token with h (one key's
// HMAC) into m.sum. The traffic token is length-prefixed, so no other pair
// hashes the same bytes.
func (s *Signer) binding(m *macScratch, h hash.Hash, token []byte, traffic string) []byte {
	h.Reset()
	writeString(h, m, bindingLabel)
	binary.BigEndian.PutUint64(m.chunk[:8], uint64(len(traffic)))
	h.Write(m.chunk[:8])
	writeString(h, m, traffic)
	h.Write(token)
	return h.Sum(m.sum[:0])
}

// writeString feeds str to h through m.chunk: converting it to a slice
// would allocate on every request.
func writeString(h hash.Hash, m *macScratch, str string) {
	for len(str) > 0 {
		n := copy(m.chunk[:], str)
		h.Write(m.chunk[:n])
		str = str[n:]
	}
}
