package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/certs"
	"github.com/cube-sandbox/cubeproxy/config"
	"github.com/cube-sandbox/cubeproxy/internal/testenv"
	"github.com/cube-sandbox/cubeproxy/proxy"
	"github.com/cube-sandbox/cubeproxy/routing"
	"github.com/cube-sandbox/cubeproxy/routing/redisstore"
	"github.com/valyala/fasthttp"
)

// allowCertificate's refusals decide the handshake's alert: a name that is
// no sandbox's port wraps certs.ErrUnknownName (unrecognized_name), while
// a route store that cannot answer must not (internal_error), since the
// name may well be a sandbox's and the client should retry, not give up
// on the name.
func TestAllowCertificateTellsUnknownNamesFromStoreFailures(t *testing.T) {
	mem := routing.NewMemoryStore()
	if err := mem.Put(&routing.Route{ID: "abc", HostIP: netip.MustParseAddr("127.0.0.1"), Public: true,
		Ports: map[uint16]uint16{50005: 50005}}); err != nil {
		t.Fatal(err)
	}
	// A Redis that refuses connections: a real client against a port
	// nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	dead, err := redisstore.Open(redisstore.Config{Addr: deadAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })

	cfg := &config.Config{}
	cfg.TLS.Domain = "cube.test"
	appWith := func(s routing.Store) *app {
		c, err := routing.NewCache(s, routing.CacheConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return &app{cfg: cfg, cache: c}
	}
	tests := []struct {
		name    string
		store   routing.Store
		host    string
		wantErr bool
		unknown bool
	}{
		{"exposed port of a sandbox", mem, "50005-abc.cube.test", false, false},
		{"unknown sandbox", mem, "50005-nobody.cube.test", true, true},
		{"port not exposed", mem, "50006-abc.cube.test", true, true},
		{"other domain", mem, "50005-abc.elsewhere.test", true, true},
		{"leading zero", mem, "050005-abc.cube.test", true, true},
		{"route store down", dead, "50005-abc.cube.test", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := appWith(tt.store).allowCertificate(context.Background(), tt.host)
			if (err != nil) != tt.wantErr {
				t.Fatalf("allowCertificate(%s) = %v, want an error: %v", tt.host, err, tt.wantErr)
			}
			if got := errors.Is(err, certs.ErrUnknownName); got != tt.unknown {
				t.Fatalf("allowCertificate(%s) = %v: wraps ErrUnknownName %v, want %v", tt.host, err, got, tt.unknown)
			}
		})
	}
}

