package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// fileSettings lists the settings that name a file or directory, which
// the errors of the packages that open them name by its path.
var fileSettings = map[string]bool{
	"routes": true, "access_log.path": true, "redis.ca_file": true, "redis.cert_file": true, "redis.key_file": true,
	"tls.cert_file": true, "tls.key_file": true, "tls.acme.trusted_roots_file": true, "tls.acme.storage_dir": true,
}

// NameOrigins returns err with a note naming the environment variable or
// flag of each setting it mentions whose value did not come from the
// file: "cache.size: -1 is negative (cache.size is set by
// CUBEPROXY_CACHE_SIZE)". An operator looks for a refused value in the
// config file, and the image, the unit file or the pod spec set it. The
// note names where a value came from, never the value (it may be a
// secret). err is returned as it is when it mentions no such setting.
func (c *Config) NameOrigins(err error) error {
	if err == nil || len(c.origins) == 0 {
		return err
	}
	msg := err.Error()
	type mention struct {
		at  int
		key string
	}
	var found []mention
	for _, s := range collect(reflect.ValueOf(c).Elem()) {
		key := strings.Join(s.path, ".")
		if _, ok := c.origins[key]; !ok {
			continue
		}
		at := mentionOf(msg, key)
		if v := s.v; at < 0 && fileSettings[key] && len(v.String()) > 1 {
			// A package's error names the file, not the setting: "open
			// access log /var/log/x.log: ...".
			at = strings.Index(msg, v.String())
		}
		if at >= 0 {
			found = append(found, mention{at, key})
		}
	}
	if len(found) == 0 {
		return err
	}
	sort.Slice(found, func(i, j int) bool { return found[i].at < found[j].at })
	notes := make([]string, len(found))
	for i, m := range found {
		notes[i] = m.key + " is set by " + c.origins[m.key]
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
}

// mentionOf is the index of the first place msg names the setting key, -1
// when none does. A key is named where it stands as a word of its own (not
// part of a longer path, as tls.acme in tls.acme.email). A one-word key
// (store, routes, domains) is also an English word: it counts only where
// a value or a verb about it follows ("store is", `store "x"`, "store:").
func mentionOf(msg, key string) int {
	isKeyByte := func(b byte) bool { return b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '_' || b == '.' }
	oneWord := !strings.ContainsAny(key, "._")
	for from := 0; ; {
		i := strings.Index(msg[from:], key)
		if i < 0 {
			return -1
		}
		i += from
		from = i + 1
		end := i + len(key)
		if i > 0 && isKeyByte(msg[i-1]) {
			continue
		}
		if rest := msg[end:]; rest != "" && isKeyByte(rest[0]) && !(rest[0] == '.' && (len(rest) == 1 || !isKeyByte(rest[1]))) {
			continue // a longer word or path; a "." that ends a sentence is no path
		}
		if oneWord {
			rest := msg[end:]
			if !strings.HasPrefix(rest, ":") && !strings.HasPrefix(rest, ` "`) && !strings.HasPrefix(rest, " is ") && !strings.HasPrefix(rest, " (") {
				continue
			}
		}
		return i
	}
}
