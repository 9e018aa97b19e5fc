package proxy

import (
	"errors"
	"fmt"
	"net"

	"github.com/valyala/fasthttp"
)

// ServeMetrics serves GET /metrics alone, without the admin token, on ln
// (metrics_addr): the platform proxy's metrics listener
// (CUBE_PROXY_METRICS_LISTEN), for a scraper that holds no token and must
// not reach the admin API. It is served as the admin listener is: it
// answers through the drain, has its own reserve of descriptors for a
// process out of them, and closes with the admin listener.
func (s *Server) ServeMetrics(ln net.Listener) error {
	if s.metricsSrv == nil {
		return errors.New("no admin API configured")
	}
	if !s.admit(ln, true) {
		return nil
	}
	if err := s.metricsSrv.Serve(s.retrying(ln).withReserve()); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve metrics %s: %w", ln.Addr(), err)
	}
	return nil
}

// metricsServer is the fasthttp server of the metrics listener: the admin
// server's settings, with its own handler and Expect judgement, and the
// body limit of a caller without the admin token for every request. A
// server of its own because that limit cannot be chosen per connection
// (HeaderReceived sees the head alone): on the admin API's, a head there
// got the admin limit with the token or when none is configured, 1 MiB
// allocated for a declared body from any host on the scrapers' network,
// where nothing takes a body. Its own connections, unwrapped, also keep
// the TCP connection's CloseWrite, which the lingering close of a refusal
// needs.
func metricsServer(cfg ServerConfig, admin *Admin, log fasthttpLogger) *fasthttp.Server {
	srv := adminServer(cfg, admin, log)
	srv.Handler = admin.metricsHandler
	srv.ExpectHandler = admin.metricsExpect
	srv.HeaderReceived = nil
	srv.MaxRequestBodySize = maxTokenlessAdminBody
	return srv
}

// serveMetricsOnly answers a request on the metrics listener: the scrape,
// or a JSON error naming what the listener serves. No admin endpoint,
// health check included, answers there, as none does on the platform's.
func (a *Admin) serveMetricsOnly(ctx *fasthttp.RequestCtx, path string) {
	switch {
	case path != "/metrics" || a.metrics == nil:
		adminError(ctx, 404, "this listener (metrics_addr) serves only GET /metrics; the admin API is on admin_addr")
	case !ctx.IsGet() && !ctx.IsHead():
		ctx.Response.Header.Set("Allow", "GET, HEAD")
		adminError(ctx, 405, "method not allowed: /metrics takes GET, HEAD")
	default:
		a.metrics(ctx)
	}
}
