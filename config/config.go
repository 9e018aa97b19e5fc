// Package config loads CubeProxy's configuration: a YAML file, overridden
// by CUBEPROXY_* environment variables, overridden by command-line flags.
// Every setting has all three spellings, derived from its YAML path:
// upstream.connect_timeout is --upstream-connect-timeout and
// CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration. The YAML names are the contract
// (configs/cubeproxy.yaml documents each).
type Config struct {
	HTTPAddr   string `yaml:"http_addr" usage:"sandbox traffic listener (plain HTTP)"`
	HTTPSAddr  string `yaml:"https_addr" usage:"sandbox traffic listener (TLS); empty = off"`
	AdminAddr  string `yaml:"admin_addr" usage:"admin API listener (never shared with traffic)"`
	AdminToken string `yaml:"admin_token" usage:"X-Cube-Admin-Token for the admin API; empty = loopback only"`

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

	Cache    Cache    `yaml:"cache"`
	Upstream Upstream `yaml:"upstream"`
	Client   Client   `yaml:"client"`
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
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout" usage:"wait for response headers (504 after)"`
	IdleTimeout           time.Duration `yaml:"idle_timeout" usage:"a stream silent this long is closed"`
	HeartbeatInterval     time.Duration `yaml:"heartbeat_interval" usage:"SSE comment after this much silence (negative = off)"`
	MaxConns              int           `yaml:"max_conns" usage:"connections per sandbox port"`
	IdleConnTimeout       time.Duration `yaml:"idle_conn_timeout" usage:"close unused keep-alive connections after"`
}

// Client configures the client-facing side.
type Client struct {
	ReadTimeout   time.Duration `yaml:"read_timeout" usage:"TLS handshake + request headers"`
	BodyTimeout   time.Duration `yaml:"body_timeout" usage:"reading a request body"`
	WriteTimeout  time.Duration `yaml:"write_timeout" usage:"client must accept each response piece within"`
	IdleTimeout   time.Duration `yaml:"idle_timeout" usage:"keep-alive idle timeout"`
	MaxHeaderSize int           `yaml:"max_header_size" usage:"largest request header block (431 above)"`
}

// Default returns the built-in defaults.
func Default() *Config {
	return &Config{
		HTTPAddr:  ":8081",
		AdminAddr: "127.0.0.1:8082",
		LogFormat: "json",
		LogLevel:  "info",
		Store:     "memory",
	}
}

// EnvPrefix prefixes every environment variable.
const EnvPrefix = "CUBEPROXY_"

// Load builds the configuration: defaults, then the file named by
// --config (or CUBEPROXY_CONFIG), then the environment, then flags.
// It returns flag.ErrHelp when -h was given (usage already written to out).
func Load(args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	cfg := Default()
	settings := collect(reflect.ValueOf(cfg).Elem())

	fs := flag.NewFlagSet("cubeproxy serve", flag.ContinueOnError)
	fs.SetOutput(out)
	configPath := fs.String("config", "", "YAML config file (env "+EnvPrefix+"CONFIG)")
	type flagValue struct {
		s   *setting
		raw string
	}
	var flagged []flagValue
	for i := range settings {
		s := &settings[i]
		fs.Func(s.flagName(), s.usage+" (env "+s.envName()+")", func(v string) error {
			if err := s.set(v); err != nil { // validate early for a clear message
				return err
			}
			flagged = append(flagged, flagValue{s, v})
			return nil
		})
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	path := *configPath
	if path == "" {
		path = getenv(EnvPrefix + "CONFIG")
	}
	// Flags were applied to cfg during parsing; start over in order.
	*cfg = *Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	for i := range settings {
		s := &settings[i]
		if v := getenv(s.envName()); v != "" {
			if err := s.set(v); err != nil {
				return nil, fmt.Errorf("%s: %w", s.envName(), err)
			}
		}
	}
	for _, f := range flagged {
		if err := f.s.set(f.raw); err != nil {
			return nil, fmt.Errorf("--%s: %w", f.s.flagName(), err)
		}
	}
	return cfg, nil
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
			return fmt.Errorf("invalid duration %q", raw)
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(raw)
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return fmt.Errorf("invalid boolean %q", raw)
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("invalid integer %q", raw)
		}
		v.SetInt(n)
	case v.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("invalid number %q", raw)
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
				return fmt.Errorf("invalid integer %q", p)
			}
			parts = append(parts, n)
		}
		v.Set(reflect.ValueOf(parts))
	default:
		return fmt.Errorf("unsupported setting type %s", v.Type())
	}
	return nil
}
