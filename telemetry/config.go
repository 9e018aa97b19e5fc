package telemetry

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http/httpproxy"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// Default sampling ratios.
const (
	DefaultSampleRatio = 0.01 // OTLP export: 1 % of traces
	testSampleRatio    = 1.0  // injected SpanExporter: every trace
)

// Config configures New.
type Config struct {
	// TraceSampleRatio is the fraction of traces sampled, in (0, 1]. Zero means
	// 1 with OTEL_TRACES_SAMPLER=always_on, else OTEL_TRACES_SAMPLER_ARG if
	// set, else DefaultSampleRatio (1 with an injected SpanExporter). The
	// client's sampled flag never decides.
	TraceSampleRatio float64
	ServiceName      string // resource service.name; default "cubeproxy"
	ServiceVersion   string // resource service.version; omitted when empty
	InstanceID       string // resource service.instance.id; omitted when empty
	// Env reads OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_PROTOCOL,
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_SDK_DISABLED,
	// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG; os.Getenv
	// when nil. The OTLP exporters read their endpoint, headers and TLS
	// variables from the process environment themselves, and the batch
	// span processor's OTEL_BSP_* are read from there too (and checked).
	Env func(string) string
	// SpanExporter, when set, turns tracing on and exports every ended span
	// synchronously (tests use tracetest.InMemoryExporter). The OTEL_* exporter
	// variables are then ignored.
	SpanExporter sdktrace.SpanExporter
}

// exporterKind is what the environment asks for.
type exporterKind int

const (
	exporterNone exporterKind = iota
	exporterOTLPHTTP
	exporterOTLPGRPC
)

