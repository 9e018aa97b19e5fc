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
// not reach the admin API. The admin API's server serves it, so it
// answers through the drain, has its own reserve of descriptors for a
// process out of them, and closes with the admin listener.
func (s *Server) ServeMetrics(ln net.Listener) error {
	if s.adminSrv == nil {
		return errors.New("no admin API configured")
	}
	if err := s.adminSrv.Serve(metricsListener{s.retrying(ln).withReserve()}); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve metrics %s: %w", ln.Addr(), err)
	}
	return nil
}

// metricsListener marks its connections as the metrics listener's, which
// the admin API's handler serves with serveMetricsOnly.
type metricsListener struct{ net.Listener }

func (l metricsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return metricsConn{c}, nil
}

// metricsConn is a connection of the metrics listener.
type metricsConn struct{ net.Conn }

// onMetricsListener reports whether ctx came on the metrics listener.
func onMetricsListener(ctx *fasthttp.RequestCtx) bool {
	_, ok := ctx.Conn().(metricsConn)
	return ok
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
