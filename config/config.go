// Package config loads CubeProxy's configuration: a YAML file, overridden
// by CUBEPROXY_* environment variables, overridden by command-line flags.
// Every setting has all three spellings, derived from its YAML path:
// upstream.connect_timeout is --upstream-connect-timeout and
// CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT.
package config

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
	"github.com/cube-sandbox/cubeproxy/internal/yamldoc"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
)

// Config is the whole configuration. The YAML names are the contract
// (configs/cubeproxy.yaml documents each).
type Config struct {
	HTTPAddr   string `yaml:"http_addr" usage:"sandbox traffic listener (plain HTTP)"`
	HTTPSAddr  string `yaml:"https_addr" usage:"sandbox traffic listener (TLS); empty = off"`
	AdminAddr  string `yaml:"admin_addr" usage:"admin API listener (never shared with traffic)"`
	AdminToken string `yaml:"admin_token" usage:"X-Cube-Admin-Token for the admin API; empty = loopback only"`
	// Runtime profiling (net/http/pprof's endpoints) on the admin listener,
	// behind the admin API's credential: off, /debug/pprof/ is a 404.
	AdminPprof bool `yaml:"admin_pprof" usage:"serve Go's runtime profiles (CPU, heap, goroutines, trace) at /debug/pprof/ on the admin listener, behind the admin token (loopback only without one)"`
	// The platform proxy's metrics listener (CUBE_PROXY_METRICS_LISTEN).
	MetricsAddr string `yaml:"metrics_addr" usage:"listener serving GET /metrics alone, without the admin token, for a scraper kept off the admin API (the platform proxy's CUBE_PROXY_METRICS_LISTEN); empty = off"`
	ReusePort   bool   `yaml:"reuse_port" usage:"open the listeners with SO_REUSEPORT, so that a new process can take over the ports before the old one drains (Linux)"`

	NodeIP      string   `yaml:"node_ip" usage:"this node's IP: routes whose HostIP equals it dial SandboxIP directly"`
	InstanceID  string   `yaml:"instance_id" usage:"name of this proxy instance (default: hostname)"`
	Domains     []string `yaml:"domains" usage:"allowed sandbox domains (comma-separated); empty = any"`
	SharedHosts []string `yaml:"shared_hosts" usage:"hosts on which X-Cube-Sandbox-Id/-Port headers pick the sandbox"`

	LogFormat string `yaml:"log_format" usage:"json or text"`
	LogLevel  string `yaml:"log_level" usage:"debug, info, warn or error"`

	Store         string `yaml:"store" usage:"route store: memory or redis"`
	Routes        string `yaml:"routes" usage:"routes file for the memory store"`
	PersistRoutes bool   `yaml:"persist_routes" usage:"write admin route changes back to the routes file"`

	MaxRequestBody int64         `yaml:"max_request_body" usage:"largest request body in bytes (413 above)"`
	DrainTimeout   time.Duration `yaml:"drain_timeout" usage:"how long shutdown lets requests finish"`
	MaxStreams     int           `yaml:"max_streams_per_sandbox" usage:"concurrent requests per sandbox (0 = unlimited; 429 above)"`
	// How long a request over max_streams_per_sandbox waits for a slot
	// before its 429 (proxy.Config's StreamLimitWait).
	StreamLimitWait time.Duration `yaml:"stream_limit_wait" usage:"how long a request over max_streams_per_sandbox waits for a slot to free before its 429 (negative = no wait)"`
	// The bodies read whole into memory over max_streams_per_sandbox, to
	// tell whether they are JSON-RPC notifications and responses only
	// (proxy.Config's MaxHeldBody, HeldBodyBudget, HeldBodyPerSandbox).
	MaxHeldBody        int64 `yaml:"max_held_body" usage:"largest POST body in bytes read whole over max_streams_per_sandbox to be judged (at most max_request_body and held_body_budget; negative = none, only bodies of up to 8 KiB pass)"`
	HeldBodyBudget     int64 `yaml:"held_body_budget" usage:"bytes of such bodies held at once across all sandboxes (429 no room above)"`
	HeldBodyPerSandbox int64 `yaml:"held_body_per_sandbox" usage:"bytes of such bodies one sandbox may hold at once (unset: a quarter of held_body_budget, at least max_held_body; negative = no share, all of held_body_budget)"`

	Cache    Cache    `yaml:"cache"`
	Upstream Upstream `yaml:"upstream"`
	Client   Client   `yaml:"client"`

	Auth      Auth                      `yaml:"auth"`
	AccessLog AccessLog                 `yaml:"access_log"`
	Telemetry Telemetry                 `yaml:"telemetry"`
	Redis     redisstore.Config         `yaml:"redis"`
	Registry  redisstore.RegistryConfig `yaml:"registry"`
	Lifecycle Lifecycle                 `yaml:"lifecycle"`
	TLS       TLS                       `yaml:"tls"`

	// origins names, by YAML path, the variable or flag each setting set
	// outside the file came from (see NameOrigins).
	origins map[string]string
	// file is the configuration file read, "" when none was.
	file string
}

// File is the configuration file the settings were read from ("" when
// none was): the path --config or CUBEPROXY_CONFIG named.
func (c *Config) File() string { return c.file }

// Changed lists, in declaration order, the YAML paths of the settings
// whose values differ between c and other ("cache.size",
// "upstream.max_conns"): names only, never values, which may be secrets.
func (c *Config) Changed(other *Config) []string {
	var out []string
	for _, k := range changedLeaves(reflect.ValueOf(*other), reflect.ValueOf(*c), "") {
		out = append(out, strings.TrimPrefix(k, "."))
	}
	return out
}

// Auth configures the proxy's own credentials.
type Auth struct {
	SigningKeys []string `yaml:"signing_keys" usage:"HMAC keys for signed browser tokens (>= 32 bytes each; the first signs, all verify)"`
	ExemptPorts []int    `yaml:"exempt_ports" usage:"container ports that skip the traffic-token check"`
}

// AccessLog configures the per-request log.
type AccessLog struct {
	Format      string `yaml:"format" usage:"json, cube (the platform's ||-separated 22 fields) or off"`
	Path        string `yaml:"path" usage:"file (reopened on SIGHUP or SIGUSR1) or - for stdout"`
	BufferLines int    `yaml:"buffer_lines" usage:"lines (and 2 KiB per line of bytes) queued before dropping"`
}

// Telemetry configures metrics and traces (exporters come from OTEL_* variables).
type Telemetry struct {
	TraceSampleRatio float64 `yaml:"trace_sample_ratio" usage:"fraction of requests traced when OTEL_TRACES_EXPORTER=otlp (unset: 1 with OTEL_TRACES_SAMPLER=always_on, else OTEL_TRACES_SAMPLER_ARG if set, else the default)"`
	MetricsLoopback  bool    `yaml:"metrics_loopback_open" usage:"serve /metrics without the admin token to local scrapers (loopback, no Origin, Host an IP, localhost or a *.localhost name)"`
}

// Lifecycle configures the resume of paused sandboxes on traffic, through
// the platform's lifecycle manager (proxy.Config's ResumeAddr, ResumeTimeout).
type Lifecycle struct {
	SidecarAddr   string        `yaml:"sidecar_addr" usage:"host:port of the lifecycle manager: a request to a paused sandbox asks it to resume the sandbox (POST /internal/resume) and is then served; empty = off (503 sandbox_pausing)"`
	ResumeTimeout time.Duration `yaml:"resume_timeout" usage:"longest wait for the lifecycle manager's answer to a resume, after its 2s connect (503 resume_failed after)"`
}

// TLS configures the HTTPS listener's certificates.
type TLS struct {
	Source         string        `yaml:"source" usage:"self_signed, files or acme (unset: files when certificate files are given, else self_signed)"`
	Domain         string        `yaml:"domain" usage:"base domain: self_signed and acme cover it and *.<domain>"`
	CertFile       string        `yaml:"cert_file" usage:"certificate PEM (files source; more pairs under tls.files in YAML)"`
	KeyFile        string        `yaml:"key_file" usage:"key PEM for cert_file"`
	Files          []TLSFile     `yaml:"files"`
	ReloadInterval time.Duration `yaml:"reload_interval" usage:"how often certificate files are re-read (unset: 10s)"`
	RedirectHTTP   bool          `yaml:"redirect_http" usage:"answer plain HTTP with a redirect to HTTPS instead of proxying"`
	RedirectPort   int           `yaml:"redirect_port" usage:"HTTPS port clients reach, named in redirects (0 = https_addr's port; 443 is left out)"`
	ACME           ACME          `yaml:"acme"`
}

