// Command cubeproxy is the edge proxy of the sandbox platform.
//
//	cubeproxy serve --config configs/cubeproxy.yaml
//	cubeproxy check --config configs/cubeproxy.yaml
//	cubeproxy demo
//	cubeproxy version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/cube-sandbox/cubeproxy/config"
)

// version is set at build time (-ldflags "-X main.version=..."), as the
// Dockerfile does; appVersion is what the binary reports.
var version = "dev"

// appVersion is the version the binary reports (version, the "cubeproxy
// listening" line, the registry entry, telemetry's service.version):
// version when set at build time, else what the toolchain recorded.
func appVersion() string {
	info, _ := debug.ReadBuildInfo()
	return buildVersion(version, info)
}

// buildVersion is set when it was given at build time, and otherwise
// (make build, go build, go install, all of which reported "dev") the
// module version go install recorded, or "dev-" and the source's commit,
// "-modified" when the checkout had changes: builds told apart in the
// logs and the registry. "dev" when info records neither.
func buildVersion(set string, info *debug.BuildInfo) string {
	if set != "dev" || info == nil {
		return set
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return set
	}
	v := set + "-" + rev[:min(len(rev), 12)]
	if modified == "true" {
		v += "-modified"
	}
	return v
}

func main() {
	// SIGHUP reopens the access log (once serving, and queued from the
	// access log's opening); before that it must not take its default
	// action (exit) if logrotate fires during startup.
	signal.Ignore(syscall.SIGHUP)
	// Go kills a program whose write to descriptor 1 or 2 hits a broken
	// pipe (a log shipper that died, journald restarting), and with it
	// every open stream. Ignored, the write fails with EPIPE instead. The
	// logs of serve write through a duplicate of stdout (proclog.Pollable),
	// which Go raises no SIGPIPE for anyway; this keeps a write to the
	// descriptors themselves (usage, check's output) from killing it.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `cubeproxy - edge proxy for sandbox ports (<port>-<sandbox-id>.<domain>)

Usage:
  cubeproxy serve [--config FILE] [flags]   run the proxy (see serve -h)
  cubeproxy check [--config FILE] [flags]   check serve's configuration and print it (nginx -t)
  cubeproxy demo  [flags]                   run the proxy plus a local demo sandbox
  cubeproxy health [--live] [--timeout 3s] [--config FILE]
                                            ask the running proxy's admin listener
                                            (/readyz; --live: /admin/healthz); exit 0 on 200
  cubeproxy token sign --sandbox ID --port P [--ttl 10m] [--config FILE]
                                            issue a signed browser token (keys: auth.signing_keys)
  cubeproxy version                         print the version
  cubeproxy help COMMAND                    the flags of one command (as COMMAND -h)
`

// run executes one subcommand and returns the process exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], getenv, stdout, stderr, nil)
	case "check":
		err = check(ctx, args[1:], getenv, stdout, stderr)
	case "demo":
		err = demo(ctx, args[1:], getenv, stdout, stderr)
	case "token":
		err = token(args[1:], getenv, stdout, stderr)
	case "health":
		err = health(ctx, args[1:], getenv, stdout, stderr)
	case "version", "-version", "--version", "-v":
		// Each spelling Go's flag package gives a flag, as the
		// subcommands' flags take them ("cubeproxy -version" was an
		// unknown command told to come first). An argument is a mistake
		// exited 2, as in every other command: a script's
		// "version --short" was answered as if it were understood.
		switch {
		case len(args) == 1:
			fmt.Fprintln(stdout, "cubeproxy", appVersion())
		case len(args) == 2 && isHelpFlag(args[1]):
			fmt.Fprintln(stderr, "usage: cubeproxy version")
		default:
			err = usageError{errors.New("version takes no arguments")}
		}
	case "help", "-h", "-help", "--h", "--help":
		if args[0] == "help" && (len(args) == 2 && args[1] == "token" || len(args) == 3 && args[1] == "token" && args[2] == "sign") {
			// token's one subcommand: its flags, which "token -h" (a
			// command missing its subcommand) does not list.
			return run(ctx, []string{"token", "sign", "-h"}, getenv, stdout, stderr)
		}
		if len(args) > 2 && args[0] == "help" {
			err = usageError{errors.New("help takes one command: cubeproxy help COMMAND")}
			break
		}
		if len(args) > 1 && args[0] == "help" && args[1] != "help" {
			// "cubeproxy help serve", as go help build: the usage of
			// the command asked about, not this list again.
			return run(ctx, []string{args[1], "-h"}, getenv, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
	default:
		why := ""
		if strings.HasPrefix(args[0], "-") {
			// A flag before the command (cubeproxy --config f serve, as
			// nginx -c f): the usage below lists commands, not why.
			why = ": the command comes first and its flags after it (cubeproxy serve --config FILE)"
		} else if c := commandLike(args[0]); c != "" {
			why = fmt.Sprintf(" (did you mean %s?)", c)
		}
		fmt.Fprintf(stderr, "unknown command %q%s\n\n%s", args[0], why, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "cubeproxy:", err)
		// In place of the flag list the flag package printed (a hundred
		// flags for serve), which buried the error.
		if ue, ok := errors.AsType[*config.UsageError](err); ok && ue.ListFlags != "" {
			fmt.Fprintf(stderr, "cubeproxy: run '%s' to list the flags\n", ue.ListFlags)
		}
		noteUnknownEnv(stderr, os.Environ())
		if isUsage(err) {
			return 2
		}
		return 1
	}
	return 0
}

// isHelpFlag reports whether arg asks for help as Go's flag package
// reads it (-h, -help, with one dash or two).
func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// commandLike returns the command (or two: "a or b") that word mistypes,
// cuts short or runs past ("serv", "chek", "healthz"), or "": the usage that follows lists
// the commands, but not which one a script's typo meant. Flags are
// matched alike (config.Suggest).
func commandLike(word string) string {
	return strings.Join(config.Suggest(word, []string{"serve", "check", "demo", "token", "health", "version", "help"}), " or ")
}

// usageError is a command line that does not say what to run: a
// required flag left out, a subcommand missing. It exits 2, as
// config.UsageError (a flag the command cannot read) and an unknown
// subcommand do, so a wrapper script can tell its own mistake from a
// configuration the proxy refused or a failure while running (exit 1).
type usageError struct{ error }

// Unwrap gives the error usageError marks.
func (e usageError) Unwrap() error { return e.error }

// isUsage reports whether err is a mistake in the command line itself
// rather than in the configuration it names or the run it started.
func isUsage(err error) bool {
	var ue *config.UsageError
	return errors.As(err, new(usageError)) || errors.As(err, &ue)
}

// noteUnknownEnv follows a failed command with each CUBEPROXY_* variable
// that names no setting. A misspelled one is often why it failed (the
// error then asks for the variable the operator believes is set), and
// serve's warning about it is logged only once the proxy is running.
func noteUnknownEnv(w io.Writer, environ []string) {
	for _, v := range config.UnknownEnv(environ) {
		if key := config.FileOnlySetting(v.Name); key != "" {
			fmt.Fprintf(w, "cubeproxy: note: %s is not a setting and was ignored: %s is set only in the config file\n", v.Name, key)
		} else if v.Nearest != "" {
			fmt.Fprintf(w, "cubeproxy: note: %s is not a setting and was ignored; did you mean %s?\n", v.Name, v.Nearest)
		} else {
			fmt.Fprintf(w, "cubeproxy: note: %s is not a setting and was ignored\n", v.Name)
		}
	}
}