// traceExporterKind interprets OTEL_TRACES_EXPORTER and the OTLP protocol
// variables. Only "otlp" and "none" are supported; anything else is a
// configuration error rather than silently untraced. OTEL_SDK_DISABLED=true
// and a sampler that samples nothing turn tracing off whatever the
// exporter: set cluster-wide, they say the operator wants no traces.
func traceExporterKind(env func(string) string) (exporterKind, error) {
	// Checked first: switched off, the other settings are not looked at,
	// so that this is how a broken telemetry setup is turned off.
	if tracesOff(env) != "" {
		return exporterNone, nil
	}
	sampler := strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_SAMPLER")))
	if v := strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_EXPORTER"))); v != "otlp" {
		return exporterNone, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only \"otlp\" and \"none\" are supported", v)
	}
	switch sampler {
	case "", "always_on", "parentbased_always_on", "traceidratio", "parentbased_traceidratio":
		// The proxy samples by trace id and never follows a client's
		// sampled flag, so the parent-based names mean the same here.
	default:
		return exporterNone, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: the proxy samples by trace id ratio (telemetry.trace_sample_ratio); "+
			"use traceidratio, always_on or always_off", sampler)
	}
	proto := strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.TrimSpace(env("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	kind := exporterOTLPHTTP
	switch strings.ToLower(proto) {
	case "", "http/protobuf":
	case "grpc":
		kind = exporterOTLPGRPC
	default:
		return exporterNone, fmt.Errorf("OTLP trace protocol %q: only \"http/protobuf\" and \"grpc\" are supported", proto)
	}
	endpoint, err := checkOTLPEndpoint(env)
	if err != nil {
		return exporterNone, err
	}
	if err := checkOTLPProxy(env, endpoint, kind == exporterOTLPGRPC); err != nil {
		return exporterNone, err
	}
	if err := checkOTLPCompression(env); err != nil {
		return exporterNone, err
	}
	if err := checkOTLPHeaders(env, kind == exporterOTLPGRPC); err != nil {
		return exporterNone, err
	}
	return kind, nil
}

// tracesOff says which variable turns traces off ("OTEL_SDK_DISABLED=true",
// "OTEL_TRACES_SAMPLER=always_off", "OTEL_TRACES_EXPORTER unset"), or ""
// when none does: traces are then on, or refused (traceExporterKind).
func tracesOff(env func(string) string) string {
	if v := strings.TrimSpace(env("OTEL_SDK_DISABLED")); strings.EqualFold(v, "true") {
		return "OTEL_SDK_DISABLED=" + v
	}
	switch v := strings.TrimSpace(env("OTEL_TRACES_SAMPLER")); strings.ToLower(v) {
	case "always_off", "parentbased_always_off":
		return "OTEL_TRACES_SAMPLER=" + v
	}
	switch v := strings.TrimSpace(env("OTEL_TRACES_EXPORTER")); strings.ToLower(v) {
	case "":
		return "OTEL_TRACES_EXPORTER unset"
	case "none":
		return "OTEL_TRACES_EXPORTER=" + v
	}
	return ""
}

// checkOTLPHeaders refuses an OTEL_EXPORTER_OTLP_[TRACES_]HEADERS the
// exporters cannot use, saying which entry without its value. They skip
// such an entry with an error line that quotes it: an entry without "="
// (x-api-key:KEY) whole, a value with a bad percent escape (a token
// ending in %) as it is, so the collector's credential went to the
// process log, and every export then failed for the header it lacked. A
// value that decodes to a control character is refused too: the HTTP
// client refused every export with it. A name is shown only up to its
// first character that is not a header name's: an entry whose "=" comes
// after a credential (Authorization:Basic dXNlcjpw==, base64's padding)
// has the credential in its name. With grpc, gRPC's own rules hold too
// (grpcHeaderError): it refused every export otherwise.
func checkOTLPHeaders(env func(string) string, grpc bool) error {
	for _, n := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		v := strings.TrimSpace(env(n))
		if v == "" {
			continue
		}
		for i, entry := range strings.Split(v, ",") {
			if strings.TrimSpace(entry) == "" {
				continue // a trailing comma: nothing the exporter sends
			}
			key, val, ok := strings.Cut(entry, "=")
			key = strings.TrimSpace(key)
			dec, err := url.PathUnescape(val)
			dec = strings.TrimSpace(dec) // as they trim it
			switch {
			case !ok:
				return fmt.Errorf("%s: entry %d has no \"=\": want key=value pairs separated by commas (the entry is not shown: it may hold a credential)", n, i+1)
			case key == "":
				return fmt.Errorf("%s: entry %d has no name before its \"=\"", n, i+1)
			case !httpguts.ValidHeaderFieldName(key):
				bad := strings.IndexFunc(key, func(r rune) bool { return r >= utf8.RuneSelf || !httpguts.IsTokenRune(r) })
				return fmt.Errorf("%s: entry %d: the name %q is followed by %q, which no header name holds (the rest is not shown: it may hold a credential)", n, i+1, key[:bad], firstRune(key[bad:]))
			case err != nil:
				return fmt.Errorf("%s: the value of %q has a bad percent escape (a literal %% is %%25; the value is not shown)", n, key)
			case !httpguts.ValidHeaderFieldValue(dec):
				return fmt.Errorf("%s: the value of %q holds a control character (the value is not shown)", n, key)
			case grpc:
				if err := grpcHeaderError(key, dec); err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
			}
		}
	}
	return nil
}

// grpcHeaderError says why gRPC refuses to send the header key: value, or
// nil. The gRPC client checks every metadata pair before each call and
// fails the call, so every export failed ("rpc error: code = Internal desc
// = header key ... contains value with non-printable ASCII characters")
// while check passed: a name is [0-9a-z-_.] once lower-cased, and a value
// printable ASCII, unless the name ends in -bin (sent base64-encoded).
func grpcHeaderError(key, val string) error {
	key = strings.ToLower(key) // as metadata.New does
	for i := 0; i < len(key); i++ {
		if c := key[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("the name %q holds %q, which gRPC refuses in a name (it takes 0-9, a-z, '-', '_' and '.')", key, string(c))
		}
	}
	if strings.HasSuffix(key, "-bin") {
		return nil
	}
	for i := 0; i < len(val); i++ {
		if val[i] < 0x20 || val[i] > 0x7e {
			return fmt.Errorf("the value of %q is not printable ASCII, which gRPC refuses outside a -bin header (the value is not shown)", key)
		}
	}
	return nil
}

// firstRune is s's first character, or its first byte when that begins no
// valid UTF-8 character.
func firstRune(s string) string {
	_, n := utf8.DecodeRuneInString(s)
	return s[:n]
}

