package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cube-sandbox/cubeproxy/config"
)

// health implements `cubeproxy health`: it asks the admin listener of
// the proxy the configuration names for /readyz (or, with --live,
// /admin/healthz) and succeeds on a 200. It is the Docker image's
// HEALTHCHECK: distroless has no curl, and a probe that reads the same
// configuration as serve finds the admin port wherever it was moved.
func health(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cubeproxy health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Parsed as serve's flags are: Go's own bool and duration flags took
	// no --live=on and said only "parse error" for --timeout 5.
	live, timeout := new(bool), new(time.Duration)
	*timeout = 3 * time.Second
	fs.BoolFunc("live", "ask /admin/healthz (alive, answers through the drain) instead of /readyz (ready for traffic)", func(s string) (err error) {
		*live, err = config.ParseBool(s)
		return err
	})
	fs.Func("timeout", "how long to wait for the answer, a `duration` with its unit", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return errors.New("want a duration with its unit (3s, 500ms)")
		}
		*timeout = d
		return nil
	})
	fs.Lookup("timeout").DefValue = timeout.String()
	cfgPath := fs.String("config", "", "the proxy's config file (or CUBEPROXY_CONFIG); its admin_addr is asked")
	if err := config.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// Parsing stops at the first non-flag: what follows it was not read.
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *timeout <= 0 {
		return usageError{fmt.Errorf("--timeout %v: give a positive duration", *timeout)}
	}
	getenv = configFlagFirst(fs, getenv)
	var addr string
	cfg, err := loadConfigFile("cubeproxy health", *cfgPath, getenv, stderr)
	if err == nil {
		if addr, err = probeAddr(cfg.AdminAddr); err != nil {
			return cfg.NameOrigins(err)
		}
	} else {
		// A file that no longer loads (edited since the proxy started: a
		// ConfigMap update) is the next start's problem, not the running
		// proxy's: failing the probe for it had an orchestrator restart a
		// healthy proxy into a start that fails. Its admin_addr is asked,
		// and the error said.
		var ue *config.UsageError
		if errors.As(err, &ue) {
			return err
		}
		setting, aerr := config.AdminAddr(*cfgPath, getenv)
		if aerr != nil {
			return err
		}
		if addr, aerr = probeAddr(setting); aerr != nil {
			return err
		}
		fmt.Fprintf(stderr, "cubeproxy health: the configuration no longer loads, asking its admin_addr %s: %v\n", setting, err)
	}
	path := "/readyz"
	if *live {
		path = "/admin/healthz"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return fmt.Errorf("health %s: %w", addr, err)
	}
	// No proxy from the environment: the admin listener is local. No
	// redirect followed either: the proxy never sends one, so a 3xx is
	// something else on the port, and following it judged another server
	// (anywhere the Location named) while exiting 0 as if the proxy were.
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		// net/http's error names the URL again (Get "http://…": …), and
		// the timeout as "context deadline exceeded".
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("no answer within %v", *timeout)
		}
		return fmt.Errorf("health: GET http://%s%s: %w", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	status := resp.Status
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode/100 == 3 {
		status += fmt.Sprintf(" (to %s, not followed)", loc)
	}
	line := fmt.Sprintf("GET %s: %s %s", path, status, strings.TrimSpace(string(body)))
	line = escapeControls(line)
	if resp.StatusCode != http.StatusOK {
		return errors.New("health: " + line)
	}
	fmt.Fprintln(stdout, line)
	return nil
}

// loadConfigFile loads the configuration for a command that takes
// --config and none of serve's other flags: the file at path (or
// CUBEPROXY_CONFIG when path is empty) and the CUBEPROXY_* environment.
func loadConfigFile(command, path string, getenv func(string) string, stderr io.Writer) (*config.Config, error) {
	var args []string
	if path != "" {
		args = []string{"--config", path}
	}
	return config.LoadCommand(command, shownDefaults(), args, getenv, stderr)
}

// configFlagFirst is getenv for a command whose flags fs hold --config:
// given, empty included, the flag stands in for CUBEPROXY_CONFIG, as
// serve's does (--config= reads no file, not even the image's).
func configFlagFirst(fs *flag.FlagSet, getenv func(string) string) func(string) string {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "config" })
	if !given {
		return getenv
	}
	return func(k string) string {
		if k == config.EnvPrefix+"CONFIG" {
			return ""
		}
		return getenv(k)
	}
}

// probeAddr is where a local client reaches the admin listener at addr:
// a wildcard (":8082", "0.0.0.0:8082", "[::]:8082") through IPv4's
// loopback. serve listens on "[::]" dual-stack, so 127.0.0.1 reaches it
// too, and, unlike ::1, also where the loopback has no IPv6
// (disable_ipv6=1, as in Docker networks without IPv6).
func probeAddr(addr string) (string, error) {
	if addr == "" {
		return "", errors.New("admin_addr is empty: there is no admin listener to ask")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("admin_addr %q: %w", addr, err)
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	if n, err := net.LookupPort("tcp", port); err == nil {
		// A service name (:http), which serve listens on and a URL
		// refuses ("invalid port"): the probe failed for good.
		port = strconv.Itoa(n)
	}
	return net.JoinHostPort(host, port), nil
}

// escapeControls spells out what a terminal would act on in s (escape
// sequences, bytes that are no UTF-8) as Go escapes: the answer health
// prints comes from whatever listens on the port, and an operator runs it
// in a terminal.
func escapeControls(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r != ' ' && !unicode.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
