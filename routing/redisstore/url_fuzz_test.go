package redisstore

import (
	"net/url"
	"strings"
	"testing"
	"unicode"

	"github.com/redis/go-redis/v9"
)

// secretWindow is the length of the password's pieces leakedPiece looks
// for: long enough that one found in an error was taken from the password.
const secretWindow = 6

// leakedPiece returns a piece of secret (secretWindow bytes, or all of a
// shorter secret; none of one under 4 bytes) that msg holds and others
// does not, or "". A piece without a letter or a digit is none.
func leakedPiece(msg, secret, others string) string {
	if len(secret) < 4 {
		return ""
	}
	n := min(secretWindow, len(secret))
	for i := 0; i+n <= len(secret); i++ {
		p := secret[i : i+n]
		if !strings.ContainsFunc(p, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) {
			continue // blanks and punctuation ("   :"), which the refusal's own text has
		}
		if strings.Contains(msg, p) && !strings.Contains(others, p) {
			return p
		}
	}
	return ""
}

// FuzzRedisURL builds redis.url values (redis, rediss, unix) from a user,
// a password written
// as the operator typed it (URL-encoded or not: a '/', '?', '#' or '%' of
// a generated password is often left raw) and the rest of the URL, and
// holds the client's reading of them to two things: a URL it accepts
// gives the client the password it holds (a password cut by a raw '/',
// '?' or '#' would dial with another password, or none, or another
// Redis), and a refusal, which the process logs, holds no piece of the
// password. Its scheme, in any case, says TLS as go-redis reads it
// (Config.tlsOn, which ca_file and cert_file are checked against).
func FuzzRedisURL(f *testing.F) {
	for i, s := range [][3]string{
		{"default", "hunter2-secret", "redis.internal:6379/0"},
		{"", "/s3cretpw", "r:6379"},
		{"u", "?s3cretpw", "r:6379"},
		{"u", "12/s3cretpw", "r:6379"},
		{"u", "0/s3cretpw", "r:6379"},
		{"u", "#s3cretpw", "r:6379"},
		{"u", "/a/b/s3cretpw", "r:6379/1"},
		{"u", "?db=x&s3cretpw", "r:6379"},
		{"u", "s3cret%2Fpw", "r:6379/2?dial_timeout=1s"},
		{"u", "s3cret%zzpw", "r:6379"},
		{"u", "p@ss@word", "[::1]:6379"},
		{"u", "s3cret/pw", "/run/redis/redis.sock"},
		{"u", "s3cretpw", "/run/redis/redis.sock?db=2"},
	} {
		f.Add(uint8(i), s[0], s[1], s[2])
	}
	schemes := []string{"redis", "rediss", "unix", "REDISS", "Rediss", "REDIS", "UNIX"}
	f.Fuzz(func(t *testing.T, scheme uint8, user, pw, tail string) {
		if strings.Contains(user, ":") || strings.ContainsAny(tail, "@") {
			return // the password would start elsewhere, or end later
		}
		sch := schemes[int(scheme)%len(schemes)]
		if strings.EqualFold(sch, "unix") && !strings.HasPrefix(tail, "/") {
			tail = "/" + tail // a socket's path
		}
		raw := sch + "://" + user + ":" + pw + "@" + tail
		cfg := Config{URL: raw}.WithDefaults()
		err := cfg.Validate()
		var opt *redis.Options
		if err == nil {
			opt, err = standaloneOptions(cfg, budget(cfg.CommandTimeout), clientTLS{})
		}
		if err == nil {
			want, uerr := url.PathUnescape(pw)
			if uerr != nil {
				t.Fatalf("%q accepted, but its password %q does not unescape: %v", raw, pw, uerr)
			}
			if got := opt.Password; got != want {
				t.Fatalf("%q accepted with password %q, want %q", raw, got, want)
			}
			if ref, rerr := redis.ParseURL(raw); rerr == nil && (ref.TLSConfig != nil) != cfg.tlsOn() {
				t.Fatalf("%q: go-redis's TLS %v, tlsOn %v", raw, ref.TLSConfig != nil, cfg.tlsOn())
			}
			return
		}
		// The mask of a redacted password or option ("xxxxx") is no piece
		// of the password, whatever the password ("xxxx", "xxx@"), nor
		// are the refusal's own words ("word"), nor the URL's tail followed
		// by the ": " that ends the redacted URL ("000:" of a tail ending in
		// "000").
		msg := strings.ReplaceAll(err.Error(), "xxxxx", "\x00")
		others := raw[:strings.Index(raw, "://")+3] + user + ":@" + tail + ": not a valid URL (check that the password is URL-encoded)"
		// The refusal of an option the proxy sets names the option and
		// what to set instead (checkURLOptions): its own words.
		others += " option is not applied, the proxy sets it on every connection: "
		for _, instead := range overriddenURLOptions {
			others += instead + " "
		}
		if p := leakedPiece(msg, pw, others); p != "" {
			t.Fatalf("the refusal of %q holds %q of its password: %s", raw, p, msg)
		}
		if dec, derr := url.PathUnescape(pw); derr == nil {
			if p := leakedPiece(msg, dec, others); p != "" {
				t.Fatalf("the refusal of %q holds %q of its password: %s", raw, p, msg)
			}
		}
	})
}
