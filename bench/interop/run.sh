#!/usr/bin/env bash
# Lab run (not part of `make test`): clients that are not Go (curl, Node's
# built-in fetch, the npm `eventsource` and `ws` packages, Python's http.client
# and urllib) against one node sandbox, directly and through CubeProxy,
# scenario by scenario, then a comparison (bench/README.md, "Other clients").
#
#   bench/interop/run.sh            # < 3 min; exits 1 when a scenario differs unexpectedly
#   bench/interop/run.sh --keep     # keep the work dir (logs, results.jsonl)
#   bench/interop/run.sh ws. py.    # only scenarios whose names start so
#
# Needs node + npm (installed with apt when missing), the npm registry, python3
# and curl. Ports: sandbox 127.0.0.1:50100 (50101: mapped, nothing listens), CubeProxy
# 127.0.0.1:18280 (admin 18281).
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=0
if [[ "${1:-}" == "--keep" ]]; then keep=1; shift; fi
only=("$@")

source bench/lab.sh
lab_setup interop 'ws@^8' 'eventsource@^4'
cp bench/interop/*.mjs bench/interop/*.py "$work/"
echo "node $(node --version), ws $(node -p "require('$work/node_modules/ws/package.json').version"), eventsource $(node -p "require('$work/node_modules/eventsource/package.json').version"), $(python3 --version), $(curl --version | head -1 | cut -d' ' -f1-2)"

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$work/routes.yaml" <<EOF
routes:
  lab:
    HostIP: "127.0.0.1"
    SandboxIP: "127.0.0.1"
    CreatedAt: "1764460000000000000"
    AllowPublicTraffic: "false"
    TrafficAccessToken: "$token"
    "50100": "50100"
    "50101": "50101"
EOF
# A 1 s heartbeat, so that the silent SSE scenario outlives it.
cat >"$work/proxy.yaml" <<EOF
http_addr: "127.0.0.1:18280"
admin_addr: "127.0.0.1:18281"
routes: $work/routes.yaml
upstream:
  heartbeat_interval: 1s
EOF

wait_ready() { # url
	for _ in $(seq 100); do curl -s -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done
	echo "not ready: $1" >&2; return 1
}
(cd "$work" && PORT=50100 exec node backend.mjs >backend.log 2>&1) &
pids+=($!)
"$work/cubeproxy" serve --config "$work/proxy.yaml" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:18281/readyz
wait_ready http://127.0.0.1:50100/stats

export TRAFFIC_TOKEN=$token PROXY_PORT=18280 BACKEND_PORT=50100
results="$work/results.jsonl"
for mode in direct proxy; do
	(cd "$work" && node clients.mjs "$mode" "${only[@]}") >>"$results"
	(cd "$work" && python3 clients.py "$mode" "${only[@]}") >>"$results"
done
node "$work/compare.mjs" "$results"