// TLSFile is one certificate/key pair.
type TLSFile struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// ACME configures certmagic's ACME issuer.
type ACME struct {
	CA               string  `yaml:"ca" usage:"ACME directory URL (default Let's Encrypt)"`
	Email            string  `yaml:"email" usage:"ACME account email"`
	TrustedRootsFile string  `yaml:"trusted_roots_file" usage:"PEM roots for a private CA's HTTPS endpoint (empty: the system's)"`
	StorageDir       string  `yaml:"storage_dir" usage:"certificate storage (survives restarts; share it between replicas)"`
	SkipWildcard     bool    `yaml:"skip_wildcard" usage:"do not manage *.<domain>; on-demand only"`
	OnDemand         bool    `yaml:"on_demand" usage:"issue per-host certificates for existing sandboxes"`
	OnDemandRate     int     `yaml:"on_demand_rate" usage:"new on-demand issuances per minute (unset: 10)"`
	DNS              ACMEDNS `yaml:"dns"`
	Sync             bool    `yaml:"sync" usage:"wait for the wildcard certificate at startup"`
}

// ACMEDNS configures the DNS-01 solver.
type ACMEDNS struct {
	Provider           string            `yaml:"provider" usage:"libdns provider: rfc2136"`
	Options            map[string]string `yaml:"options"`
	Resolvers          []string          `yaml:"resolvers" usage:"DNS servers used to find the zone and check propagation (empty: the system's)"`
	PropagationTimeout time.Duration     `yaml:"propagation_timeout" usage:"wait for the TXT record (unset: certmagic's default, 2m; negative: skip the check)"`
	PropagationDelay   time.Duration     `yaml:"propagation_delay" usage:"wait before the first propagation check"`
}

// Cache configures the route cache.
type Cache struct {
	Size         int           `yaml:"size" usage:"cached routes"`
	NegativeSize int           `yaml:"negative_size" usage:"cached unknown ids"`
	TTLMin       time.Duration `yaml:"ttl_min" usage:"shortest route TTL"`
	TTLMax       time.Duration `yaml:"ttl_max" usage:"longest route TTL"`
	NegativeTTL  time.Duration `yaml:"negative_ttl" usage:"TTL of an unknown-id entry"`
}

// Upstream configures connections to sandboxes.
type Upstream struct {
	ConnectTimeout        time.Duration `yaml:"connect_timeout" usage:"TCP connect timeout (one retry)"`
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout" usage:"wait for response headers (504 after); a request that accepts text/event-stream (every MCP POST) waits upstream.idle_timeout instead"`
	IdleTimeout           time.Duration `yaml:"idle_timeout" usage:"a stream silent this long is closed"`
	HeartbeatInterval     time.Duration `yaml:"heartbeat_interval" usage:"SSE comment after this much silence (negative = off)"`
	MaxConns              int           `yaml:"max_conns" usage:"connections per sandbox port"`
	IdleConnTimeout       time.Duration `yaml:"idle_conn_timeout" usage:"close unused keep-alive connections after"`
	MaxHeaderSize         int           `yaml:"max_header_size" usage:"largest response header block a sandbox may send (502 above)"`
}

// Client configures the client-facing side.
type Client struct {
	ReadTimeout   time.Duration `yaml:"read_timeout" usage:"TLS handshake + first request headers from the accept, a later request's headers from their first byte"`
	BodyTimeout   time.Duration `yaml:"body_timeout" usage:"longest wait for the next bytes of a request body"`
	WriteTimeout  time.Duration `yaml:"write_timeout" usage:"a client that took nothing of a response being written for this long is cut (renewed by every byte it takes, as nginx send_timeout)"`
	IdleTimeout   time.Duration `yaml:"idle_timeout" usage:"keep-alive idle timeout"`
	MaxHeaderSize int           `yaml:"max_header_size" usage:"largest request header block (431 above)"`
	MaxConns      int           `yaml:"max_conns" usage:"client connections open at once across the traffic listeners, streams and WebSockets included (0 = unlimited; at it, ones waiting for a request are closed for new ones, else 503 proxy_overloaded)"`
}

// Default returns the built-in defaults.
func Default() *Config {
	return &Config{
		HTTPAddr:  ":8081",
		AdminAddr: "127.0.0.1:8082",
		LogFormat: "json",
		LogLevel:  "info",
		Store:     "memory",
		Routes:    "configs/routes.yaml",
		AccessLog: AccessLog{Format: "json", Path: "-"},
	}
}

// EnvPrefix prefixes every environment variable.
const EnvPrefix = "CUBEPROXY_"

// UsageError is a command line the flags cannot read: an unknown flag, a
// value of the wrong type, an argument after the flags. A command exits 2
// for it, as the flag package's ExitOnError does, so a wrapper script can
// tell its own mistake from a setting the proxy refused (exit 1).
type UsageError struct {
	Err error
	// ListFlags is the command line that lists the flags ("cubeproxy
	// serve -h") when a flag is the mistake, for the command to say after
	// the error in place of the list itself; "" otherwise.
	ListFlags string
}

// Error returns the flag package's message, or the stray argument's.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap gives the error, flag.ErrHelp for -h.
func (e *UsageError) Unwrap() error { return e.Err }

// LoadCommand builds the configuration of a command that takes serve's
// flags: defaults, then the file named by --config (or CUBEPROXY_CONFIG),
// then the environment, then flags. It returns flag.ErrHelp when -h was
// given (usage already written to out); command titles the -h usage.
// shown is what -h names as each flag's default: the value in effect when
// the setting is left unset. Most of those are applied to zero values by
// the packages that use them (proxy, routing, certs...), which config, low
// in the import graph, does not import: the binary asks them and passes
// the result. nil shows Default's values.
func LoadCommand(command string, shown *Config, args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	return LoadCommandContext(context.Background(), command, shown, args, getenv, out)
}

// LoadCommandContext is LoadCommand for a command a signal may stop
// (ctx's end) while its config file, a pipe, still waits for its writer:
// the error then wraps ctx's (namedfile.ReadOnceContext).
func LoadCommandContext(ctx context.Context, command string, shown *Config, args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	cfg := Default()
	settings := collect(reflect.ValueOf(cfg).Elem())
	if shown == nil {
		shown = Default()
	}
	defaults := collect(reflect.ValueOf(shown).Elem()) // same order as settings

	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(out) // for -h (ParseFlags)
	configPath := fs.String("config", "", "YAML config file (env "+EnvPrefix+"CONFIG)")
	kinds := map[string]string{"config": "string"}
	fs.Usage = func() { printUsage(fs, kinds) }
	type flagValue struct {
		s   *setting
		raw string
	}
	var flagged []flagValue
	for i := range settings {
		s := &settings[i]
		set := func(v string) error {
			if err := s.set(v); err != nil { // validate early for a clear message
				return err
			}
			if s.v.Kind() == reflect.Slice {
				// A list flag given again adds to the list, as pflag's
				// do: keeping the last alone dropped the others silently.
				for j := range flagged {
					if flagged[j].s == s {
						flagged[j].raw += "," + v
						return nil
					}
				}
			}
			flagged = append(flagged, flagValue{s, v})
			return nil
		}
		if s.v.Kind() == reflect.Bool {
			// --registry-enabled alone means true, as with any Go bool flag.
			fs.BoolFunc(s.flagName(), s.usage+" (env "+s.envName()+")", set)
		} else {
			fs.Func(s.flagName(), s.usage+" (env "+s.envName()+")", set)
		}
		kinds[s.flagName()] = s.kind()
		fs.Lookup(s.flagName()).DefValue = defaults[i].show()
	}
	if err := ParseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, &UsageError{Err: strayArgument(fs, args)}
	}

	path, fromEnv := *configPath, false
	configGiven := false
	fs.Visit(func(f *flag.Flag) { configGiven = configGiven || f.Name == "config" })
	if !configGiven {
		// --config= given empty reads no file, as --routes= empties the
		// routes setting: a container can then run on the environment and
		// flags alone, over the image's CUBEPROXY_CONFIG.
		path, fromEnv = getenv(EnvPrefix+"CONFIG"), true
	}
	if err := checkConfigPath(path, fromEnv); err != nil {
		return nil, err
	}
	// Flags were applied to cfg during parsing; start over in order.
	*cfg = *Default()
	if path != "" {
		if err := decodeFile(ctx, cfg, path); err != nil {
			if fromEnv {
				// The image (or a unit file) sets it: an operator who gave
				// no --config is told where the path came from.
				err = fmt.Errorf("%sCONFIG: %w", EnvPrefix, err)
			}
			return nil, err
		}
	}
	origins := map[string]string{}
	for i := range settings {
		s := &settings[i]
		if v := getenv(s.envName()); v != "" {
			if err := checkBlankEnv(s, v); err != nil {
				return nil, err
			}
			if err := s.set(v); err != nil {
				return nil, fmt.Errorf("%s: %w", s.envName(), err)
			}
			origins[strings.Join(s.path, ".")] = s.envName()
		}
	}
	for _, f := range flagged {
		if err := f.s.set(f.raw); err != nil {
			return nil, fmt.Errorf("--%s: %w", f.s.flagName(), err)
		}
		origins[strings.Join(f.s.path, ".")] = "--" + f.s.flagName()
	}
	cfg.origins = origins
	cfg.file = path
	cfg.foldCase()
	if err := cfg.Validate(); err != nil {
		return nil, cfg.NameOrigins(err)
	}
	return cfg, nil
}