// checkOTLPCompression refuses an OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION
// other than the specification's gzip and none. The exporters compare it
// with "gzip" and send everything else uncompressed, said nowhere: zstd,
// a typo or GZIP exported some ten times the bytes while the operator
// took it for compressed.
func checkOTLPCompression(env func(string) string) error {
	for _, n := range []string{"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		switch v := strings.TrimSpace(env(n)); v {
		case "", "gzip", "none":
		default:
			return fmt.Errorf("%s=%q: want gzip or none, in lower case (the exporter sends anything else uncompressed)", n, v)
		}
	}
	return nil
}

// traceEndpoint returns the trace endpoint variable that is set, and its
// value, trimmed: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT wins over the general
// one. An empty value is the exporter's default.
func traceEndpoint(getenv func(string) string) (name, value string) {
	name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	if value = strings.TrimSpace(getenv(name)); value == "" {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
		value = strings.TrimSpace(getenv(name))
	}
	return name, value
}

// checkOTLPEndpoint refuses a trace endpoint the OTLP exporters cannot
// use: they want an http or https URL (for grpc too). Without its scheme
// (collector:4318, the usual slip) every export failed with "no Host in
// request URL"; an unparsable one was replaced by localhost:4318, said
// only on a plain-text stderr line. The proxy started and check passed
// either way, and no trace ever arrived. It returns the endpoint, nil for
// the exporter's default (a localhost one).
func checkOTLPEndpoint(env func(string) string) (*url.URL, error) {
	name, v := traceEndpoint(env)
	if v == "" {
		// The exporter's default (https://localhost:4318, or 4317), which
		// OTEL_EXPORTER_OTLP_INSECURE=true may make plain HTTP.
		if err := checkOTLPInsecure(env, "", ""); err != nil {
			return nil, err
		}
		return nil, checkOTLPTLSFiles(env, otlpInsecure(env))
	}
	shown := fmt.Sprintf("%s=%q", name, v)
	switch {
	case strings.Contains(v, "@"):
		// Userinfo, maybe a password: the message goes to a log.
		shown = name + " (not shown: it holds an @, as user:password@ would)"
	case strings.ContainsAny(v, "?#"):
		shown = name + " (not shown: it holds a query, as ?api_key= would)"
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: want an http or https URL with a host, as http://collector:4318", shown)
	}
	if u.User != nil {
		// The exporters send to the host alone: the credential never
		// reached the collector, which refused every export.
		return nil, fmt.Errorf("%s: the exporter does not send a URL's user:password@; put the credential in OTEL_EXPORTER_OTLP_HEADERS (Authorization=Basic%%20...)", shown)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		// The exporters send to scheme, host and path alone: a key in the
		// query never reached the collector, which refused every export
		// (401), while check passed.
		return nil, fmt.Errorf("%s: the exporter does not send a URL's query or fragment; put a credential in OTEL_EXPORTER_OTLP_HEADERS (api-key=...)", shown)
	}
	if err := checkOTLPInsecure(env, name, u.Scheme); err != nil {
		return nil, err
	}
	if err := checkOTLPTLSFiles(env, u.Scheme == "http"); err != nil {
		return nil, err
	}
	return u, nil
}

// traceProxy returns the proxy variable the trace exporter reads for
// endpoint (nil: the default one, on localhost), its name and value, the
// proxy as Go reads the value (nil for a value it ignores: one that does
// not parse), and whether the exports go through a proxy at all: the
// variable is set, and neither NO_PROXY exempts the endpoint nor is it
// localhost or a loopback address, which Go never proxies. gRPC reads
// HTTPS_PROXY whatever the endpoint's scheme.
func traceProxy(getenv func(string) string, endpoint *url.URL, grpc bool) (name, value string, proxy *url.URL, used bool) {
	if endpoint == nil {
		return "", "", nil, false
	}
	target := &url.URL{Scheme: endpoint.Scheme, Host: endpoint.Host}
	name, lower := "HTTP_PROXY", "http_proxy"
	if grpc || endpoint.Scheme == "https" {
		target.Scheme, name, lower = "https", "HTTPS_PROXY", "https_proxy"
	}
	if value = getenv(name); value == "" {
		name, value = lower, getenv(lower)
	}
	if value == "" {
		return "", "", nil, false
	}
	cfg := proxyEnv(getenv)
	proxy, _ = cfg.ProxyFunc()(target)
	// Any proxy value will do: this asks only whether Go would use one.
	cfg.HTTPProxy, cfg.HTTPSProxy = "proxy", "proxy"
	p, err := cfg.ProxyFunc()(target)
	return name, value, proxy, err == nil && p != nil
}