// A port exposed after its sandbox's route was cached (written to the
// store without an announcement, as the control plane does) gets its
// certificate once the route is read again, as a request to it does:
// refused until the entry's TTL, the handshake failed for minutes.
func TestAllowCertificateForPortExposedLater(t *testing.T) {
	mem := routing.NewMemoryStore()
	route := func(ports map[uint16]uint16) {
		if err := mem.Put(&routing.Route{ID: "abc", HostIP: netip.MustParseAddr("127.0.0.1"), Public: true, Ports: ports}); err != nil {
			t.Fatal(err)
		}
	}
	route(map[uint16]uint16{50005: 50005})
	now := time.Now()
	c, err := routing.NewCache(mem, routing.CacheConfig{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := &config.Config{}
	cfg.TLS.Domain = "cube.test"
	a := &app{cfg: cfg, cache: c}
	if err := a.allowCertificate(context.Background(), "3000-abc.cube.test"); !errors.Is(err, certs.ErrUnknownName) {
		t.Fatalf("before the port is exposed: %v, want ErrUnknownName", err)
	}
	route(map[uint16]uint16{50005: 50005, 3000: 3000})
	now = now.Add(routing.DefaultNegativeTTL)
	if err := a.allowCertificate(context.Background(), "3000-abc.cube.test"); err != nil {
		t.Fatalf("after: %v, want the certificate allowed", err)
	}
}

// On the node that runs the sandbox (node_ip) any container port is
// served, at the sandbox's own address, mapped or not (as on the
// platform's proxy), so its name gets a certificate as well: a mapped
// port's as off the node, an unmapped one's only while something accepts
// connections there (else every port of a known id would place an order).
// A route there without a SandboxIP serves none, and on another node only
// the mapped ports are served. SandboxIP is loopback: real listeners and
// a real refused connect.
func TestAllowCertificateOnThisNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	listening := ln.Addr().(*net.TCPAddr).Port
	closed := testenv.RefusingPort(t) // bound, not listening, until the test ends

	mem := routing.NewMemoryStore()
	for _, r := range []*routing.Route{
		// Port 1 is mapped; nothing listens at 127.0.0.1:1.
		{ID: "here", HostIP: netip.MustParseAddr("10.0.0.1"), SandboxIP: netip.MustParseAddr("127.0.0.1"), Public: true, Ports: map[uint16]uint16{1: 20080}},
		{ID: "nosandboxip", HostIP: netip.MustParseAddr("10.0.0.1"), Public: true, Ports: map[uint16]uint16{1: 20080}},
		{ID: "there", HostIP: netip.MustParseAddr("10.0.0.9"), SandboxIP: netip.MustParseAddr("127.0.0.1"), Public: true, Ports: map[uint16]uint16{1: 20080}},
	} {
		if err := mem.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	c, err := routing.NewCache(mem, routing.CacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := &config.Config{NodeIP: "10.0.0.1"}
	cfg.TLS.Domain = "cube.test"
	a := &app{cfg: cfg, cache: c}
	for _, tt := range []struct {
		host    string
		allowed bool
	}{
		{fmt.Sprintf("%d-here.cube.test", listening), true},
		{fmt.Sprintf("%d-here.cube.test", closed), false},
		{"1-here.cube.test", true},
		{fmt.Sprintf("%d-nosandboxip.cube.test", listening), false},
		{fmt.Sprintf("%d-there.cube.test", listening), false},
		{"1-there.cube.test", true},
	} {
		err := a.allowCertificate(context.Background(), tt.host)
		if (err == nil) != tt.allowed || err != nil && !errors.Is(err, certs.ErrUnknownName) {
			t.Errorf("allowCertificate(%s) = %v, want allowed %v", tt.host, err, tt.allowed)
		}
	}
}

// A paused (or pausing) sandbox on this node accepts no connection on any
// port, yet it is the very sandbox a request resumes
// (lifecycle.sidecar_addr) or answers 503 sandbox_pausing with
// Retry-After: the certificate of its unmapped port, refused for a port
// that accepts nothing, failed the handshake (unrecognized_name) before
// any request, after a restart or once the hourly sweep had dropped it,
// so HTTPS traffic never resumed it. Its name is allowed while the pause
// lasts, and refused again once it runs with nothing listening.
func TestAllowCertificatePausedOnThisNode(t *testing.T) {
	closed := testenv.RefusingPort(t) // bound, not listening, until the test ends
	mem := routing.NewMemoryStore()
	if err := mem.Put(&routing.Route{ID: "sleepy", HostIP: netip.MustParseAddr("10.0.0.1"), SandboxIP: netip.MustParseAddr("127.0.0.1"), Public: true}); err != nil {
		t.Fatal(err)
	}
	c, err := routing.NewCache(mem, routing.CacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p, err := proxy.New(proxy.Config{NodeIP: netip.MustParseAddr("10.0.0.1"), Logger: slog.New(slog.DiscardHandler)}, c)
	if err != nil {
		t.Fatal(err)
	}
	admin := proxy.NewAdmin(proxy.AdminConfig{Token: "tok"}, p)
	setState := func(state string) {
		t.Helper()
		var req fasthttp.Request
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("/admin/state")
		req.Header.Set("X-Cube-Admin-Token", "tok")
		req.SetBodyString(`{"sandbox_id":"sleepy","state":"` + state + `"}`)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil)
		admin.Handler(&ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusOK {
			t.Fatalf("POST /admin/state %s: %d %s", state, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	cfg := &config.Config{NodeIP: "10.0.0.1"}
	cfg.TLS.Domain = "cube.test"
	a := &app{cfg: cfg, cache: c, proxy: p}
	host := fmt.Sprintf("%d-sleepy.cube.test", closed)
	for _, tt := range []struct {
		state   string
		allowed bool
	}{{"paused", true}, {"pausing", true}, {"running", false}} {
		setState(tt.state)
		err := a.allowCertificate(context.Background(), host)
		if (err == nil) != tt.allowed || err != nil && !errors.Is(err, certs.ErrUnknownName) {
			t.Errorf("%s: allowCertificate(%s) = %v, want allowed %v", tt.state, host, err, tt.allowed)
		}
	}
}