// foldCase spells in lower case each setting that takes one of a few
// words and was given one of them in another case, so that every such
// setting takes its word in any case, as log_level always did (slog reads
// INFO as info) and tls.acme.dns.provider did: log_format: JSON was
// refused where log_level: INFO was not, and store: Redis passed the
// checks of the Redis settings as "not memory", to be refused by serve.
// Lower case is the spelling the proxy compares and check prints. A value
// that is none of the words is left as written, for its refusal (here or
// in the binary) to name as the operator wrote it, with the words. An
// empty value (--log-format=, log_format: "") is spelled as the word the
// proxy reads it as, where it has one: check printed log_format: "" for
// the JSON serve writes.
func (c *Config) foldCase() {
	for _, e := range []struct {
		v     *string
		words []string
		empty string // the word "" means; "" when it means none
	}{
		{&c.LogFormat, []string{"json", "text"}, "json"},
		{&c.LogLevel, []string{"debug", "info", "warn", "error"}, ""},
		{&c.Store, []string{"memory", "redis"}, "memory"},
		{&c.AccessLog.Format, []string{"json", "cube", "off"}, "json"},
		{&c.TLS.Source, []string{"self_signed", "files", "acme"}, ""},
		{&c.TLS.ACME.DNS.Provider, []string{"rfc2136"}, ""},
	} {
		if w := strings.ToLower(*e.v); slices.Contains(e.words, w) {
			*e.v = w
		} else if w == "" {
			*e.v = e.empty
		}
	}
	// An empty access log path is stdout, as "-" is: check printed
	// path: "" for it.
	if c.AccessLog.Path == "" {
		c.AccessLog.Path = "-"
	}
	// rfc2136's net option, which certs reads folded too: check printed
	// net: TCP as written.
	if n, ok := c.TLS.ACME.DNS.Options["net"]; ok && c.TLS.ACME.DNS.Provider == "rfc2136" {
		if w := strings.ToLower(n); w == "udp" || w == "tcp" {
			c.TLS.ACME.DNS.Options["net"] = w
		}
	}
}

// checkConfigPath refuses a config file path (from --config, or
// CUBEPROXY_CONFIG when fromEnv) that is blank or has blanks around it,
// as checkBlanks and checkBlankEnv refuse any other path setting so
// written: a template's trailing space or a manifest's line end failed on
// "stat cubeproxy.yaml : no such file or directory", whose blank no
// terminal shows, for a file the operator could see was there.
func checkConfigPath(path string, fromEnv bool) error {
	if path == "" || strings.TrimSpace(path) == path {
		return nil
	}
	if fromEnv {
		if strings.TrimSpace(path) == "" {
			return fmt.Errorf("%sCONFIG: %q is blank: an empty variable counts as unset; unset %sCONFIG to read no file, or name the file", EnvPrefix, path, EnvPrefix)
		}
		return fmt.Errorf("%sCONFIG: %q has blanks around it, which would be taken as part of the path; write the path alone", EnvPrefix, path)
	}
	if strings.TrimSpace(path) == "" {
		return fmt.Errorf("--config %q is blank: name the file, or give --config= to read none", path)
	}
	return fmt.Errorf("--config %q has blanks around it, which would be taken as part of the path; write the path alone", path)
}

// checkBlankEnv refuses a variable of only blanks, or a list of only
// blank entries. An empty variable counts as unset and leaves the file's
// value; these emptied it instead: CUBEPROXY_DOMAINS="," let every domain
// through where the file named one, without a word.
func checkBlankEnv(s *setting, v string) error {
	what := "is blank"
	if strings.TrimSpace(v) != "" {
		if s.v.Kind() != reflect.Slice {
			return nil
		}
		for p := range strings.SplitSeq(v, ",") { // as set splits it
			if strings.TrimSpace(p) != "" {
				return nil
			}
		}
		what = "has no entries"
	}
	// Only strings and lists have an empty value a flag takes: a number,
	// duration or boolean flag refuses --name=, so advising it sent the
	// operator from one refusal to another.
	if k := s.v.Kind(); k != reflect.String && k != reflect.Slice {
		return fmt.Errorf("%s: %q %s: an empty variable counts as unset, and %s takes no empty value; unset %s for the file's value or the default, or give it a value",
			s.envName(), v, what, strings.Join(s.path, "."), s.envName())
	}
	return fmt.Errorf("%s: %q %s: an empty variable counts as unset; to empty %s, use --%s= or the file",
		s.envName(), v, what, strings.Join(s.path, "."), s.flagName())
}

// strayArgument is the error for the first argument parsing stopped at.
// After a boolean flag, a value written with a space (--reuse-port false)
// is such an argument: the flag takes none, so the message says how to
// give one rather than leave the operator to wonder what "false" was.
func strayArgument(fs *flag.FlagSet, args []string) error {
	i := len(args) - fs.NArg() - 1 // the argument before it
	if mayHoldSecret(args[:i+1], fs.Arg(0)) {
		return errors.New("unexpected argument (not shown: it may be part of a secret); a value with spaces is one argument only when quoted")
	}
	err := fmt.Errorf("unexpected argument %q", fs.Arg(0))
	if i < 0 {
		return err
	}
	name := strings.TrimLeft(args[i], "-")
	if f := fs.Lookup(name); f != nil && !strings.Contains(name, "=") {
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			if _, berr := ParseBool(fs.Arg(0)); berr == nil {
				return fmt.Errorf("%w: --%s is a boolean flag and takes its value after \"=\" (--%s=%s)", err, name, name, fs.Arg(0))
			}
		}
	}
	return err
}

// mayHoldSecret reports whether the stray argument arg, after before,
// may be part of a secret: it follows a secret's flag (--admin-token= s3c,
// or an unquoted value with a space), or it sets a secret by name, as a
// variable written as an argument (CUBEPROXY_ADMIN_TOKEN=s3c).
func mayHoldSecret(before []string, arg string) bool {
	secretFlag := func(a string) (bool, bool) { // a secret's flag; its value given with it
		name, value, withValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			return false, false
		}
		for _, k := range secretKeys {
			if name == strings.ReplaceAll(strings.ReplaceAll(k, ".", "-"), "_", "-") {
				return true, withValue || value != ""
			}
		}
		return false, false
	}
	n := len(before)
	if n > 0 {
		if ok, _ := secretFlag(before[n-1]); ok {
			return true
		}
	}
	if n > 1 {
		if ok, withValue := secretFlag(before[n-2]); ok && !withValue {
			return true // the flag, its value, then this
		}
	}
	name, _, ok := strings.Cut(arg, "=")
	if !ok {
		return false
	}
	name = strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(strings.TrimLeft(name, "-"), EnvPrefix), "-", "_"))
	for _, k := range secretKeys {
		if name == strings.ReplaceAll(k, ".", "_") || name == strings.ToLower(EnvPrefix)+strings.ReplaceAll(k, ".", "_") {
			return true
		}
	}
	return false
}

// ParseFlags parses a command's flags from args into fs. -h (or -help)
// writes fs's usage to its output and returns a *UsageError wrapping
// flag.ErrHelp. Any other mistake (a flag not defined, a value not of its
// kind, a flag missing its value) is a *UsageError naming the flag most
// likely meant and how to list the flags, and nothing is written: the
// flag package wrote its error and then every flag (190 lines for serve),
// which buried the error the command then reported again under them.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage() // asked for: the list, on the output the command chose
		return &UsageError{Err: err}
	}
	return &UsageError{Err: withFlagHint(fs, err), ListFlags: fs.Name() + " -h"}
}

// withFlagHint adds to an unknown flag's error (from fs.Parse) the flag
// of fs most likely meant (Suggest): the YAML key's spelling (--http_addr
// for --http-addr), one within a few typos, or the one flag it cuts short
// or ends (--trace-sample-ratio, its section left out), or the two it
// fits (--max-conns: the client's or the upstream's). The flags are a
// hundred, and a subcommand's few are still mistyped.
func withFlagHint(fs *flag.FlagSet, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	fits := Suggest(name, names)
	if len(fits) == 0 {
		return err
	}
	return fmt.Errorf("%w (did you mean --%s?)", err, strings.Join(fits, " or --"))
}