// proxyEnv reads the proxy variables from getenv as Go's
// http.ProxyFromEnvironment does: the upper-case name before the
// lower-case one (x/net's httpproxy.FromEnvironment reads them the other
// way round).
func proxyEnv(getenv func(string) string) *httpproxy.Config {
	get := func(upper, lower string) string {
		if v := getenv(upper); v != "" {
			return v
		}
		return getenv(lower)
	}
	return &httpproxy.Config{
		HTTPProxy:  get("HTTP_PROXY", "http_proxy"),
		HTTPSProxy: get("HTTPS_PROXY", "https_proxy"),
		NoProxy:    get("NO_PROXY", "no_proxy"),
		CGI:        getenv("REQUEST_METHOD") != "",
	}
}

// checkOTLPProxy refuses the proxy variable the trace exporter sends its
// exports to endpoint through where the exporter cannot use it as written:
// HTTPS_PROXY for an https endpoint and for gRPC whatever the scheme,
// HTTP_PROXY for an http one, the upper-case name before the lower-case
// one, as Go reads them (gRPC reads them through Go's net/http too). Go
// ignores a value that does not parse as a URL (a password's unescaped %),
// unsaid, and the exports went around the proxy, to a collector an
// egress-locked cluster does not let them reach; one with a scheme that
// does not parse (a password's unescaped #, / or ?) it read as a proxy
// named "http". gRPC speaks plain HTTP CONNECT whatever the proxy's scheme
// (https://, socks5://), and dials 443 when the URL has no port, where Go's
// client dials http's 80. An endpoint that NO_PROXY exempts, or a localhost
// or loopback one, which Go never proxies, is not looked at: the variable
// may be there for another program. The value is never shown: it may hold
// the proxy's password.
func checkOTLPProxy(env func(string) string, endpoint *url.URL, grpc bool) error {
	name, v, _, used := traceProxy(env, endpoint, grpc)
	if !used {
		return nil
	}
	hidden := name + " (not shown: it may hold the proxy's password)"
	p, err := url.Parse(v)
	if err != nil || p.Scheme == "" || p.Host == "" {
		// Go's reading of proxy:3128 and user:pw@proxy:3128: as http://.
		// One that has a scheme already gets a second one, and "http" for
		// a host.
		p, err = url.Parse("http://" + v)
		if err != nil || strings.Contains(v, ":/") {
			return fmt.Errorf("%s does not parse as a proxy URL, which the trace exporter would ignore, sending every export around the proxy, or misread; "+
				"percent-encode a password's %%, #, /, ? and @ (%%25, %%23, %%2F, %%3F, %%40), as http://user:p%%23ss@proxy:3128", hidden)
		}
	}
	switch {
	case p.Hostname() == "":
		return fmt.Errorf("%s names no proxy host", hidden)
	case grpc && p.Scheme != "http":
		return fmt.Errorf("%s is a %s proxy: the gRPC trace exporter speaks only plain HTTP CONNECT to its proxy; use an http:// one, or OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", hidden, p.Scheme)
	case grpc && p.Port() == "":
		return fmt.Errorf("%s has no port: the gRPC trace exporter would dial the proxy on 443, not http's 80; write the port, as http://proxy:3128", hidden)
	case p.Scheme != "http" && p.Scheme != "https" && p.Scheme != "socks5" && p.Scheme != "socks5h":
		return fmt.Errorf("%s is a %s proxy: the trace exporter speaks to http, https, socks5 and socks5h ones", hidden, p.Scheme)
	}
	return nil
}

// otlpInsecure reports whether OTEL_EXPORTER_OTLP_[TRACES_]INSECURE (the
// last set) is true: with no endpoint set, whether the default one is
// plain HTTP.
func otlpInsecure(env func(string) string) bool {
	v := ""
	for _, n := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"} {
		if raw := strings.TrimSpace(env(n)); raw != "" {
			v = raw
		}
	}
	return strings.EqualFold(v, "true")
}

