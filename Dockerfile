# Multi-stage build: a static binary on a distroless base, running as non-root.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/cubeproxy ./cmd/cubeproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/cubeproxy /cubeproxy
COPY configs/cubeproxy.yaml /etc/cubeproxy/cubeproxy.yaml
# Numeric (distroless's nonroot user): Kubernetes' runAsNonRoot cannot
# resolve a user name and refuses to start an image whose USER is one.
USER 65532:65532
# Settings go in the environment, not in CMD: a flag would outrank
# `docker run -e CUBEPROXY_...` (--config too, over CUBEPROXY_CONFIG).
# Mount the memory store's routes here (missing file: an empty table,
# with a warning).
ENV CUBEPROXY_CONFIG=/etc/cubeproxy/cubeproxy.yaml
# Keeps the Go runtime's monitor thread (sysmon) out of its deep sleep. A
# proxy goes idle between bursts many times a millisecond; each time, the
# monitor sleeps, is woken by the next system call and polls every 20 us
# again: up to a third of the proxy's CPU per 64 KiB answer or MCP call
# (README, Performance). A schedtrace interval > 0 is what keeps it awake;
# this one (the largest, 24.8 days) prints one SCHED line to stderr that
# often, and once at start on a host up for longer. It also adds a dump of
# the scheduler to a crash report (README, Performance), and with one CPU lets an
# access log file on a stalled disk hold requests for up to 20 ms (stdout
# is written through the poller; README, Performance).
# Add it to any GODEBUG you set.
ENV GODEBUG=schedtrace=2147483647
ENV CUBEPROXY_ROUTES=/etc/cubeproxy/routes.yaml
# The ports the default configuration serves: sandbox traffic. HTTPS
# (CUBEPROXY_HTTPS_ADDR, :8080 on the platform) and the admin API's
# /readyz and /metrics (CUBEPROXY_ADMIN_ADDR=:8082 with
# CUBEPROXY_ADMIN_TOKEN; 127.0.0.1 by default) listen only once set.
EXPOSE 8081
# Ready for traffic: /readyz on the admin listener the configuration
# names (loopback inside the container; distroless has no curl).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["/cubeproxy", "health"]
ENTRYPOINT ["/cubeproxy"]
CMD ["serve"]