// Suggest returns the names (one, or two) that word (a mistyped command
// or flag name, dashes before it ignored) most likely meant, or none when
// none is close enough to name: a far-fetched hint sends the operator
// after the wrong thing. Case is ignored and "_" read as "-" (a YAML
// key's spelling). The nearest name within a few typos is taken first;
// failing that, the names word cuts short or runs past ("serv",
// "healthz"), or, for a word of two parts or more, the names it ends
// ("trace-sample-ratio" for telemetry-trace-sample-ratio), when they are
// one or two: "max-conns" names client-max-conns and upstream-max-conns,
// both a likely meaning, but a word that fits three or more ("admin")
// says too little to name any. Words under three letters get none.
func Suggest(word string, names []string) []string {
	w := strings.ReplaceAll(strings.ToLower(strings.TrimLeft(word, "-")), "_", "-")
	if len(w) < 3 {
		return nil
	}
	best, bestDist := "", max(2, len(w)/4)+1
	for _, n := range names {
		if d := editDistance(w, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	if best != "" {
		return []string{best}
	}
	var fits []string
	for _, n := range names {
		// A one-word suffix ("port", "addr") would send a --port meant
		// for http_addr to --tls-redirect-port.
		if strings.HasPrefix(n, w) || strings.HasPrefix(w, n) || strings.Contains(w, "-") && strings.HasSuffix(n, "-"+w) {
			fits = append(fits, n)
		}
	}
	if len(fits) > 2 {
		return nil
	}
	return fits
}

// decodeFile reads the YAML file at path over cfg. A key that names no
// setting is an error, not a setting silently left at its default, and so
// are a second document, which would be ignored, and a key with no value
// whose default is not empty (checkNulls).
func decodeFile(ctx context.Context, cfg *Config, path string) error {
	data, err := namedfile.ReadOnceContext(ctx, path, namedfile.MaxSmall)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if len(strings.TrimSpace(strings.TrimPrefix(string(data), "\ufeff"))) == 0 {
		// As an empty pipe: a template that failed to render into the
		// file, or a ConfigMap key left empty, would run the defaults.
		return fmt.Errorf("config %s is empty: nothing in it sets anything (a template that failed to render?); for the built-in defaults give no --config, or write a comment in it", path)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, hideDecoderQuote(locateSyntaxError(explainTypeError(err, data), data), data))
	}
	line, err := yamldoc.NextDocument(dec)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, locateSyntaxError(err, data))
	}
	if line > 0 {
		return fmt.Errorf("config %s: line %d: another YAML document after the first (only the first was read); put every setting in one", path, line)
	}
	if err := checkWholeNumbers(data); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := checkNulls(data); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := checkSecretMarks(data); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// negativeMeansOff lists the settings for which a negative value is
// documented (as "off" or "skip"); every other duration and size must be
// zero (the default) or positive.
var negativeMeansOff = map[string]bool{
	"stream_limit_wait":                true,
	"max_held_body":                    true,
	"held_body_per_sandbox":            true,
	"upstream.heartbeat_interval":      true,
	"tls.acme.dns.propagation_timeout": true,
}

// negativeHint says, for a setting whose negative value is refused but
// is how an operator may mean "none", which setting turns it off instead
// (the proxy's own check of the pair, which says so, runs only after this
// one).
var negativeHint = map[string]string{
	"held_body_budget": "to hold no body, set max_held_body to -1",
}