// checkOTLPTLSFiles refuses the exporters' TLS files
// (OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE, _CLIENT_CERTIFICATE and
// _CLIENT_KEY) where they could not use them, or where they would make
// serve refuse to start while check passed: plain says the endpoint is
// plain HTTP. The exporters skip a file they cannot read or parse with
// one error line, and a client certificate without its key (or a key
// without its certificate) without a word, and the proxy then ran with
// every export failing its TLS handshake ("certificate signed by unknown
// authority", "certificate required"). With an http endpoint, a TLS file
// made the OTLP/HTTP exporter refuse to start, which check did not say,
// and the gRPC one speak TLS to a plain port. The files are read as the
// proxy's own are (namedfile: a regular file, at most 4 MiB): the
// exporters' unbounded read of a FIFO hung the start.
func checkOTLPTLSFiles(env func(string) string, plain bool) error {
	var set []string
	for _, n := range []string{"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"} {
		path := strings.TrimSpace(env(n)) // trimmed, as they trim it
		if path == "" {
			continue
		}
		b, err := namedfile.Read(path, namedfile.MaxSmall)
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fmt.Errorf("%s=%q: no PEM certificate in the file", n, path)
		}
		set = append(set, n)
	}
	for _, prefix := range []string{"OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"} {
		certName, keyName := prefix+"CLIENT_CERTIFICATE", prefix+"CLIENT_KEY"
		certPath, keyPath := strings.TrimSpace(env(certName)), strings.TrimSpace(env(keyName))
		switch {
		case certPath == "" && keyPath == "":
			continue
		case certPath == "" || keyPath == "":
			return fmt.Errorf("%s and %s go together: the exporter ignores one set alone, unsaid", certName, keyName)
		}
		certPEM, err := namedfile.Read(certPath, namedfile.MaxSmall)
		if err != nil {
			return fmt.Errorf("%s: %w", certName, err)
		}
		keyPEM, err := namedfile.Read(keyPath, namedfile.MaxSmall)
		if err != nil {
			return fmt.Errorf("%s: %w", keyName, err)
		}
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return fmt.Errorf("%s=%q and %s=%q: %w", certName, certPath, keyName, keyPath, err)
		}
		set = append(set, certName)
	}
	if plain && len(set) > 0 {
		return fmt.Errorf("%s is set while the trace endpoint is plain HTTP: the OTLP/HTTP exporter refuses to start with it and the gRPC one speaks TLS to the plain port; use an https endpoint, or unset it", set[0])
	}
	return nil
}

// checkOTLPInsecure refuses an OTEL_EXPORTER_OTLP_[TRACES_]INSECURE that
// is not a boolean, or that the exporters would turn against the
// endpoint's scheme (endpoint names the variable that set it; none, scheme
// "": the default endpoint, which the variable may make plain HTTP). They take the variable over the scheme (the
// specification leaves the scheme to decide), and read every value but
// "true" as false: OTEL_EXPORTER_OTLP_INSECURE=false, or =1, with an
// http:// endpoint made each export a TLS handshake with a plain-HTTP
// collector, =true with an https:// one plain HTTP to a TLS port, and no
// span ever arrived while check passed.
func checkOTLPInsecure(env func(string) string, endpoint, scheme string) error {
	name, v := "", ""
	for _, n := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"} { // the last set wins
		raw := strings.TrimSpace(env(n))
		if raw == "" {
			continue
		}
		if !strings.EqualFold(raw, "true") && !strings.EqualFold(raw, "false") {
			return fmt.Errorf("%s=%q: want true or false (the exporter reads anything else as false: TLS)", n, raw)
		}
		name, v = n, raw
	}
	if name == "" || scheme == "" {
		return nil
	}
	if insecure := strings.EqualFold(v, "true"); insecure != (scheme == "http") {
		return fmt.Errorf("%s=%s contradicts the %s endpoint in %s: the exporter would follow it and speak %s to the collector; unset it, the scheme says which",
			name, v, scheme, endpoint, map[bool]string{true: "plain HTTP", false: "TLS"}[insecure])
	}
	return nil
}

// SampleRatio is the fraction of traces New samples: TraceSampleRatio, or
// what the environment (Env) and the defaults make of a zero one. The
// binary shows it (serve -h, cubeproxy check) without building a tracer.
func (c Config) SampleRatio() (float64, error) { return c.sampleRatio(c.env()) }

