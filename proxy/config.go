package proxy

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cube-sandbox/cubeproxy/accesslog"
	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/telemetry"
)

// Config is everything the proxy needs; cmd/cubeproxy fills it from the
// config file, the environment and flags.
type Config struct {
	// NodeIP is this node's IP. A route whose HostIP equals it is served by
	// dialing SandboxIP:<container port> directly; any other route is
	// served through HostIP:<mapped host port>.
	NodeIP netip.Addr

	// Parser selects shared hosts and allowed domains.
	Parser routing.ParserConfig

	// MaxRequestBodySize caps a request body (default 256 MiB); larger
	// bodies get 413. Bodies stream, so this bounds bytes, not memory.
	MaxRequestBodySize int64

	// ConnectTimeout bounds one TCP connect to a backend (default 3 s); a
	// failed connect is retried once.
	ConnectTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the backend's response
	// headers after the request was sent (default 120 s; 504 after it). A
	// request that accepts an event stream waits IdleStreamTimeout instead,
	// if longer (see Proxy.headerTimeout).
	ResponseHeaderTimeout time.Duration
	// IdleStreamTimeout ends a body or WebSocket that carried no data for
	// this long (default 7206 s, as the platform's proxy).
	IdleStreamTimeout time.Duration
	// HeartbeatInterval is how long an SSE stream may be silent before the
	// proxy writes an SSE comment line (default 30 s; negative = off).
	// Without it a client that went away is only noticed on the next write.
	HeartbeatInterval time.Duration

	// MaxConnsPerUpstream bounds connections to one sandbox port (default
	// 1024). Each open stream holds one.
	MaxConnsPerUpstream int
	// UpstreamIdleConnTimeout closes keep-alive connections unused this long (default 30 s).
	UpstreamIdleConnTimeout time.Duration
	// UpstreamReadBufferSize is the largest response header block a
	// backend may send (default 16 KiB, the platform proxy's
	// proxy_buffer_size). Only its touched part costs memory.
	UpstreamReadBufferSize int

	// MaxStreamsPerSandbox bounds concurrent requests to one sandbox (0 = unlimited); above it: 429.
	MaxStreamsPerSandbox int
	// StreamLimitWait is how long a request over MaxStreamsPerSandbox
	// waits for a slot to free before its 429 (see Proxy.waitForSlot).
	// MCP clients (the go-sdk's connect, the TypeScript SDK's every call)
	// send their next request as soon as a result's event arrives, before
	// the gateway has ended that answer's stream, so the next request
	// finds the last one's slot still taken for the millisecond or so the
	// stream's end takes to reach the proxy. Default 100 ms: ample for that
	// end on a loaded machine (a GC pause, the race detector's slowdown, a
	// busy scheduler) while a tenth of the 429's Retry-After, and what a
	// flood of refused requests costs is bounded by it: a waiting request
	// holds no slot, no sandbox connection and no lock, only its handler
	// goroutine and its client connection (one request at a time, so at
	// most client.max_conns wait). Negative: no wait, the 429 at once.
	StreamLimitWait time.Duration
	// MaxHeldBody is the largest POST body the proxy reads whole into
	// memory, over MaxStreamsPerSandbox, to see whether it is only JSON-RPC
	// notifications and responses, which pass the limit (see
	// Proxy.overLimit). Default 4 MiB: an MCP agent's answer to a sampling
	// request carries the model's text or a base64 image, larger than the
	// 8 KiB fasthttp reads before the handler, and refused, the tool call
	// that waits for it holds its slot until a timeout; 4 MiB is also the
	// largest body a go-sdk gateway takes by default. Larger bodies get
	// the 429. Negative: only bodies fasthttp read before the handler are
	// judged. Never more than MaxRequestBodySize.
	MaxHeldBody int64
	// HeldBodyBudget bounds the bytes of such bodies held at once, across
	// all sandboxes (default 64 MiB, sixteen bodies at the cap): a body that
	// would take more gets the 429 without being read. It bounds what the
	// limit's exception costs in memory however many sandboxes are at
	// their limit. Never less than MaxHeldBody, and never negative
	// (CheckHeldBodies): a negative MaxHeldBody is how none is held.
	HeldBodyBudget int64
	// HeldBodyPerSandbox bounds the bytes of such bodies held at once for
	// one sandbox: its share of HeldBodyBudget. The room for a body is
	// taken before its bytes arrive and kept while they come (a slow
	// client may send one byte per client.body_timeout), so without a
	// share one sandbox's clients at a limit of 16 or more could hold the
	// whole budget, and every other sandbox's large answers would get the
	// 429. Default: a quarter of HeldBodyBudget, never less than one
	// MaxHeldBody (so that a body at the cap always fits a sandbox that
	// holds nothing else; one set below it is refused, CheckHeldBodies).
	// Negative: no share, a sandbox may hold all of HeldBodyBudget.
	HeldBodyPerSandbox int64

	// ResumeAddr is the lifecycle manager's host:port (the platform's
	// sidecar). A request to a paused sandbox asks it to resume the
	// sandbox and is served once it did (see resumer). Empty: off, the
	// request gets 503 sandbox_pausing and the control plane resumes.
	ResumeAddr string
	// ResumeTimeout bounds the wait for the lifecycle manager's answer to
	// a resume, after its 2 s connect (default 30 s, the platform's
	// proxy_read_timeout for it); 503 resume_failed after.
	ResumeTimeout time.Duration

	// Signer verifies signed browser tokens (?cube_token= and the cookie it
	// is traded for); nil disables them.
	Signer *auth.Signer
	// ExemptPorts skip the traffic-token check (empty by default).
	ExemptPorts []uint16

	// Telemetry records metrics and traces; nil records nothing.
	Telemetry *telemetry.Telemetry
	// AccessLog receives one line per finished request; nil disables it.
	AccessLog *accesslog.Logger

	// InstanceID names this proxy instance (GET /admin/healthz); generated
	// request ids use a random per-process prefix instead.
	InstanceID string

	// Logger receives operational logs (never token values). Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at the default New
// applies, so that the binary can show (serve -h, cubeproxy check) the
// values the proxy will use without keeping a copy of them.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

// CheckHeldBodies refuses bounds on the bodies held over
// MaxStreamsPerSandbox (see Proxy.overLimit) under which a body allowed by
// MaxHeldBody could never be held, naming the settings (max_held_body,
// held_body_budget, held_body_per_sandbox) as an operator sets them: a
// body larger than HeldBodyBudget, or than one sandbox's share of it,
// would get the 429 unread, whatever else is held. The defaults are
// applied first, so that a value set beside one left unset is judged
// against the default in effect.
func (c Config) CheckHeldBodies() error {
	written := c.MaxHeldBody
	c.setDefaults()
	// The body bound as the operator wrote it: one above max_request_body
	// is taken as that, and a refusal quoting only the figure it was
	// taken as named a number found in no file.
	heldBody := fmt.Sprintf("%d bytes", c.MaxHeldBody)
	if written > c.MaxHeldBody {
		heldBody = fmt.Sprintf("%d bytes, taken as max_request_body's %d", written, c.MaxHeldBody)
	}
	if c.HeldBodyBudget < 0 {
		return fmt.Errorf("held_body_budget: %d is negative; to hold no body, set max_held_body to -1", c.HeldBodyBudget)
	}
	if c.MaxHeldBody <= 0 {
		return nil // off: nothing is held
	}
	if c.MaxHeldBody > c.HeldBodyBudget {
		return fmt.Errorf("max_held_body (%s) is above held_body_budget (%d bytes): a body that large could never be held; lower max_held_body or raise held_body_budget", heldBody, c.HeldBodyBudget)
	}
	if c.HeldBodyPerSandbox > 0 && c.HeldBodyPerSandbox < c.MaxHeldBody {
		return fmt.Errorf("held_body_per_sandbox (%d bytes) is below max_held_body (%s): a body that large would never fit one sandbox's share; raise it, lower max_held_body, or leave it unset (a quarter of held_body_budget, at least max_held_body)", c.HeldBodyPerSandbox, heldBody)
	}
	return nil
}

// Config returns the configuration the proxy runs with, defaults applied.
func (p *Proxy) Config() Config { return p.cfg }

func (c *Config) setDefaults() {
	// Routes hold IPv4-mapped addresses as IPv4 (routing.ParseRoute): so
	// must node_ip, or "::ffff:10.0.0.5" would never be this node.
	c.NodeIP = c.NodeIP.Unmap()
	if c.MaxRequestBodySize == 0 {
		c.MaxRequestBodySize = 256 << 20
	}
	if c.MaxHeldBody == 0 {
		c.MaxHeldBody = 4 << 20
	}
	if c.HeldBodyBudget == 0 {
		c.HeldBodyBudget = 64 << 20
	}
	if c.MaxRequestBodySize > 0 && c.MaxHeldBody > c.MaxRequestBodySize {
		// A body over max_request_body is refused anyway.
		c.MaxHeldBody = c.MaxRequestBodySize
	}
	if c.HeldBodyPerSandbox == 0 {
		// After MaxHeldBody's clamp: a share derived from a cap no body
		// reaches would be larger than the policy says.
		c.HeldBodyPerSandbox = max(c.HeldBodyBudget/4, c.MaxHeldBody)
	}
	if c.StreamLimitWait == 0 {
		c.StreamLimitWait = 100 * time.Millisecond
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 3 * time.Second
	}
	if c.ResponseHeaderTimeout == 0 {
		c.ResponseHeaderTimeout = 120 * time.Second
	}
	if c.IdleStreamTimeout == 0 {
		c.IdleStreamTimeout = 7206 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 30 * time.Second
	}
	if c.MaxConnsPerUpstream == 0 {
		c.MaxConnsPerUpstream = 1024
	}
	if c.UpstreamIdleConnTimeout == 0 {
		c.UpstreamIdleConnTimeout = 30 * time.Second
	}
	if c.UpstreamReadBufferSize == 0 {
		c.UpstreamReadBufferSize = 16 << 10
	}
	if c.ResumeTimeout == 0 {
		c.ResumeTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}