// Validate refuses values a proxy would start with and then fail every
// request on (a negative connect timeout reads as "refused", a negative
// body limit as 413), naming the setting.
func (c *Config) Validate() error {
	for _, check := range []func() error{
		c.checkNumbers, c.checkStore, c.checkRedis, c.checkTLS, c.checkSecrets,
		c.checkListeners, c.checkBuffers, c.checkHostNames, c.checkNodeIP, c.checkInstanceID, c.checkBlanks,
		c.checkLifecycle,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// MaxDuration is the longest duration setting the proxy takes: a year,
// far beyond any useful timeout or TTL, and far below the sums and
// multiples of one that would overflow.
const MaxDuration = 365 * 24 * time.Hour

// MinDuration is the shortest positive duration setting the proxy takes:
// a millisecond, nginx's smallest time unit too.
const MinDuration = time.Millisecond

// checkNumbers refuses a negative duration or size (unless
// negativeMeansOff lists it), a positive duration below MinDuration or
// above MaxDuration, a trace sample
// ratio outside 0..1, and a pair of cache TTLs the cache would refuse.
func (c *Config) checkNumbers() error {
	for _, s := range collect(reflect.ValueOf(c).Elem()) {
		name := strings.Join(s.path, ".")
		switch s.v.Kind() {
		case reflect.Int, reflect.Int64:
			if n := s.v.Int(); n < 0 && !negativeMeansOff[name] {
				shown := strconv.FormatInt(n, 10)
				if s.v.Type() == durationType {
					shown = time.Duration(n).String()
				}
				if hint := negativeHint[name]; hint != "" {
					return fmt.Errorf("%s: %s is negative; %s", name, shown, hint)
				}
				return fmt.Errorf("%s: %s is negative", name, shown)
			}
			if d := time.Duration(s.v.Int()); s.v.Type() == durationType && d > 0 && d < MinDuration {
				// Written for seconds or milliseconds in another unit: a
				// connect, header, read or write timeout this short fails
				// every request (504, 408, or a closed connection), and an
				// interval spins (a heartbeat of 1ns sent a silent SSE
				// client 5 MB/s of comments, at a third of a core).
				return fmt.Errorf("%s: %s is below %s, the shortest duration the proxy takes (0 means the default)", name, d, MinDuration)
			}
			if s.v.Type() == durationType && time.Duration(s.v.Int()) > MaxDuration {
				// Deadlines are now plus a setting, or a multiple of one:
				// near the largest Duration they wrap into the past, and
				// the cache stops caching, a loop spins, with no word.
				return fmt.Errorf("%s: %s is above %s, the longest duration the proxy takes", name, time.Duration(s.v.Int()), MaxDuration)
			}
		}
	}
	if err := checkAdminURL(c.Registry.AdminURL); err != nil {
		return fmt.Errorf("registry.admin_url %q: %w", c.Registry.AdminURL, err)
	}
	if c.Registry.AdminURL != "" && !c.Registry.Enabled {
		// Only the registry entry carries it: an operator who set it
		// expects the lifecycle manager to find this proxy there.
		return errors.New("registry.admin_url is set but registry.enabled is off: nothing announces it; set registry.enabled: true (CUBEPROXY_REGISTRY_ENABLED=true), or remove registry.admin_url")
	}
	if r := c.Telemetry.TraceSampleRatio; !(r >= 0 && r <= 1) {
		return fmt.Errorf("telemetry.trace_sample_ratio: %v is not a fraction between 0 and 1", r)
	}
	if mn, mx := c.Cache.TTLMin, c.Cache.TTLMax; mn > 0 && mx > 0 && mn > mx {
		// Either alone is fine (an unset ttl_max follows ttl_min up).
		return fmt.Errorf("cache.ttl_min (%s) is above cache.ttl_max (%s)", mn, mx)
	}
	if mn, mx := c.Cache.TTLMin, c.Cache.TTLMax; mn == 0 && mx > 0 && mx < routing.DefaultTTLMin {
		// The cache would refuse the pair, naming a minimum nobody set.
		return fmt.Errorf("cache.ttl_max (%s) is below cache.ttl_min's default (%s): set cache.ttl_min too", mx, routing.DefaultTTLMin)
	}
	return nil
}

// checkAdminURL refuses an admin URL the lifecycle manager could not
// call: it appends the admin paths to it ("/admin/state"), so it must be
// an http or https URL with a host, and nothing after its path.
func checkAdminURL(s string) error {
	if s == "" {
		return nil
	}
	// Before the parse: "10.0.0.7:8082" parses to Go's "first path
	// segment in URL cannot contain colon".
	if l := strings.ToLower(s); !strings.HasPrefix(l, "http://") && !strings.HasPrefix(l, "https://") {
		return errors.New("want an http:// or https:// URL, for example http://10.0.0.7:8082")
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return err
	case u.Host == "" || u.Hostname() == "":
		return errors.New("the URL names no host")
	case u.User != nil:
		return errors.New("the URL carries credentials: the lifecycle manager sends admin_token as X-Cube-Admin-Token")
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		return errors.New("the lifecycle manager appends its paths to the URL: it may not end in a query or a fragment")
	}
	return nil
}

// checkStore refuses Redis settings under the memory store.
func (c *Config) checkStore() error {
	if c.Store != "memory" && c.Store != "" {
		return nil
	}
	// The proxy would serve the routes file (often missing: an empty
	// table, every request a 404) and still report itself ready.
	for _, r := range []struct {
		key string
		set bool
	}{
		{"redis.addr", c.Redis.Addr != ""}, {"redis.url", c.Redis.URL != ""},
		{"redis.sentinel.master_name", c.Redis.Sentinel.MasterName != ""}, {"redis.cluster.addrs", len(c.Redis.Cluster.Addrs) > 0},
		// The registry is written to Redis: with the memory store the
		// operator's dashboards would wait for an instance that never
		// announces itself.
		{"registry.enabled", c.Registry.Enabled},
	} {
		if r.set {
			return fmt.Errorf("%s is set but store is memory: set store: redis (CUBEPROXY_STORE=redis) to read routes from Redis, or remove %s", r.key, r.key)
		}
	}
	// The rest of redis: only connects or reads: a password, a db, a key
	// prefix typed for a store that is not used. A value equal to the
	// default is no choice (the shipped cubeproxy.yaml lists them).
	if keys := changedLeaves(reflect.ValueOf(c.Redis.WithDefaults()), reflect.ValueOf(redisstore.Config{}.WithDefaults()), "redis"); len(keys) > 0 {
		return fmt.Errorf("%s is set but store is memory: only the Redis store reads it; set store: redis (CUBEPROXY_STORE=redis), or remove %s", keys[0], keys[0])
	}
	return nil
}

// checkRedis refuses settings of the Redis store that another of its
// settings leaves unread.
func (c *Config) checkRedis() error {
	if c.Store != "redis" {
		return nil
	}
	if c.PersistRoutes {
		// Routes live in Redis, written by the control plane: the file
		// would not be written, and the operator would count on it.
		return errors.New("persist_routes is on but store is redis: only the memory store writes its routes file; remove persist_routes, or set store: memory")
	}
	if err := c.checkRedisAddrs(); err != nil {
		return err
	}
	if err := c.checkRedisURLFields(); err != nil {
		return err
	}
	if sen := c.Redis.Sentinel; sen.MasterName == "" {
		// Without the master name the client is not a Sentinel one: it
		// would connect to redis.addr (or url) and never ask them.
		if keys := changedLeaves(reflect.ValueOf(sen), reflect.ValueOf(redisstore.SentinelConfig{}), "redis.sentinel"); len(keys) > 0 {
			return fmt.Errorf("%s is set but redis.sentinel.master_name is empty: the sentinels would never be asked; set redis.sentinel.master_name (CUBEPROXY_REDIS_SENTINEL_MASTER_NAME), or remove %s", keys[0], keys[0])
		}
	}
	return nil
}

// checkRedisAddrs refuses a Redis address the client could never dial:
// the proxy would start, and stay unready for good, logging the dial's
// error once a second; check would have passed it.
func (c *Config) checkRedisAddrs() error {
	if c.Redis.Addr != "" {
		if err := checkDialAddr(c.Redis.Addr); err != nil {
			return fmt.Errorf("redis.addr %q: %w; want host:port, for example 127.0.0.1:6379", c.Redis.Addr, err)
		}
	}
	for _, list := range []struct {
		key, example string
		addrs        []string
	}{{"redis.sentinel.addrs", "10.0.0.5:26379", c.Redis.Sentinel.Addrs}, {"redis.cluster.addrs", "10.0.0.5:6379", c.Redis.Cluster.Addrs}} {
		for _, a := range list.addrs {
			if err := checkDialAddr(a); err != nil {
				// A sentinel listens on 26379: the data port in the
				// example sent operators to the wrong one.
				return fmt.Errorf("an entry of %s %q: %w; want host:port, for example %s", list.key, a, err, list.example)
			}
		}
	}
	// A password cut by a raw '/', '?' or '#' would be quoted below as the
	// host ("u:0" of "u:0/s3cret@r").
	if err := redisstore.CheckURL(c.Redis.URL); err != nil {
		return err
	}
	// The URL's port only: the rest is go-redis's to parse, and its error
	// masks the password. Only the host is named here, for the same reason.
	if u, err := url.Parse(c.Redis.URL); c.Redis.URL != "" && err == nil {
		if u.Port() != "" { // go-redis dials 6379 without one
			if err := checkDialAddr(u.Host); err != nil {
				return fmt.Errorf("redis.url: host %q: %w", u.Host, err)
			}
		}
	}
	return nil
}

// checkRedisURLFields refuses a redis.db, username or password that
// redis.url says otherwise: the client takes the URL's user, password and
// db and fills from the fields only what the URL leaves out, so the field
// was never read (or, for a db 0 the URL names, the URL's was not), with
// no word. Secrets are not shown.
func (c *Config) checkRedisURLFields() error {
	if c.Redis.URL == "" {
		return nil
	}
	opt, err := redis.ParseURL(c.Redis.URL)
	u, uerr := url.Parse(c.Redis.URL)
	if err != nil || uerr != nil {
		return nil // refused where the client is built, its userinfo masked
	}
	// A db is named by the path (redis://h/2), or by ?db= (unix://, and
	// redis:// too, where it wins over the path).
	dbs := u.Query()["db"]
	namesDB := len(dbs) > 0 && dbs[len(dbs)-1] != "" || !strings.EqualFold(u.Scheme, "unix") && strings.Trim(u.Path, "/") != ""
	switch r := c.Redis; {
	case namesDB && r.DB != 0 && r.DB != opt.DB:
		return fmt.Errorf("redis.db (%d) and the db redis.url names (%d) differ: only one is used; remove redis.db, or the db from redis.url", r.DB, opt.DB)
	case r.Username != "" && opt.Username != "" && r.Username != opt.Username:
		return errors.New("redis.username is set and redis.url names another user: only the URL's is sent; remove redis.username, or the user from redis.url (not shown: the URL's userinfo may be a secret)")
	case r.Password != "" && opt.Password != "" && r.Password != opt.Password:
		return errors.New("redis.password is set and redis.url carries another password: only the URL's is sent; remove redis.password, or the password from redis.url (not shown: secrets)")
	}
	return nil
}

// checkLifecycle refuses a lifecycle manager address the proxy could
// never dial: every paused sandbox would answer 503 resume_failed, with
// nothing at startup to say why.
func (c *Config) checkLifecycle() error {
	a := c.Lifecycle.SidecarAddr
	if a == "" {
		return nil
	}
	if strings.Contains(a, "/") {
		// The platform's CUBE_SIDECAR_NGX_ADDR is host:port too; the
		// scheme is http and the path /internal/resume.
		return fmt.Errorf("lifecycle.sidecar_addr %q: want host:port, without scheme or path, for example 127.0.0.1:8083", a)
	}
	if err := checkDialAddr(a); err != nil {
		return fmt.Errorf("lifecycle.sidecar_addr %q: %w; want host:port, for example 127.0.0.1:8083", a, err)
	}
	return nil
}

// checkDialAddr refuses an address net.Dial("tcp", addr) would refuse for
// its form alone: no port, port 0, or a port that is neither a number up
// to 65535 nor a service name. A host that does not resolve is left to the
// dial, which retries: it may resolve later.
func checkDialAddr(addr string) error {
	if err := checkListenAddr(addr); err != nil {
		return err
	}
	if _, port, _ := net.SplitHostPort(addr); listenPort(port) == 0 { // empty or zero: checked above
		return fmt.Errorf("port %s cannot be dialed", cmp.Or(port, "0"))
	}
	return nil
}

// isEmpty reports whether v is its type's zero value, or an empty list
// or map (as YAML's [] and {} decode).
func isEmpty(v reflect.Value) bool {
	if k := v.Kind(); k == reflect.Slice || k == reflect.Map {
		return v.Len() == 0
	}
	return v.IsZero()
}

// changedLeaves lists, in declaration order, the YAML paths (under
// prefix) of the leaves of struct v that differ from base's.
func changedLeaves(v, base reflect.Value, prefix string) []string {
	var out []string
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + "." + name
		fv, fb := v.Field(i), base.Field(i)
		if fv.Kind() == reflect.Struct {
			out = append(out, changedLeaves(fv, fb, path)...)
			continue
		}
		if isEmpty(fv) && isEmpty(fb) {
			continue // an empty list or map is no change from nil
		}
		if !reflect.DeepEqual(fv.Interface(), fb.Interface()) {
			out = append(out, path)
		}
	}
	return out
}

// checkTLS refuses a tls: section the HTTPS listener would not serve as
// written.
func (c *Config) checkTLS() error {
	switch c.TLS.Source {
	case "", "self_signed", "files", "acme":
	default:
		// Checked here, not only where HTTPS starts: a misspelled source
		// would otherwise pass unnoticed until https_addr is set.
		return fmt.Errorf("tls.source %q: want self_signed, files or acme", c.TLS.Source)
	}
	if src := c.TLS.Source; src != "" && src != "files" {
		// Only the files source reads them: HTTPS would serve a
		// self-signed (or ACME) certificate instead of the operator's.
		for _, f := range []struct {
			key string
			set bool
		}{{"tls.cert_file", c.TLS.CertFile != ""}, {"tls.key_file", c.TLS.KeyFile != ""}, {"tls.files", len(c.TLS.Files) > 0}} {
			if f.set {
				return fmt.Errorf("%s is set but tls.source is %s: set tls.source: files (CUBEPROXY_TLS_SOURCE=files) to serve it, or remove %s", f.key, src, f.key)
			}
		}
	}
	// The start would fail on "open : no such file or directory", naming
	// no setting.
	if err := checkPair("tls.cert_file", "tls.key_file", c.TLS.CertFile, c.TLS.KeyFile); err != nil {
		return err
	}
	for i, f := range c.TLS.Files {
		at := fmt.Sprintf("tls.files[%d].", i)
		if f.CertFile == "" && f.KeyFile == "" {
			return fmt.Errorf("%scert_file and %skey_file are empty", at, at)
		}
		if err := checkPair(at+"cert_file", at+"key_file", f.CertFile, f.KeyFile); err != nil {
			return err
		}
	}
	if c.TLS.Source == "files" && c.TLS.CertFile == "" && c.TLS.KeyFile == "" && len(c.TLS.Files) == 0 {
		// The start failed on "tls certificates: files source needs at
		// least one cert/key pair", naming no setting to write it in.
		return errors.New("tls.source is files but no certificate file is named: set tls.cert_file and tls.key_file (CUBEPROXY_TLS_CERT_FILE, CUBEPROXY_TLS_KEY_FILE), or list pairs under tls.files")
	}
	if err := c.checkTLSApplies(); err != nil {
		return err
	}
	if err := c.checkDNSAddrs(); err != nil {
		return err
	}
	if src := c.TLS.Source; c.HTTPSAddr == "" && (src == "files" || src == "acme") {
		// Only the HTTPS listener reads certificates: the proxy would
		// serve plain HTTP alone, and ACME would never issue, with no
		// word why. (self_signed, the default, is in every example.)
		return fmt.Errorf("tls.source is %s but https_addr is empty: no listener would serve TLS; set https_addr (CUBEPROXY_HTTPS_ADDR, for example :8080), or remove tls.source", src)
	}
	if c.TLS.RedirectPort > 65535 {
		return fmt.Errorf("tls.redirect_port: %d is not a port", c.TLS.RedirectPort)
	}
	return nil
}

// checkDNSAddrs refuses a DNS-01 server address no dial accepts: it is
// dialed only at the first order, in the background after the proxy
// listens, so every issuance would fail behind a check that passed.
// A resolver without a port is fine (certmagic adds :53); the rfc2136
// server needs one.
func (c *Config) checkDNSAddrs() error {
	dns := c.TLS.ACME.DNS
	for _, r := range dns.Resolvers {
		if _, _, err := net.SplitHostPort(r); err != nil {
			continue
		}
		if err := checkDialAddr(r); err != nil {
			return fmt.Errorf("an entry of tls.acme.dns.resolvers %q: %w; want host or host:port, for example 1.1.1.1:53", r, err)
		}
	}
	if server, ok := dns.Options["server"]; ok && strings.EqualFold(dns.Provider, "rfc2136") {
		if err := checkDialAddr(server); err != nil {
			return fmt.Errorf("tls.acme.dns.options.server %q: %w; want host:port, for example 127.0.0.1:53", server, err)
		}
	}
	return nil
}

// tlsSource is the certificate source in effect and how to name it in
// an error: tls.source, or, unset, files when certificate files are
// named and otherwise self_signed (as the binary resolves it).
func (c *Config) tlsSource() (src, shown string) {
	switch {
	case c.TLS.Source != "":
		return c.TLS.Source, c.TLS.Source
	case c.TLS.CertFile != "" || c.TLS.KeyFile != "" || len(c.TLS.Files) > 0:
		return "files", "unset (files, as certificate files are named)"
	}
	return "self_signed", "unset (self_signed)"
}

// checkTLSApplies refuses tls settings that the source in effect, or the
// listeners, leave unread: an operator who typed them expects them to act.
// Settings under a switch that is off (tls.acme.on_demand_rate without
// on_demand) are left alone: turning a feature off for a while is one
// line. (The binary refuses tls.redirect_http without https_addr, and
// tls.redirect_port without redirect_http.)
func (c *Config) checkTLSApplies() error {
	src, shown := c.tlsSource()
	if src != "acme" {
		// HTTPS would serve a self-signed certificate, or the files',
		// and no ACME account would ever be created or used.
		if keys := changedLeaves(reflect.ValueOf(c.TLS.ACME), reflect.ValueOf(ACME{}), "tls.acme"); len(keys) > 0 {
			return fmt.Errorf("%s is set but tls.source is %s: only the acme source reads tls.acme; set tls.source: acme (CUBEPROXY_TLS_SOURCE=acme), or remove %s", keys[0], shown, keys[0])
		}
	}
	if src != "files" && c.TLS.ReloadInterval != 0 {
		return fmt.Errorf("tls.reload_interval is set but tls.source is %s: only certificate files are re-read; set tls.source: files with the files, or remove tls.reload_interval", shown)
	}
	if dns := c.TLS.ACME.DNS; src == "acme" && dns.Provider == "" {
		// With skip_wildcard no DNS-01 is solved (without it, certs
		// refuses the missing provider itself).
		if keys := changedLeaves(reflect.ValueOf(dns), reflect.ValueOf(ACMEDNS{}), "tls.acme.dns"); len(keys) > 0 {
			return fmt.Errorf("%s is set but tls.acme.dns.provider is empty: no DNS-01 challenge would be solved; set tls.acme.dns.provider (rfc2136), or remove %s", keys[0], keys[0])
		}
	}
	if c.HTTPSAddr == "" && c.TLS.Source == "" && src == "files" {
		// As tls.source: files without https_addr (below), unspelled.
		return errors.New("tls certificate files are named but https_addr is empty: no listener would serve them; set https_addr (CUBEPROXY_HTTPS_ADDR, for example :8080), or remove them")
	}
	return nil
}

// checkSecrets refuses a secret that is a variable reference left as written.
func (c *Config) checkSecrets() error {
	// Neither the file nor the environment is expanded: a reference left
	// as written (${ADMIN_TOKEN}, or a Kubernetes $(ADMIN_TOKEN) naming an
	// undefined variable, which stays as it is) would be the secret
	// itself, one anybody can guess. The value is not shown: a real
	// secret may merely look like a reference, and the error goes to
	// terminals, CI logs and the journal.
	const shape = "has the shape of a reference to an environment variable ($NAME, ${NAME} or $(NAME)), and nothing expands one: it would be the secret itself, one anybody can guess; set %s to the secret's value instead (the value is not shown: it may be the secret)"
	if isEnvReference(c.AdminToken) {
		return fmt.Errorf("admin_token "+shape, EnvPrefix+"ADMIN_TOKEN")
	}
	for i, k := range c.Auth.SigningKeys {
		if isEnvReference(k) {
			return fmt.Errorf("auth.signing_keys: entry %d "+shape, i+1, EnvPrefix+"AUTH_SIGNING_KEYS")
		}
		if strings.TrimSpace(k) != k {
			// The variable's and the flag's list drop them, the file
			// keeps them: two proxies given one key each way (a secret
			// file's trailing newline) refused each other's tokens.
			return fmt.Errorf("auth.signing_keys: entry %d has blanks around it (not shown: a secret), which the file keeps and %sAUTH_SIGNING_KEYS drops, so proxies given the key each way would refuse each other's tokens; write the key alone", i+1, EnvPrefix)
		}
	}
	for _, p := range []struct{ key, val string }{{"redis.password", c.Redis.Password}, {"redis.sentinel.password", c.Redis.Sentinel.Password}} {
		if isEnvReference(p.val) && (strings.HasPrefix(p.val, "$(") || strings.HasPrefix(p.val, "${")) {
			// A reference left as written ($(REDIS_PASSWORD) names a
			// variable Kubernetes did not define, or defined after
			// this one) was sent as the password: WRONGPASS, nothing
			// more. The bare $NAME form is let through: Redis sets its
			// own password, and a generated one may have that shape.
			return fmt.Errorf("%s has the shape of a reference to an environment variable (${NAME} or $(NAME)), and nothing expands one: it would be sent as the password itself (Redis answers WRONGPASS); set %s to the password's value (Kubernetes expands $(NAME) only for a variable defined earlier in the list; the value is not shown: it may be the secret)", p.key, EnvPrefix+strings.ToUpper(strings.NewReplacer(".", "_").Replace(p.key)))
		}
		if strings.TrimSpace(p.val) != p.val {
			// A Kubernetes Secret made from a file (kubectl create
			// secret --from-file) keeps the file's last newline, and
			// the variable it sets hands it on: Redis compared it as
			// part of the password, and the only word was WRONGPASS.
			return fmt.Errorf("%s has blanks around it (not shown: a secret), a line end from a secret file most often, which would be sent as part of the password (Redis answers WRONGPASS); write the password alone", p.key)
		}
	}
	return nil
}

// checkListeners refuses a configuration with no traffic or no admin listener.
func (c *Config) checkListeners() error {
	if c.HTTPAddr == "" && c.HTTPSAddr == "" {
		// Only the admin API would listen: /readyz says ready while no
		// sandbox can be reached.
		return errors.New("http_addr and https_addr are both empty: no listener would serve sandbox traffic; set http_addr (CUBEPROXY_HTTP_ADDR, for example :8081) or https_addr")
	}
	if c.AdminAddr == "" {
		return errors.New("admin_addr is empty: the admin API (health, routes, metrics) needs its own listener, for example 127.0.0.1:8082")
	}
	listeners := []struct{ key, addr, example string }{
		{"http_addr", c.HTTPAddr, ":8081"}, {"https_addr", c.HTTPSAddr, ":8080"}, {"admin_addr", c.AdminAddr, "127.0.0.1:8082"},
		{"metrics_addr", c.MetricsAddr, "127.0.0.1:18082"},
	}
	for _, l := range listeners {
		if l.addr == "" {
			continue
		}
		// serve would fail on net.Listen's "missing port in address",
		// naming no setting, and check would have passed it.
		if err := checkListenAddr(l.addr); err != nil {
			return fmt.Errorf("%s %q: %w; want host:port, for example %s", l.key, l.addr, err, l.example)
		}
	}
	// Two listeners on one port of overlapping addresses: without
	// reuse_port the second bind fails ("address already in use", naming
	// no setting, after check passed it); with reuse_port both bind and
	// the kernel hands each connection to either one, so sandbox traffic
	// would reach the admin API, which never shares a listener with it, or
	// plain HTTP the TLS listener.
	for i, a := range listeners {
		for _, b := range listeners[i+1:] {
			if a.addr != "" && b.addr != "" && sameListenAddr(a.addr, b.addr) {
				return fmt.Errorf("%s %q and %s %q are the same address: each listener needs its own port", a.key, a.addr, b.key, b.addr)
			}
		}
	}
	return nil
}

// sameListenAddr reports whether two listener addresses (checked by
// checkListenAddr) would bind one port on overlapping addresses: the same
// port, and hosts that are equal or where one is a wildcard (an empty
// host, 0.0.0.0, ::ffff:0.0.0.0 or ::, which Go binds dual-stack) or
// localhost next to 127.0.0.1, the address Go binds for it. Port 0 is a port the system
// chooses: never shared. Two different host names are not resolved, and
// are left to the bind.
func sameListenAddr(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, nb := listenPort(pa), listenPort(pb)
	if na == 0 || na != nb {
		return false
	}
	ha = strings.TrimSuffix(strings.ToLower(ha), ".")
	hb = strings.TrimSuffix(strings.ToLower(hb), ".")
	ipa, errA := netip.ParseAddr(ha)
	ipb, errB := netip.ParseAddr(hb)
	switch {
	case ha == "" || hb == "" || errA == nil && ipa.Unmap().IsUnspecified() || errB == nil && ipb.Unmap().IsUnspecified():
		// ::ffff:0.0.0.0 too: Go binds it as the wildcard.
		return true
	case errA == nil && errB == nil:
		return ipa.Unmap() == ipb.Unmap()
	case errA == nil:
		return hb == "localhost" && ipa.Unmap() == netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case errB == nil:
		return ha == "localhost" && ipb.Unmap() == netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return ha == hb
}

// listenPort is the number of a listener's port (a number or a service
// name), 0 when the system chooses it or it is unknown.
func listenPort(port string) int {
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		return int(n)
	}
	if port == "" {
		return 0
	}
	n, err := net.LookupPort("tcp", port)
	if err != nil {
		return 0
	}
	return n
}

// checkListenAddr refuses an address net.Listen("tcp", addr) would refuse
// for its form alone: no port, or a port that is neither a number up to
// 65535 nor a service name. A host that does not resolve, or is not
// local, is left to the listen itself.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "" { // as ":0", a port the system chooses
		return nil
	}
	if n, err := strconv.ParseUint(port, 10, 64); err == nil {
		if n > 65535 {
			return fmt.Errorf("port %s is above 65535", port)
		}
		return nil
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("port %q is no number and no known service", port)
	}
	return nil
}