// TracesOff says why c traces nothing, naming the variable that turns
// traces off ("OTEL_TRACES_SAMPLER=always_off"), or "" when it traces (or
// Check refuses its settings). The sample ratio then applies to nothing,
// which cubeproxy check says beside it.
func (c Config) TracesOff() string {
	if c.SpanExporter != nil {
		return ""
	}
	return tracesOff(c.env())
}

// sampleRatio resolves the ratio as documented on Config.TraceSampleRatio.
func (c *Config) sampleRatio(env func(string) string) (float64, error) {
	r := c.TraceSampleRatio
	switch {
	case !(r >= 0 && r <= 1): // NaN too
		return 0, fmt.Errorf("trace sample ratio %v: want a value in (0, 1]", r)
	case r > 0:
		return r, nil
	}
	switch strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_SAMPLER"))) {
	case "always_on", "parentbased_always_on":
		return 1, nil // the spec ignores the argument for these
	}
	if arg := strings.TrimSpace(env("OTEL_TRACES_SAMPLER_ARG")); arg != "" {
		v, err := strconv.ParseFloat(arg, 64)
		// NaN parses and fails no comparison: taken, it sampled every trace.
		if err != nil || !(v >= 0 && v <= 1) {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a number in [0, 1]", arg)
		}
		return v, nil
	}
	if c.SpanExporter != nil {
		return testSampleRatio, nil
	}
	return DefaultSampleRatio, nil
}

// batchSettings are the batch span processor's, from the standard
// OTEL_BSP_* variables.
type batchSettings struct {
	queue, batch   int           // OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE
	delay, timeout time.Duration // OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_EXPORT_TIMEOUT (0: none)
}

// maxBatchQueue is the largest OTEL_BSP_MAX_QUEUE_SIZE taken: the queue is
// allocated whole at start, and a million spans of some 1 KiB each is
// already a gigabyte held for a collector that does not keep up.
const maxBatchQueue = 1 << 20

// readBatchSettings reads the OTEL_BSP_* variables from env, the SDK's
// defaults for those unset, and refuses a value it cannot use. The SDK
// reads them itself without a check: a negative queue or batch size
// panicked at start ("makeslice: cap out of range"), a schedule delay of 0
// or less made its export loop spin (some 70 % of a core with no traffic),
// and a word was replaced by the default, said nowhere.
func readBatchSettings(env func(string) string) (batchSettings, error) {
	s := batchSettings{
		queue:   sdktrace.DefaultMaxQueueSize,
		batch:   sdktrace.DefaultMaxExportBatchSize,
		delay:   sdktrace.DefaultScheduleDelay * time.Millisecond,
		timeout: sdktrace.DefaultExportTimeout * time.Millisecond,
	}
	for _, v := range []struct {
		name     string
		min, max int
		set      func(int)
	}{
		{"OTEL_BSP_MAX_QUEUE_SIZE", 1, maxBatchQueue, func(n int) { s.queue = n }},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1, maxBatchQueue, func(n int) { s.batch = n }},
		{"OTEL_BSP_SCHEDULE_DELAY", 1, math.MaxInt32, func(n int) { s.delay = time.Duration(n) * time.Millisecond }},
		{"OTEL_BSP_EXPORT_TIMEOUT", 0, math.MaxInt32, func(n int) { s.timeout = time.Duration(n) * time.Millisecond }},
	} {
		raw := strings.TrimSpace(env(v.name))
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < v.min || n > v.max {
			return batchSettings{}, fmt.Errorf("%s=%q: want a whole number from %d to %d", v.name, raw, v.min, v.max)
		}
		v.set(n)
	}
	if s.batch > s.queue {
		// As the SDK does: a batch never larger than the queue.
		s.batch = min(sdktrace.DefaultMaxExportBatchSize, s.queue)
	}
	return s, nil
}

// options returns s as the batch span processor's options, which win over
// its own reading of the variables.
func (s batchSettings) options() []sdktrace.BatchSpanProcessorOption {
	return []sdktrace.BatchSpanProcessorOption{
		sdktrace.WithMaxQueueSize(s.queue), sdktrace.WithMaxExportBatchSize(s.batch),
		sdktrace.WithBatchTimeout(s.delay), sdktrace.WithExportTimeout(s.timeout),
	}
}

func (c *Config) env() func(string) string {
	if c.Env != nil {
		return c.Env
	}
	return os.Getenv
}
