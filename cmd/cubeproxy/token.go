package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/proxy"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// token implements `cubeproxy token sign`: a signed, short-lived token a
// browser can trade for a cookie on a restricted sandbox
// (https://<port>-<id>.<domain>/?cube_token=<token>).
func token(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: cubeproxy token sign --sandbox ID --port P [--ttl 10m] [--config FILE]"
	if len(args) > 0 && isHelpFlag(args[0]) {
		// Asked for, not a mistake: usage and exit 0, as sign -h does.
		fmt.Fprintln(stderr, usage)
		return flag.ErrHelp
	}
	if len(args) == 0 || args[0] != "sign" {
		return usageError{errors.New(usage)}
	}
	fs := flag.NewFlagSet("cubeproxy token sign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sandbox := fs.String("sandbox", "", "sandbox id")
	// Decimal, as the traffic parser reads a Host's port (03000 is 3000):
	// flag.Int read a leading 0 as octal and 0x as hex, and signed 03000
	// for port 1536.
	var port int64
	fs.Func("port", "container port: a decimal `number`, 1-65535", func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return errors.New("want a port number in decimal digits")
		}
		port = n
		return nil
	})
	// Read as a duration here, so that one with no unit or no number is a
	// command line the program cannot read (exit 2), as serve's and
	// health's duration flags are; the range is judged below (exit 1).
	ttl := new(string)
	*ttl = "10m"
	fs.Func("ttl", "lifetime, a `duration` from 1s to 24h", func(s string) error {
		if _, err := time.ParseDuration(s); err != nil && s != "" { // "": the default, as ever
			return errors.New("want a duration with its unit (10m, 1h)")
		}
		*ttl = s
		return nil
	})
	fs.Lookup("ttl").DefValue = *ttl
	cfgPath := fs.String("config", "", "config file with auth.signing_keys (or CUBEPROXY_AUTH_SIGNING_KEYS)")
	if err := config.ParseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// Parsing stops at the first non-flag: what follows it was not read.
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	// A flag left out is a command line the program cannot read (exit 2),
	// told before the configuration is read: a missing key (exit 1) must
	// not hide it, or the fixed keys only lead to the next refusal. A flag
	// given a bad value (--port 0, --sandbox "") is said to be that, not
	// missing: "required" for a value given puzzled.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch {
	case !given["sandbox"]:
		return usageError{errors.New("--sandbox (a sandbox id) is required")}
	case !given["port"]:
		return usageError{errors.New("--port (1-65535) is required")}
	}
	cfg, err := loadConfigFile("cubeproxy token sign", *cfgPath, configFlagFirst(fs, getenv), stderr)
	if err != nil {
		return err
	}
	if len(cfg.Auth.SigningKeys) == 0 {
		return errors.New("no signing keys: set auth.signing_keys or CUBEPROXY_AUTH_SIGNING_KEYS")
	}
	signer, err := auth.NewSigner(cfg.Auth.SigningKeys)
	if err != nil {
		// Worded as serve's refusal of the same keys.
		return cfg.NameOrigins(fmt.Errorf("auth.signing_keys: %w", err))
	}
	switch {
	case !routing.ValidID(*sandbox):
		return fmt.Errorf("--sandbox %q is not a sandbox id: lower-case letters, digits, - and _, at most 128, starting with a letter or digit", *sandbox)
	case port < 1 || port > 65535:
		return fmt.Errorf("--port %d is not a port (1-65535)", port)
	}
	d, err := proxy.ParseTokenTTL(*ttl)
	if err != nil {
		return err
	}
	exp := proxy.TokenExpiry(time.Now(), d)
	tok, err := signer.Sign(*sandbox, uint16(port), exp)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	domain := "<domain>"
	if len(cfg.Domains) > 0 {
		// The configured domain makes the line one to copy, not a template.
		domain = domainOfHosts(cfg.Domains[0])
	}
	// The token stays on stdout only, so stderr can go to a terminal or a log.
	fmt.Fprintf(stderr, "expires %s; open https://%d-%s.%s/?%s=<token>\n", exp.UTC().Format(time.RFC3339), port, *sandbox, domain, auth.QueryParamName)
	return nil
}