// checkBuffers bounds what is allocated per connection or at startup.
func (c *Config) checkBuffers() error {
	// A header limit this small would answer every request with 431 or
	// every response with 502; 0 is the default (its own per key). One this large is
	// a buffer allocated whole for every connection: the first request
	// would take the process down out of memory.
	for _, hs := range []struct {
		key string
		n   int
		def string // the default 0 stands for (proxy.ServerConfig, proxy.Config)
	}{{"client.max_header_size", c.Client.MaxHeaderSize, "32 KiB"}, {"upstream.max_header_size", c.Upstream.MaxHeaderSize, "16 KiB"}} {
		if hs.n > 0 && hs.n < minHeaderSize {
			return fmt.Errorf("%s: %d is below %d bytes, too small for real headers (0 means the %s default)", hs.key, hs.n, minHeaderSize, hs.def)
		}
		if hs.n > maxHeaderSize {
			return fmt.Errorf("%s: %d is above %d bytes (1 MiB), the largest buffer allowed per connection", hs.key, hs.n, maxHeaderSize)
		}
	}
	// The queue is allocated at startup; full, this many lines already
	// hold hundreds of MiB.
	if n := c.AccessLog.BufferLines; n > maxBufferLines {
		return fmt.Errorf("access_log.buffer_lines: %d is above %d", n, maxBufferLines)
	}
	return nil
}

