package telemetry

import (
	"bytes"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The platform's proxy (its lua/metrics.lua) exports three families for
// the sandbox's envd calls, under names of its own, which dashboards and
// alerts built for it read: cube_proxy_request_total and
// cube_proxy_request_duration_seconds by route, method and result, and
// cube_proxy_inflight_requests by route. They are kept here as there.

// EnvdRoute is the route label of the platform's request metrics: the
// envd calls they count.
type EnvdRoute uint8

// Envd routes. EnvdNone is any other request, which they do not count.
const (
	EnvdNone  EnvdRoute = iota
	EnvdExec            // /process.Process/* (Start, Connect, ...)
	EnvdFiles           // /files (upload and download)
	numEnvdRoutes
)

var envdRouteNames = [numEnvdRoutes]string{"", "sandbox_exec", "sandbox_files"}

// ClassifyEnvd is the envd route of a request whose path (no query) is
// path, as the platform's proxy tells it from its $uri.
func ClassifyEnvd(path []byte) EnvdRoute {
	switch {
	case bytes.HasPrefix(path, []byte(envdExecPrefix)):
		return EnvdExec
	case string(path) == "/files":
		return EnvdFiles
	}
	return EnvdNone
}

// envdExecPrefix begins the path of every envd process call.
const envdExecPrefix = "/process.Process/"

// EnvdMethod is the method label: the platform counts GET and POST alone
// (any other method's request is in flight while it runs, and no more).
type EnvdMethod uint8

// Envd methods.
const (
	EnvdOtherMethod EnvdMethod = iota
	EnvdGET
	EnvdPOST
)

var envdMethodNames = [...]string{"", "GET", "POST"}

// EnvdMethodOf is the label of method.
func EnvdMethodOf(method []byte) EnvdMethod {
	switch string(method) {
	case "GET":
		return EnvdGET
	case "POST":
		return EnvdPOST
	}
	return EnvdOtherMethod
}

// envdResults are the result label values: "success" for a status
// 200-399, "fail" for any other, as the platform's result_from_status.
var envdResults = [2]string{"success", "fail"}

// envdBuckets are the platform's histogram bounds, in seconds.
var envdBuckets = []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192}

// Names and help texts of the platform's families.
const (
	envdRequestsMetric   = "cube_proxy.request" // exported as cube_proxy_request_total
	envdMethodLabel      = "method"
	envdInflightMetric   = "cube_proxy.inflight_requests"
	envdDurationMetric   = "cube_proxy_request_duration_seconds"
	envdDurationHelp     = "CubeProxy request duration in seconds by route, method and result (the platform proxy's family: envd process and file calls)"
	envdRequestsHelp     = "CubeProxy request total by route, method and result (the platform proxy's family: envd process and file calls)"
	envdInflightHelp     = "CubeProxy in-flight requests by route (the platform proxy's family: envd process and file calls)"
	numEnvdCountedMethod = 2 // GET, POST
)

// envdMetrics holds the platform's families.
type envdMetrics struct {
	requests [numEnvdRoutes][numEnvdCountedMethod][2]atomic.Int64
	inflight [numEnvdRoutes]atomic.Int64
	duration [numEnvdRoutes][numEnvdCountedMethod][2]prometheus.Histogram

	requestsObs metric.Int64ObservableCounter
	inflightObs metric.Int64ObservableUpDownCounter
	attrs       [numEnvdRoutes][numEnvdCountedMethod][2]metric.ObserveOption
	routeAttrs  [numEnvdRoutes]metric.ObserveOption
}

// EnvdStarted counts a request of route r in flight.
func (m *Metrics) EnvdStarted(r EnvdRoute) {
	if m == nil || r == EnvdNone || r >= numEnvdRoutes {
		return
	}
	m.envd.inflight[r].Add(1)
}

// EnvdDone ends a request EnvdStarted counted: answered status, after
// elapsed (the access log's request_time, as nginx's).
func (m *Metrics) EnvdDone(r EnvdRoute, method EnvdMethod, status int, elapsed time.Duration) {
	if m == nil || r == EnvdNone || r >= numEnvdRoutes {
		return
	}
	m.envd.inflight[r].Add(-1)
	if method != EnvdGET && method != EnvdPOST {
		return
	}
	res := 1
	if status >= 200 && status < 400 {
		res = 0
	}
	mi := int(method) - 1
	m.envd.requests[r][mi][res].Add(1)
	m.envd.duration[r][mi][res].Observe(elapsed.Seconds())
}

// histograms adds the duration histograms, one per label combination.
func (e *envdMetrics) histograms(h *histograms) {
	for r := EnvdExec; r < numEnvdRoutes; r++ {
		for mi := range numEnvdCountedMethod {
			for res := range 2 {
				l := prometheus.Labels{"route": envdRouteNames[r], envdMethodLabel: envdMethodNames[mi+1], "result": envdResults[res]}
				e.duration[r][mi][res] = h.add(envdDurationMetric, envdDurationHelp, envdBuckets, l)
			}
		}
	}
}

// instruments makes the counter and the gauge, and their attribute sets.
func (e *envdMetrics) instruments(b *builder, set func(kvs ...attribute.KeyValue) metric.MeasurementOption) {
	e.requestsObs = b.counter(envdRequestsMetric, "{request}", envdRequestsHelp)
	e.inflightObs = b.gauge(envdInflightMetric, "{request}", envdInflightHelp)
	for r := EnvdExec; r < numEnvdRoutes; r++ {
		e.routeAttrs[r] = set(attribute.String("route", envdRouteNames[r]))
		for mi := range numEnvdCountedMethod {
			for res := range 2 {
				e.attrs[r][mi][res] = set(attribute.String("route", envdRouteNames[r]),
					attribute.String(envdMethodLabel, envdMethodNames[mi+1]), attribute.String("result", envdResults[res]))
			}
		}
	}
}

// observe reports the counter and the gauge, zeros included.
func (e *envdMetrics) observe(ob metric.Observer) {
	for r := EnvdExec; r < numEnvdRoutes; r++ {
		ob.ObserveInt64(e.inflightObs, e.inflight[r].Load(), e.routeAttrs[r])
		for mi := range numEnvdCountedMethod {
			for res := range 2 {
				ob.ObserveInt64(e.requestsObs, e.requests[r][mi][res].Load(), e.attrs[r][mi][res])
			}
		}
	}
}
