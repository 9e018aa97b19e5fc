#!/usr/bin/env bash
# Lab run (not part of `make test`): the TypeScript MCP SDK's client against
# its own streamable-HTTP/HTTP+SSE gateway, directly and through CubeProxy,
# scenario by scenario, then a comparison (bench/README.md, "MCP clients").
#
#   bench/mcpts/run.sh           # < 3 min; exits 1 when a scenario differs
#   bench/mcpts/run.sh --keep    # keep the work dir (logs, results.jsonl)
#
# Needs node and npm (installed with apt when missing) and the npm registry.
# Ports: gateway 127.0.0.1:50005; CubeProxy A 127.0.0.1:18180 (admin 18181)
# and B 127.0.0.2:18180 (admin 18182), where new connections go once A drains.
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=0
[[ "${1:-}" == "--keep" ]] && keep=1

source bench/lab.sh
lab_setup mcpts '@modelcontextprotocol/sdk@^1' 'undici@^6' 'zod@^4'
cp bench/mcpts/gateway.mjs bench/mcpts/agent.mjs "$work/"
echo "TypeScript SDK $(node -p "require('$work/node_modules/@modelcontextprotocol/sdk/package.json').version"), node $(node --version)"

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$work/routes.yaml" <<EOF
routes:
  tsb:
    HostIP: "127.0.0.1"
    SandboxIP: "127.0.0.1"
    CreatedAt: "1764460000000000000"
    AllowPublicTraffic: "false"
    TrafficAccessToken: "$token"
    "50005": "50005"
EOF
# Short timeouts, so that the long scenarios outlive each of them.
for side in A B; do
	if [[ $side == A ]]; then addr=127.0.0.1 admin=18181; else addr=127.0.0.2 admin=18182; fi
	cat >"$work/proxy$side.yaml" <<EOF
http_addr: "$addr:18180"
admin_addr: "127.0.0.1:$admin"
routes: $work/routes.yaml
drain_timeout: 6s
upstream:
  response_header_timeout: 2s
  idle_timeout: 5s
  heartbeat_interval: 1s
client:
  read_timeout: 10s
  body_timeout: 2s
  write_timeout: 2s
  idle_timeout: 5s
EOF
done

wait_ready() { # url
	for _ in $(seq 100); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
	echo "not ready: $1" >&2; return 1
}
proxyA=0
start_a() {
	"$work/cubeproxy" serve --config "$work/proxyA.yaml" >>"$work/proxyA.log" 2>&1 &
	proxyA=$!; pids+=("$proxyA")
	wait_ready http://127.0.0.1:18181/readyz
}
(cd "$work" && PORT=50005 exec node gateway.mjs >gateway.log 2>&1) &
pids+=($!)
"$work/cubeproxy" serve --config "$work/proxyB.yaml" >"$work/proxyB.log" 2>&1 &
pids+=($!)
start_a
wait_ready http://127.0.0.1:18182/readyz
for _ in $(seq 100); do curl -s -o /dev/null 127.0.0.1:50005 && break; sleep 0.1; done

export TRAFFIC_TOKEN=$token PROXY=127.0.0.1:18180 ALT_IP=127.0.0.2 DIRECT=127.0.0.1:50005
results="$work/results.jsonl"
agent() { (cd "$work" && node agent.mjs "$@") | tee -a "$results" | cut -c1-160; }
agent direct
agent proxy
for s in drain drainLegacy; do
	agent direct "$s"
	PROXY_PID=$proxyA agent proxy "$s"
	wait "$proxyA" || true # the drain ends A
	start_a
done
echo
(cd "$work" && node agent.mjs compare "$results")