// checkHostNames refuses host-name settings no Host header could match.
func (c *Config) checkHostNames() error {
	for _, names := range []struct {
		key      string
		list     []string
		wildcard bool
	}{
		{"domains", c.Domains, true},
		{"shared_hosts", c.SharedHosts, false},
		{"tls.domain", []string{c.TLS.Domain}, false},
	} {
		for i, n := range names.list {
			// The parser skips an entry that names nothing: a domains list
			// of only such entries (a template that rendered nothing,
			// domains: ["{{ .Values.domain }}"]) let every domain through.
			if names.key != "tls.domain" && strings.TrimSpace(n) == "" {
				return fmt.Errorf("%s: entry %d is empty (a template that rendered nothing?): it would be skipped, and a domains list with no name lets every domain through; write the name, or remove the entry", names.key, i+1)
			}
			if n != "" && hostNameOf(n, names.wildcard) == "" {
				if names.key == "tls.domain" { // one name, not a list's entry
					return fmt.Errorf("%s: %q names no domain; write the name, or remove it", names.key, n)
				}
				return fmt.Errorf("%s: entry %d (%q) names no domain; write the name, or remove the entry", names.key, i+1, n)
			}
			if !isHostName(n, names.wildcard) {
				err := fmt.Errorf("%s: %q is not a bare host name (no port, scheme, path or address): it would match no request", names.key, n)
				if names.key != "tls.domain" && strings.ContainsAny(strings.TrimSpace(n), " \t;") {
					// Two names, as a variable written space- or
					// semicolon-separated gives them.
					err = fmt.Errorf("%w; a list is comma-separated (a.app,b.app)", err)
				}
				return err
			}
		}
	}
	return nil
}

// checkNodeIP refuses a node_ip that is no address, one with an IPv6
// zone, or the unspecified address (0.0.0.0, ::, ::ffff:0.0.0.0, "every
// address" to a listener): node_ip is compared with each route's HostIP, which may carry
// no zone and is never unspecified, so it would never match, and every
// route on this node would be dialed through its host port instead of its
// SandboxIP, with no word.
func (c *Config) checkNodeIP() error {
	if c.NodeIP == "" {
		return nil
	}
	addr, err := netip.ParseAddr(c.NodeIP)
	if err != nil {
		return fmt.Errorf("node_ip %q: %w", c.NodeIP, err)
	}
	// Unmapped as the proxy reads it: ::ffff:0.0.0.0 is 0.0.0.0.
	if addr.Unmap().IsUnspecified() {
		return fmt.Errorf("node_ip %q: the unspecified address is no route's HostIP, so no route on this node would be dialed through its SandboxIP; set the address the routes name as HostIP (this node's own)", c.NodeIP)
	}
	if zone := addr.Zone(); zone != "" {
		return fmt.Errorf("node_ip %q: an IPv6 zone (%%%s) never equals a route's HostIP, which carries none, so routes on this node would be dialed through their host port instead of SandboxIP; set the address the routes name as HostIP, without a zone", c.NodeIP, zone)
	}
	return nil
}

// checkInstanceID refuses an instance_id that is blank, has blanks around
// it or holds a control character: the name is shown in /admin/healthz,
// the registry's entry and the traces' service.instance.id, where " "
// names no instance and "proxy-1\n" is not the proxy-1 a dashboard looks
// for. (Unset, it is the hostname.)
func (c *Config) checkInstanceID() error {
	id := c.InstanceID
	if id == "" {
		return nil
	}
	if strings.TrimSpace(id) == "" {
		return fmt.Errorf("instance_id %q is blank: it would name no instance; write the name, or remove instance_id for the hostname", id)
	}
	if strings.TrimSpace(id) != id || strings.IndexFunc(id, unicode.IsControl) >= 0 {
		return fmt.Errorf("instance_id %q has blanks around it or a control character; write the name alone", id)
	}
	return nil
}

// trimmedKeys are the string settings read without the blanks around
// them (host names, as the parser compares them), and so left alone by
// checkBlanks.
var trimmedKeys = map[string]bool{"domains": true, "shared_hosts": true, "tls.domain": true}

