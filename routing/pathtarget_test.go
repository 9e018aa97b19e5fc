package routing

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A target under /sandbox/ on a host that names no sandbox port is routed
// by its path, as the platform's proxy routes it; a sandbox host keeps its
// own routing for every path, and a malformed host is refused as before.
func TestParseRequestPath(t *testing.T) {
	parsers := testParsers()
	cube := headers("X-Cube-Sandbox-Id", "other", "X-Cube-Sandbox-Port", "9000")
	none := headers()
	for _, tc := range []struct {
		parser, host, target string
		h                    HeaderPeeker
		port                 uint16
		id                   string
		prefix               int    // PathPrefix; 0 = routed by host
		code                 string // "" = success
	}{
		{"plain", "127.0.0.1", "/sandbox/abc/8080/p?q", none, 8080, "abc", 17, ""},
		{"plain", "127.0.0.1:8081", "/sandbox/abc/8080", none, 8080, "abc", 17, ""},
		{"plain", "[::1]:8081", "/sandbox/abc/8080?q=/x", none, 8080, "abc", 17, ""},
		{"plain", "localhost", "/sandbox/a_b-1/1/", none, 1, "a_b-1", 16, ""},
		{"plain", "proxy.example.com", "/sandbox/abc/65535/x", none, 65535, "abc", 18, ""},
		// Leading slashes count as one, as nginx merges them; the
		// sandbox's own path is left as sent.
		{"plain", "127.0.0.1", "//sandbox/abc/8080/p", none, 8080, "abc", 18, ""},
		{"plain", "127.0.0.1", "///sandbox/abc/8080//p?q", none, 8080, "abc", 19, ""},
		// Headers on a shared host lose to the path, as on the platform.
		{"plain", "127.0.0.1", "/sandbox/abc/8080/", cube, 8080, "abc", 17, ""},
		// A host that names no sandbox port: any name, a domain not allowed.
		{"plain", "node.internal", "/sandbox/abc/8080/", none, 8080, "abc", 17, ""},
		{"domains", "8080-x.evil.test", "/sandbox/abc/8080/", none, 8080, "abc", 17, ""},
		{"domains", "x.sandbox.example.com", "/sandbox/abc/8080/", none, 8080, "abc", 17, ""},
		// A name under a sandbox host serves no path: any sandbox's page
		// there would be same-site with that host. Refused as on host
		// routing, with domains configured; without, any name may be a
		// shared host's.
		{"domains", "x.8080-own.sandbox.example.com", "/sandbox/abc/8080/", none, 0, "", 0, CodeDomainNotAllowed},
		{"domains", "A.b.8080-OWN.Sandbox.Example.com.:8081", "/sandbox/abc/8080/", none, 0, "", 0, CodeDomainNotAllowed},
		{"domains", "x.8080-own.e2b.dev", "//sandbox/abc/8080/", none, 0, "", 0, CodeDomainNotAllowed},
		{"plain", "x.8080-own.x.test", "/sandbox/abc/8080/", none, 8080, "abc", 17, ""},
		// A sandbox host: routed by the host, whatever the path.
		{"plain", "3000-own.x.test", "/sandbox/abc/8080/", none, 3000, "own", 0, ""},
		{"domains", "3000-own.sandbox.example.com", "/sandbox/abc/8080/", none, 3000, "own", 0, ""},
		// Headers on a shared host, a path that is not under /sandbox/.
		{"plain", "127.0.0.1", "/sandboxes/abc/8080/", cube, 9000, "other", 0, ""},
		{"plain", "127.0.0.1", "/Sandbox/abc/8080/", cube, 9000, "other", 0, ""},
		// Absolute form, from a client that has the node as its HTTP
		// proxy: routed by its path as nginx routes it, when its own host
		// serves paths too; the prefix counts from the target's start.
		{"plain", "127.0.0.1", "http://127.0.0.1/sandbox/abc/8080/", cube, 8080, "abc", 33, ""},
		{"plain", "127.0.0.1:8081", "https://127.0.0.1:8081/sandbox/abc/8080?q", none, 8080, "abc", 39, ""},
		{"plain", "10.0.0.1", "http://proxy.example.com//sandbox/abc/8080/p", none, 8080, "abc", 42, ""},
		{"plain", "127.0.0.1", "http://127.0.0.1/sandbox/abc", none, 0, "", 0, CodeInvalidPath},
		{"plain", "127.0.0.1", "http://127.0.0.1/sandbox/ABC/8080/", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "http://127.0.0.1/sandbox/abc/0/", none, 0, "", 0, CodeInvalidPort},
		// Its host naming a sandbox, or being no host name: routed by
		// Host, which names another target or none.
		{"plain", "127.0.0.1", "http://8080-abc.x.test/sandbox/abc/8080/", none, 0, "", 0, CodeMissingTargetHeaders},
		{"plain", "127.0.0.1", "http://8080-abc.x.test/sandbox/abc/8080/", cube, 0, "", 0, CodeInvalidHost},
		{"plain", "127.0.0.1", "http://a..b/sandbox/abc/8080/", cube, 0, "", 0, CodeInvalidHost},
		{"domains", "127.0.0.1", "http://x.8080-own.e2b.dev/sandbox/abc/8080/", cube, 0, "", 0, CodeInvalidHost},
		// Not its path: the query, another scheme's authority alone.
		{"plain", "127.0.0.1", "http://127.0.0.1?/sandbox/abc/8080/", cube, 9000, "other", 0, ""},
		{"plain", "127.0.0.1", "http://127.0.0.1#/sandbox/abc/8080/", cube, 9000, "other", 0, ""},
		// A sandbox Host routes by itself, its target checked against it.
		{"plain", "8080-abc.x.test", "http://8080-abc.x.test/sandbox/other/9000/", none, 8080, "abc", 0, ""},
		{"plain", "8080-abc.x.test", "http://127.0.0.1/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
		// Malformed.
		{"plain", "127.0.0.1", "/sandbox/abc", none, 0, "", 0, CodeInvalidPath},
		{"plain", "127.0.0.1", "/sandbox/", none, 0, "", 0, CodeInvalidPath},
		// No port segment before the query, whatever the query holds: the
		// id is not to blame ("abc?next=" was refused as an id).
		{"plain", "127.0.0.1", "/sandbox/abc?next=/home", none, 0, "", 0, CodeInvalidPath},
		{"plain", "127.0.0.1", "/sandbox/abc?/8080/", none, 0, "", 0, CodeInvalidPath},
		{"plain", "127.0.0.1", "//sandbox/abc?q=/x/8080", none, 0, "", 0, CodeInvalidPath},
		// An empty segment within the prefix: a template's missing id.
		{"plain", "127.0.0.1", "/sandbox//8080/", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "//sandbox//8080/x", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "/sandbox/abc//8080/", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "//sandbox/abc", none, 0, "", 0, CodeInvalidPath},
		{"plain", "127.0.0.1", "/sandbox/ABC/8080/", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "/sandbox/%61bc/8080/", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "/sandbox/-abc/8080/", none, 0, "", 0, CodeInvalidSandboxID},
		{"plain", "127.0.0.1", "/sandbox/abc/", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "/sandbox/abc/08080/", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "/sandbox/abc/0/", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "/sandbox/abc/65536/", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "/sandbox/abc/8080x", none, 0, "", 0, CodeInvalidPort},
		{"plain", "127.0.0.1", "/sandbox/abc/8080#f", none, 0, "", 0, CodeInvalidPort},
		// A malformed Host is refused as for any target.
		{"plain", "127.0.0.1:x", "/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
		{"plain", "", "/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
		{"plain", "\"0000000000", "/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
		{"plain", "a..b", "/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
		{"plain", "node/x", "/sandbox/abc/8080/", none, 0, "", 0, CodeInvalidHost},
	} {
		var tgt Target
		tgt.Shared, tgt.PathPrefix = true, 99 // a reused target
		err := parsers[tc.parser].ParseRequest(&tgt, []byte(tc.host), []byte(tc.target), tc.h)
		if tc.code != "" {
			var te *TargetError
			if !errors.As(err, &te) || te.Code != tc.code {
				t.Errorf("%s: ParseRequest(%q, %q) = %v, want %s", tc.parser, tc.host, tc.target, err, tc.code)
				continue
			}
			if tgt.Port != 0 || len(tgt.ID()) != 0 || tgt.Shared || tgt.PathPrefix != 0 {
				t.Errorf("failed ParseRequest(%q, %q) left target %+v", tc.host, tc.target, tgt)
			}
			continue
		}
		if err != nil || tgt.Port != tc.port || string(tgt.ID()) != tc.id || tgt.PathPrefix != tc.prefix {
			t.Errorf("%s: ParseRequest(%q, %q) = %d %q prefix %d, %v; want %d %q prefix %d",
				tc.parser, tc.host, tc.target, tgt.Port, tgt.ID(), tgt.PathPrefix, err, tc.port, tc.id, tc.prefix)
			continue
		}
		if tc.prefix > 0 {
			if tgt.Shared {
				t.Errorf("ParseRequest(%q, %q): a path target marked Shared", tc.host, tc.target)
			}
			if got, want := string(AppendPathPrefix(nil, &tgt)), "/sandbox/"+tc.id+"/"+strconv.Itoa(int(tc.port)); got != want {
				t.Errorf("ParseRequest(%q, %q): AppendPathPrefix %q, want %q", tc.host, tc.target, got, want)
			}
		}
	}
}

// hostRegexp is a host name as routing takes one: dot-separated labels of
// letters, digits, '-' and '_'.
var hostRegexp = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// pathModel is the README's rule for a path target: a canonical id and a
// port 1-65535 without leading zeros, then the end, a '/' or a '?';
// leading slashes count as one. pathRootModel is where it applies: a
// target beginning with /sandbox/ so read.
var (
	pathModel     = regexp.MustCompile(`^/+sandbox/([a-z0-9][a-z0-9_-]{0,127})/([1-9][0-9]{0,4})(?:[/?]|$)`)
	pathRootModel = regexp.MustCompile(`^/+sandbox/`)
)

// checkPathRequest holds ParseRequest for a target under PathRoot to the
// rules: a sandbox host routes by itself (as Parse), a malformed host is
// refused with Parse's error, any other host routes by pathModel.
func checkPathRequest(t *testing.T, name string, p *Parser, host, target string, h HeaderPeeker) {
	t.Helper()
	var tgt, byHost, named Target
	err := p.ParseRequest(&tgt, []byte(host), []byte(target), h)
	hostErr := p.Parse(&byHost, []byte(host), h)
	hostName, isIP, splitErr := splitHost([]byte(host))
	if splitErr != nil {
		var te, hte *TargetError
		if !errors.As(err, &te) || !errors.As(hostErr, &hte) || te.Code != hte.Code {
			t.Fatalf("%s: ParseRequest(%q, %q) = %v; the host is malformed: %v", name, host, target, err, hostErr)
		}
		return
	}
	if !isIP && !p.isShared(hostName) && !hostRegexp.MatchString(string(hostName)) {
		var te *TargetError
		if !errors.As(err, &te) || te.Code != CodeInvalidHost {
			t.Fatalf("%s: ParseRequest(%q, %q) = %v; the host is no host name: want %s", name, host, target, err, CodeInvalidHost)
		}
		return
	}
	if p.Parse(&named, []byte(host), nil) == nil && !named.Shared {
		if (err == nil) != (hostErr == nil) || tgt.Port != byHost.Port || string(tgt.ID()) != string(byHost.ID()) || tgt.PathPrefix != 0 {
			t.Fatalf("%s: ParseRequest(%q, %q) = %d %q %d, %v; a sandbox host routes by itself: %d %q, %v",
				name, host, target, tgt.Port, tgt.ID(), tgt.PathPrefix, err, byHost.Port, byHost.ID(), hostErr)
		}
		return
	}
	// A name under a sandbox host of a configured domain (some label of it
	// followed by one Parse takes for a sandbox's) routes no path: it is
	// refused with Parse's error. (With no domains, any name may be a
	// shared host's.)
	if name != "plain" {
		for rest := string(hostName); strings.Contains(rest, "."); {
			_, rest, _ = strings.Cut(rest, ".")
			var under Target
			if p.Parse(&under, []byte(rest), nil) == nil && !under.Shared {
				var te, hte *TargetError
				if !errors.As(err, &te) || !errors.As(hostErr, &hte) || te.Code != hte.Code {
					t.Fatalf("%s: ParseRequest(%q, %q) = %v; the host is under sandbox host %q: want Parse's %v", name, host, target, err, rest, hostErr)
				}
				return
			}
		}
	}
	m := pathModel.FindStringSubmatch(target)
	ok := m != nil
	prefix := 0
	if ok {
		n, _ := strconv.Atoi(m[2])
		ok = n <= 65535
		prefix = pathModel.FindStringSubmatchIndex(target)[5] // the port's end
	}
	if ok != (err == nil) {
		t.Fatalf("%s: ParseRequest(%q, %q) = %v; the path rule says %v", name, host, target, err, ok)
	}
	if !ok {
		var te *TargetError
		if !errors.As(err, &te) || te.Code == "" {
			t.Fatalf("%s: error %v is not a TargetError with a code", name, err)
		}
		// No '/' after the id before the query: the <port> segment is
		// missing, which the README answers invalid_sandbox_path, however
		// the query goes on ("/sandbox/abc?next=/home").
		path, _, _ := strings.Cut(target[pathRootModel.FindStringIndex(target)[1]:], "?")
		if !strings.Contains(path, "/") && te.Code != CodeInvalidPath {
			t.Fatalf("%s: ParseRequest(%q, %q) = %s %v; no <port> segment: want %s", name, host, target, te.Code, err, CodeInvalidPath)
		}
		return
	}
	if string(tgt.ID()) != m[1] || strconv.Itoa(int(tgt.Port)) != m[2] || tgt.Shared ||
		string(AppendPathPrefix(nil, &tgt)) != "/sandbox/"+m[1]+"/"+m[2] || tgt.PathPrefix != prefix {
		t.Fatalf("%s: ParseRequest(%q, %q) = %d %q prefix %d shared %v", name, host, target, tgt.Port, tgt.ID(), tgt.PathPrefix, tgt.Shared)
	}
}
