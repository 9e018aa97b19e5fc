// Package telemetry sets up OpenTelemetry tracing and metrics for CubeProxy.
//
// Metrics are always on and exported in Prometheus text format from an own
// registry (MetricsHandler), with the Go runtime and process collectors.
// Counters and gauges are OTel observables read at scrape time; the four
// duration histograms are Prometheus histograms registered beside them,
// exposed as the OTel SDK exposed them (names, buckets, labels) at a fifth
// of its cost per record (histograms.go).
// Names (OTel name -> Prometheus name; labels):
//
//	cubeproxy.requests                  cubeproxy_requests_total{status_class,route_kind}
//	cubeproxy.request.duration          cubeproxy_request_duration_seconds{status_class,route_kind}  (to response headers; 1 ms .. 300 s buckets)
//	cubeproxy.response.duration         cubeproxy_response_duration_seconds{status_class,route_kind} (to last byte; not chunked/SSE streams or WebSockets; same buckets)
//	cubeproxy.stream.duration           cubeproxy_stream_duration_seconds{route_kind}                (5 ms .. 24 h buckets)
//	cubeproxy.received / .sent          cubeproxy_received_bytes_total{route_kind}, cubeproxy_sent_bytes_total{route_kind}
//	cubeproxy.connections.open          cubeproxy_connections_open
//	cubeproxy.streams.open              cubeproxy_streams_open{route_kind="http"|"sse"}               (every body relayed as it comes, downloads included)
//	cubeproxy.websockets.open           cubeproxy_websockets_open
//	cubeproxy.streams.ended             cubeproxy_streams_ended_total{route_kind="http"|"sse"|"websocket",reason}
//	cubeproxy.route_cache.lookups       cubeproxy_route_cache_lookups_total{result}
//	cubeproxy.store.duration            cubeproxy_store_duration_seconds{store}
//	cubeproxy.store.errors              cubeproxy_store_errors_total{store}
//	cubeproxy.upstream.connect_errors   cubeproxy_upstream_connect_errors_total
//	cubeproxy.upstream.resource_errors  cubeproxy_upstream_resource_errors_total (proxy out of descriptors or local ports: 503)
//	cubeproxy.upstream.retries          cubeproxy_upstream_retries_total
//	cubeproxy.accept.errors             cubeproxy_accept_errors_total       (listener out of descriptors; retried)
//	cubeproxy.connections.refused       cubeproxy_connections_refused_total (client.max_conns open: 503 proxy_overloaded)
//	cubeproxy.connections.reclaimed     cubeproxy_connections_reclaimed_total (waiting for a request, closed for a new one at client.max_conns)
//	cubeproxy.upstream.pools            cubeproxy_upstream_pools            (after SetPoolStats)
//	cubeproxy.upstream.idle_connections cubeproxy_upstream_idle_connections (after SetPoolStats)
//	cubeproxy.stream_limit.waits        cubeproxy_stream_limit_waits_total{outcome="slot"|"refused"|"state"} (waits for a slot at max_streams_per_sandbox)
//	cubeproxy.sandbox.resumes           cubeproxy_sandbox_resumes_total{outcome="resumed"|"failed"} (calls to the lifecycle manager's resume, one per paused sandbox at a time)
//	cubeproxy.held_body                 cubeproxy_held_body_bytes           (held_body_budget taken; after SetHeldBodyBytes, 0 before)
//	cubeproxy.route_invalidation.subscribed     cubeproxy_route_invalidation_subscribed           (Redis store, after SetInvalidationStats: 1 subscribed, 0 not)
//	cubeproxy.route_invalidation.subscriptions  cubeproxy_route_invalidation_subscriptions_total  (confirmed; each expires the whole cache)
//	cubeproxy.route_invalidation.messages       cubeproxy_route_invalidation_messages_total       (ids applied)
//	cubeproxy.tls.certificate.expiry_timestamp  cubeproxy_tls_certificate_expiry_timestamp_seconds (after SetCertExpiry: the soonest NotAfter of the configured certificates)
//	cubeproxy.auth.rejections           cubeproxy_auth_rejections_total{reason}
//	cubeproxy.accesslog.dropped         cubeproxy_accesslog_dropped_total
//	cubeproxy.accesslog.reopen_errors   cubeproxy_accesslog_reopen_errors_total (SIGHUP's reopen of the file failed)
//	cubeproxy.accesslog.close_errors    cubeproxy_accesslog_close_errors_total (close(2) of the file failed: lines may be lost)
//	cubeproxy.accesslog.truncations     cubeproxy_accesslog_truncations_total (the file was truncated under the proxy, copytruncate: lines may be lost)
//	cubeproxy.process_log.dropped       cubeproxy_process_log_dropped_total (after SetProcessLogDropped; 0 before)
//	cubeproxy.spans.dropped             cubeproxy_spans_dropped_total       (sampled spans the full export queue had no room for, or whose export failed)
//
// The platform proxy's own families (its lua/metrics.lua), kept under its
// names for its dashboards and alerts; they count envd's calls alone
// (envd.go):
//
//	cube_proxy.request                  cube_proxy_request_total{route,method,result}
//	(Prometheus histogram)              cube_proxy_request_duration_seconds{route,method,result} (its buckets, 1 ms .. 8.192 s)
//	cube_proxy.inflight_requests        cube_proxy_inflight_requests{route}
//
// Every label comes from a small fixed set defined in labels.go; no host,
// sandbox id or other client-chosen value is ever a label.
//
// Tracing is off unless OTEL_TRACES_EXPORTER=otlp (or a SpanExporter is
// injected); when off, the span helpers cost no allocation.
package telemetry