// checkBlanks refuses a string setting, or an entry of a list, with blanks
// around it (a template's trailing space, a value copied with its
// newline): every one is taken as written, blanks and all, where it is a
// path or a Redis name. routes: "routes.yaml " started an empty table,
// every request a 404, behind a check that passed with a warning; an
// access_log.path so written logged to a file logrotate never names.
// Secrets are left to their own checks, and never quoted.
func (c *Config) checkBlanks() error {
	for _, s := range collect(reflect.ValueOf(c).Elem()) {
		name := strings.Join(s.path, ".")
		if trimmedKeys[name] || isSecretPath(s.path) {
			continue
		}
		var values []string
		switch {
		case s.v.Kind() == reflect.String:
			values = []string{s.v.String()}
		case s.v.Kind() == reflect.Slice && s.v.Type().Elem().Kind() == reflect.String:
			values = s.v.Interface().([]string)
		}
		for _, v := range values {
			if v != "" && strings.TrimSpace(v) != v {
				return fmt.Errorf("%s %q has blanks around it, which would be taken as part of it; write the value alone", name, v)
			}
		}
	}
	for i, f := range c.TLS.Files {
		for _, v := range []struct{ key, val string }{{"cert_file", f.CertFile}, {"key_file", f.KeyFile}} {
			if strings.TrimSpace(v.val) != v.val {
				return fmt.Errorf("tls.files[%d].%s %q has blanks around it, which would be taken as part of it; write the value alone", i, v.key, v.val)
			}
		}
	}
	// The DNS provider's options, a map collect does not list: a server
	// " 127.0.0.1:53" or a key_name with a trailing blank passed, to fail
	// every issuance at the first order, after the proxy listened.
	// key_secret is base64, whose decoding skips line ends (a secret
	// file's last newline worked), and the provider refuses any other
	// blank in it as no base64.
	for _, k := range slices.Sorted(maps.Keys(c.TLS.ACME.DNS.Options)) {
		if v := c.TLS.ACME.DNS.Options[k]; k != "key_secret" && strings.TrimSpace(v) != v {
			return fmt.Errorf("tls.acme.dns.options.%s has blanks around it (not shown: the options may hold a secret), which would be taken as part of it; write the value alone", k)
		}
	}
	return nil
}

// checkPair refuses a certificate/key pair with one half missing, naming
// the settings (certKey, keyKey).
func checkPair(certKey, keyKey, certFile, keyFile string) error {
	switch {
	case certFile != "" && keyFile == "":
		return fmt.Errorf("%s is set but %s is empty: a certificate needs its key", certKey, keyKey)
	case certFile == "" && keyFile != "":
		return fmt.Errorf("%s is set but %s is empty: a key needs its certificate", keyKey, certKey)
	}
	return nil
}

// Bounds of the header limits: a browser's request head alone is often
// larger than the minimum; the maximum is 32 times the client's default
// and 64 times the upstream's.
const (
	minHeaderSize = 1024
	maxHeaderSize = 1 << 20
)

// maxBufferLines bounds access_log.buffer_lines (256 times the default).
const maxBufferLines = 1 << 20

// hostNameOf is s as the parser compares it: without surrounding space,
// a trailing dot, or (wildcard) a leading "*." or ".".
func hostNameOf(s string, wildcard bool) string {
	s = strings.TrimSuffix(strings.TrimSpace(s), ".")
	if wildcard {
		s = strings.TrimPrefix(strings.TrimPrefix(s, "*."), ".")
	}
	return s
}

// isHostName reports whether s is empty or a DNS name, optionally behind
// "*." or ".". Entries are compared with the Host header's name, its port
// stripped, so "gw.example.com:8081" or "https://gw.example.com" would
// silently never match. IP literals are always shared hosts and need no
// entry; IPv4 ones pass (they are names by this syntax), IPv6 ones do not.
func isHostName(s string, wildcard bool) bool {
	s = hostNameOf(s, wildcard)
	if s == "" {
		return true
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return false
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// isEnvReference reports whether s is a shell or Kubernetes reference to
// a variable, whole: $NAME, ${NAME} or $(NAME).
func isEnvReference(s string) bool {
	name, ok := strings.CutPrefix(s, "$")
	if !ok {
		return false
	}
	if inner, ok := strings.CutPrefix(name, "{"); ok {
		name, ok = strings.CutSuffix(inner, "}")
		if !ok {
			return false
		}
	} else if inner, ok := strings.CutPrefix(name, "("); ok {
		name, ok = strings.CutSuffix(inner, ")")
		if !ok {
			return false
		}
	}
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ParseBool reads a boolean from the environment or a flag (serve's, and
// the other commands', health's --live). It takes the
// words the YAML file takes for a boolean setting (the decoder keeps YAML
// 1.1's yes/no/on/off for a bool field, and y/n), so that
// persist_routes: on in the file, as an nginx operator writes it, is also
// CUBEPROXY_PERSIST_ROUTES=on and --persist-routes=on, where it was an
// error; and Go's own spellings (1/0, t/f), which the environment always
// took.
func ParseBool(raw string) (bool, error) {
	switch strings.ToLower(raw) {
	case "yes", "y", "on":
		return true, nil
	case "no", "n", "off":
		return false, nil
	}
	b, err := strconv.ParseBool(raw)
	if err != nil {
		return false, fmt.Errorf("invalid boolean %q: want true or false (yes/no and on/off work too)", raw)
	}
	return b, nil
}

// setting is one leaf of Config reachable by path.
type setting struct {
	path  []string // YAML names from the root
	usage string
	v     reflect.Value
}

func (s *setting) flagName() string { return strings.ReplaceAll(strings.Join(s.path, "-"), "_", "-") }
func (s *setting) envName() string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(strings.Join(s.path, "_"), "-", "_"))
}

// collect lists the leaves of v (a struct) in declaration order.
func collect(v reflect.Value) []setting {
	var out []setting
	var walk func(v reflect.Value, path []string)
	walk = func(v reflect.Value, path []string) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			p := append(append([]string(nil), path...), name)
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct {
				walk(fv, p)
				continue
			}
			if !supported(fv) {
				continue // YAML only (lists of structs, for example)
			}
			out = append(out, setting{path: p, usage: f.Tag.Get("usage"), v: fv})
		}
	}
	walk(v, nil)
	return out
}

var durationType = reflect.TypeOf(time.Duration(0))

func supported(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
		return true
	case reflect.Slice:
		k := v.Type().Elem().Kind()
		return k == reflect.String || k == reflect.Int
	}
	return false
}

// set parses raw into the setting's field.
func (s *setting) set(raw string) error {
	v := s.v
	switch {
	case v.Type() == durationType:
		d, err := time.ParseDuration(raw)
		if err != nil {
			if p := rangeProblem(v.Type(), raw); p != "" {
				return fmt.Errorf("%q %s", raw, p)
			}
			// Worded as the file's error is: Go's "invalid duration" alone
			// left "--drain-timeout 30" to guess that the unit was missing.
			return fmt.Errorf("invalid duration %q: want a duration with its unit (30s, 5m, 2h)", raw)
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(raw)
	case v.Kind() == reflect.Bool:
		b, err := ParseBool(raw)
		if err != nil {
			return err
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			if p := rangeProblem(v.Type(), raw); p != "" {
				return fmt.Errorf("%q %s", raw, p)
			}
			// Worded as the file's error is: the bare "invalid integer"
			// left 1e5 or 64k to guess what would do.
			return fmt.Errorf("invalid integer %q: want a whole number in decimal digits (268435456, not 256MiB or 1e5)", raw)
		}
		v.SetInt(n)
	case v.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("invalid number %q: want a number such as 0.25", raw)
		}
		v.SetFloat(f)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		var parts []string
		for _, p := range strings.Split(raw, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
		v.Set(reflect.ValueOf(parts))
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Int:
		var parts []int
		for _, p := range strings.Split(raw, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			n, err := strconv.Atoi(p)
			if err != nil {
				if rp := rangeProblem(v.Type().Elem(), p); rp != "" {
					return fmt.Errorf("%q %s", p, rp)
				}
				return fmt.Errorf("invalid integer %q: want whole numbers, comma-separated (80,443)", p)
			}
			parts = append(parts, n)
		}
		v.Set(reflect.ValueOf(parts))
	default:
		return fmt.Errorf("unsupported setting type %s", v.Type())
	}
	return nil
}

// durationSyntaxRE matches what time.ParseDuration reads, whatever the
// size: a duration it refuses that matches is too large to hold.
var durationSyntaxRE = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// rangeProblem says why raw, written as a value of type t takes but
// refused, was refused when it is only too large for Go to hold (a
// duration beyond ≈292 years, a number beyond 64 bits); "" otherwise.
// The errors for a malformed value ("want a duration with its unit")
// were wrong about these.
func rangeProblem(t reflect.Type, raw string) string {
	switch {
	case t == durationType:
		if !durationSyntaxRE.MatchString(raw) {
			return ""
		}
		if strings.HasPrefix(raw, "-") {
			return "is out of range (a duration holds at most " + time.Duration(math.MaxInt64).Truncate(time.Hour).String() + " either way)"
		}
		return fmt.Sprintf("is above %s, the longest duration the proxy takes", MaxDuration)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		if _, err := strconv.ParseInt(raw, 10, t.Bits()); errors.Is(err, strconv.ErrRange) {
			return fmt.Sprintf("is out of range: at most %d", int64(1)<<(t.Bits()-1)-1)
		}
	}
	return ""
}
