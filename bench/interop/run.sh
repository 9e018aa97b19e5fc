#!/usr/bin/env bash
# Lab run (also run by `make test`, as bench's TestInteropLab): clients that are not Go (curl, Node's
# built-in fetch, the npm `eventsource` and `ws` packages, Python's http.client
# and urllib) against one node sandbox, directly and through CubeProxy,
# scenario by scenario, then a comparison (bench/README.md, "Other clients").
#
#   bench/interop/run.sh            # < 3 min; exits 1 when a scenario differs unexpectedly
#   bench/interop/run.sh --keep     # keep the work dir (logs, results.jsonl)
#   bench/interop/run.sh ws. py.    # only scenarios whose names start so (plain and TLS)
#   INTEROP_SUBJECT=buffering bench/interop/run.sh fetch.stream-chunks ...
#   INTEROP_SUBJECT=deaf bench/interop/run.sh fetch.abort ...
#                                   # the proxy-mode clients go through faulty.mjs in
#                                   # front of CubeProxy (buffering: answers held whole,
#                                   # `retry:` dropped; both: a client leaving is not
#                                   # passed on): the checks that guard against that
#                                   # must say DIFFERS (bench/README.md, Other clients)
#
# Then a subset over HTTPS (tls_only below, and the TLS-only scenarios of
# tls_clients.mjs and tls_clients.py): CubeProxy's https_addr with a certificate for
# *.cube.test from a CA made for the run, against the sandbox's own TLS port
# with the same certificate; reported as tls/<scenario>.
#
# Needs node + npm (installed with apt when missing), the npm registry, python3,
# curl and openssl. Ports: sandbox 127.0.0.1:20100 (20101: mapped, nothing listens;
# 20102: its TLS port), CubeProxy 127.0.0.1:18280 (HTTPS 18283, admin 18281).
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=0
if [[ "${1:-}" == "--keep" ]]; then keep=1; shift; fi
only=("$@")

# Runs of the lab on one machine (make test in two worktrees, a hand run
# beside it) take turns: its ports are fixed. What this script starts gets
# 9>&-: a sandbox or proxy left behind by a killed run must not hold the lock
# and make every later run wait for it.
exec 9>/tmp/cubeproxy-interop.lock
flock 9

# A leftover sandbox or proxy on one of the lab's ports would answer in place
# of this run's (with another run's certificate, over TLS).
subject=${INTEROP_SUBJECT:-cubeproxy}
case "$subject" in cubeproxy | buffering | deaf) ;; *) echo "INTEROP_SUBJECT: cubeproxy, buffering or deaf, not $subject" >&2; exit 2 ;; esac
for p in 20100 20102 18280 18281 18283 $([[ $subject != cubeproxy ]] && echo 18290 18293); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is taken: stop what listens there first" >&2; exit 1; fi
done

