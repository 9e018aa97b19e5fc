package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A flag the command cannot read (not defined, a value not of its kind, a
// value missing) is said once on stderr, first, with the flag most likely
// meant and the command that lists the flags, and exits 2: the flag
// package printed its error, then every flag (190 lines for serve), and
// run the same error again under them. -h still lists them all, exit 0.
func TestFlagErrorSaidOnce(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // the first line, after "cubeproxy: "
		list string // the command line that lists the flags
	}{
		{[]string{"serve", "--bogus"}, "flag provided but not defined: -bogus", "cubeproxy serve -h"},
		{[]string{"serve", "--admin-adr", "127.0.0.1:0"}, "flag provided but not defined: -admin-adr (did you mean --admin-addr?)", "cubeproxy serve -h"},
		{[]string{"serve", "--routes=", "--admin-addr"}, "flag needs an argument: -admin-addr", "cubeproxy serve -h"},
		// A flag written without its section.
		{[]string{"check", "--trace-sample-ratio=0.5"}, "flag provided but not defined: -trace-sample-ratio (did you mean --telemetry-trace-sample-ratio?)", "cubeproxy check -h"},
		{[]string{"check", "--cache-size=abc"}, `invalid value "abc" for flag -cache-size: `, "cubeproxy check -h"},
		{[]string{"demo", "--http-adr=:0"}, "flag provided but not defined: -http-adr (did you mean --http-addr?)", "cubeproxy demo -h"},
		{[]string{"health", "--timout=1s"}, "flag provided but not defined: -timout (did you mean --timeout?)", "cubeproxy health -h"},
		{[]string{"health", "--live=maybe"}, `invalid boolean value "maybe" for -live: `, "cubeproxy health -h"},
		{[]string{"token", "sign", "--prot", "3000"}, "flag provided but not defined: -prot (did you mean --port?)", "cubeproxy token sign -h"},
		{[]string{"token", "sign", "--sandbox=box", "--port=1", "--ttl"}, "flag needs an argument: -ttl", "cubeproxy token sign -h"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, noEnv, &out, &errb)
			stderr := errb.String()
			lines := strings.Split(stderr, "\n")
			if code != 2 || out.Len() != 0 {
				t.Errorf("exit %d, stdout %q; want 2 and nothing", code, out.String())
			}
			if len(lines) < 2 || !strings.HasPrefix(lines[0], "cubeproxy: "+tc.err) {
				t.Fatalf("stderr %.400q; want it to open with %q", stderr, "cubeproxy: "+tc.err)
			}
			if want := "cubeproxy: run '" + tc.list + "' to list the flags"; lines[1] != want {
				t.Errorf("second line %q, want %q", lines[1], want)
			}
			// Once: the flag package's own line, or its list, not again.
			name := tc.err[:strings.Index(tc.err, "-")]
			if n := strings.Count(stderr, name); n != 1 {
				t.Errorf("stderr %.400q says %q %d times, want once", stderr, name, n)
			}
			if strings.Contains(stderr, "Usage of") || strings.Contains(stderr, "\n  -") {
				t.Errorf("stderr %.400q lists the flags", stderr)
			}
		})
	}
	for _, args := range [][]string{{"serve", "-h"}, {"check", "--help"}, {"health", "-h"}, {"token", "sign", "-help"}} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, noEnv, &out, &errb)
		if name := strings.Join(args[:len(args)-1], " "); code != 0 || !strings.HasPrefix(errb.String(), "Usage of cubeproxy "+name+":\n  -") {
			t.Errorf("%q: exit %d, stderr %.100q; want 0 and the flags", args, code, errb.String())
		}
		if strings.Contains(errb.String(), "to list the flags") {
			t.Errorf("%q: stderr %.100q: -h is no mistake", args, errb.String())
		}
	}
}