source bench/lab.sh
lab_setup interop 'ws@^8' 'eventsource@^4'
cp bench/interop/*.mjs bench/interop/*.py "$work/"

# A CA for the run and a certificate for *.cube.test (and 127.0.0.1, for the
# clients that send no SNI) that CubeProxy and the sandbox's TLS port share.
(cd "$work" &&
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=interop-lab-ca \
		-keyout ca-key.pem -out ca.pem 2>/dev/null &&
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=cube.test \
		-keyout leaf-key.pem -out leaf.csr 2>/dev/null &&
	printf 'subjectAltName=DNS:*.cube.test,DNS:cube.test,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >leaf.ext &&
	openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 -extfile leaf.ext -out leaf.pem 2>/dev/null)
echo "node $(node --version), ws $(node -p "require('$work/node_modules/ws/package.json').version"), eventsource $(node -p "require('$work/node_modules/eventsource/package.json').version"), $(python3 --version), $(curl --version | head -1 | cut -d' ' -f1-2)"

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
token_other=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat >"$work/routes.yaml" <<EOF
routes:
  lab:
    HostIP: "127.0.0.1"
    SandboxIP: "127.0.0.1"
    CreatedAt: "1764460000000000000"
    AllowPublicTraffic: "false"
    TrafficAccessToken: "$token"
    "20100": "20100"
    "20101": "20101"
  other: # the same node server as another sandbox, with its own token (tls/sni.other-host)
    HostIP: "127.0.0.1"
    SandboxIP: "127.0.0.1"
    CreatedAt: "1764460000000000001"
    AllowPublicTraffic: "false"
    TrafficAccessToken: "$token_other"
    "20100": "20100"
EOF
# A 1 s heartbeat, so that the silent SSE scenario outlives it.
cat >"$work/proxy.yaml" <<EOF
http_addr: "127.0.0.1:18280"
https_addr: "127.0.0.1:18283"
admin_addr: "127.0.0.1:18281"
tls:
  source: files
  cert_file: $work/leaf.pem
  key_file: $work/leaf-key.pem
routes: $work/routes.yaml
upstream:
  heartbeat_interval: 1s
EOF

wait_ready() { # url
	for _ in $(seq 300); do curl -s -k --max-time 2 -o /dev/null "$1" 2>/dev/null 9>&- && return 0; sleep 0.1; done
	echo "not ready: $1" >&2; return 1
}
(cd "$work" && PORT=20100 TLS_PORT=20102 TLS_CERT=leaf.pem TLS_KEY=leaf-key.pem exec node backend.mjs >backend.log 2>&1) 9>&- &
pids+=($!)
"$work/cubeproxy" serve --config "$work/proxy.yaml" >"$work/proxy.log" 2>&1 9>&- &
pids+=($!)
wait_ready http://127.0.0.1:18281/readyz
wait_ready http://127.0.0.1:20100/stats

wait_ready https://127.0.0.1:20102/stats
if [[ $subject != cubeproxy ]]; then
	(cd "$work" && FAULT=$subject UPSTREAM_PORT=18280 PORT=18290 TLS_PORT=18293 TLS_CERT=leaf.pem TLS_KEY=leaf-key.pem exec node faulty.mjs >faulty.log 2>&1) 9>&- &
	pids+=($!)
	wait_ready http://127.0.0.1:18290/
	wait_ready https://127.0.0.1:18293/
fi

export TRAFFIC_TOKEN=$token TRAFFIC_TOKEN_OTHER=$token_other PROXY_PORT=18280 BACKEND_PORT=20100
export PROXY_TLS_PORT=18283 BACKEND_TLS_PORT=20102
[[ $subject != cubeproxy ]] && export PROXY_PORT=18290 PROXY_TLS_PORT=18293
export LAB_CA=$work/ca.pem NODE_EXTRA_CA_CERTS=$work/ca.pem
# The TLS subset: streaming, WebSocket, large bodies, aborts, keep-alive and
# pipelining, then the TLS-only scenarios (alpn., sni., resume., cut.).
tls_only=(fetch.get-large fetch.post-large fetch.stream-chunks fetch.abort fetch.keepalive fetch.sse-held fetch.refused-upload
	eventsource.basic eventsource.reconnect eventsource.silent-bom
	ws.echo-deflate ws.large ws.ping-pong ws.client-terminate ws.server-terminate
	curl.get curl.chunked-upload curl.sse
	py.pipelined py.keepalive-mixed py.chunked-upload py.trickle-chunked py.http10-sse-held py.urllib-post
	alpn. sni. resume. cut. py.alpn py.sni py.resume py.cut)
((${#only[@]})) && tls_only=("${only[@]}")
# The direct run and the run through the proxy go side by side, each the
# node clients then the Python ones, plain then over TLS, into a file of its
# own: most of a run is waiting (timers, retries, streams held open), and
# one after the other they took 87 s. They share the sandbox but nothing a
# scenario reads (each /stats key carries the client's mode and process id).
# The proxy's requests still come one scenario at a time, in the order they
# always did: with plain and TLS through the proxy side by side,
# py.http10-sse once got a heartbeat in a 0.1 s stream (a heartbeat could
# then fire up to a second early, and 1 s is the interval here; now an eighth
# of it at most, proxy's TestHeartbeatCountsFromTheLastEvent).
clients() { # mode
	cd "$work"
	node clients.mjs "$1" "${only[@]}"
	python3 clients.py "$1" "${only[@]}"
	TLS=1 node clients.mjs "$1" "${tls_only[@]}"
	TLS=1 python3 clients.py "$1" "${tls_only[@]}"
}
runs=()
for mode in direct proxy; do
	clients "$mode" >"$work/results-$mode.jsonl" 9>&- &
	runs+=($!)
done
pids+=("${runs[@]}")
for p in "${runs[@]}"; do wait "$p"; done
results="$work/results.jsonl"
cat "$work/results-direct.jsonl" "$work/results-proxy.jsonl" >"$results"
node "$work/compare.mjs" "$results"
