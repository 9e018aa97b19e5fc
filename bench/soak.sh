#!/usr/bin/env bash
# soak.sh: run the real cubeproxy binary (store: redis) under mixed traffic
# for a long while and check that nothing leaks or drifts.
#
#   bench/soak.sh                 6 min of load (+ 30 s warm-up, ≤ 1 min settle each)
#   bench/soak.sh -d 20m          longer; any flag is passed to `bench soak`
#                                 (-warm, -every, -settle, -kill-every, ...)
#   SOAK_KEEP=1 bench/soak.sh     keep the work dir (logs)
#   SOAK_ACCESS_LOG=1 bench/soak.sh
#                                 the proxy writes its JSON access log to the
#                                 work dir; bench soak renames it and sends
#                                 SIGHUP every 2 min (-hup-every), and fails
#                                 when its lines do not match the requests
#                                 counted (about 2 GiB of lines an hour)
#   SOAK_PPROF=127.0.0.1:18499 bench/soak.sh
#                                 build the proxy from a copy of the module with
#                                 net/http/pprof on that address (as profile.sh
#                                 does), to take heap profiles during the run;
#                                 SOAK_MEMPROFILERATE=1 records every allocation;
#                                 base.heap.pprof and end.heap.pprof land in the
#                                 work dir (kept with SOAK_KEEP=1)
#
# Starts redis-server, bench/backend and cubeproxy on fixed loopback ports of
# their own (redis 16479, backend 21001/21002, proxy 18480, admin 18490), so
# it can run next to compare.sh. Exit 0 = PASS, 1 = FAIL. See bench/README.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/cube-soak.XXXXXX)
BIN=$WORK/bin
REDIS_PORT=16479 FAST=21001 STD=21002 CUBE=18480 ADMIN=18490

for p in $REDIS_PORT $FAST $STD $CUBE $ADMIN; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "soak.sh: 127.0.0.1:$p is already in use (a leftover run?); stop it first" >&2
		exit 1
	fi
done

declare -A PID=()
cleanup() {
	local n
	for n in "${!PID[@]}"; do kill "${PID[$n]}" 2>/dev/null || true; done
	for n in "${!PID[@]}"; do wait "${PID[$n]}" 2>/dev/null || true; done
	if [ "${SOAK_KEEP:-0}" = 1 ]; then
		echo "soak.sh: work dir kept: $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! command -v redis-server >/dev/null; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

cd "$ROOT"
go build -o "$BIN/bench" ./bench
go build -o "$BIN/backend" ./bench/backend
if [ -n "${SOAK_PPROF:-}" ]; then
	mkdir -p "$WORK/src"
	tar -C "$ROOT" --exclude=./.git --exclude='*.test' -cf - . | tar -C "$WORK/src" -xf -
	cat >"$WORK/src/cmd/cubeproxy/zz_soak_pprof.go" <<'EOF'
package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"strconv"
)

// Added by bench/soak.sh only; never part of the tree.
func init() {
	if r, err := strconv.Atoi(os.Getenv("SOAK_MEMPROFILERATE")); err == nil {
		runtime.MemProfileRate = r
	}
	if addr := os.Getenv("SOAK_PPROF"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
EOF
	(cd "$WORK/src" && go build -o "$BIN/cubeproxy" ./cmd/cubeproxy)
	echo "soak.sh: pprof on http://$SOAK_PPROF/debug/pprof/ (work dir $WORK)" >&2
else
	go build -o "$BIN/cubeproxy" ./cmd/cubeproxy
fi

redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
	>"$WORK/redis.log" 2>&1 &
PID[redis]=$!
for _ in $(seq 50); do
	redis-cli -p $REDIS_PORT ping >/dev/null 2>&1 && break
	sleep 0.1
done

# Streams the backend holds outlive the soak (-max-hold): whatever the
# proxy frees, it frees because the client left or was cut, not because
# the sandbox ended the stream.
GOMAXPROCS=1 "$BIN/backend" -fast-ports $FAST -std-ports $STD -sandbox-ips 0 -max-hold 30m \
	>"$WORK/backend.log" 2>&1 &
PID[backend]=$!

ACCESS_LOG=(--access-log-format off)
SOAK_ARGS=()
if [ "${SOAK_ACCESS_LOG:-0}" = 1 ]; then
	ACCESS_LOG=(--access-log-format json --access-log-path "$WORK/access.log")
	SOAK_ARGS=(-access-log "$WORK/access.log")
fi

# Short idle timeouts, so that the end of the soak is reached in seconds:
# keep-alive clients closed after 3 s, idle sandbox connections after 2 s
# (their pools 2 s later). Small route caches, so that the unknown ids fill
# the negative one during the warm-up: its expired entries stay until the
# LRU evicts them, and with the default 10,000 they grow the heap through
# the whole run, bounded, but a slope a leak would also have.
"$BIN/cubeproxy" serve --store redis --redis-addr 127.0.0.1:$REDIS_PORT \
	--http-addr 127.0.0.1:$CUBE --admin-addr 127.0.0.1:$ADMIN \
	"${ACCESS_LOG[@]}" --log-format text \
	--client-idle-timeout 3s --upstream-idle-conn-timeout 2s --cache-size 1000 --cache-negative-size 256 ${SOAK_PROXY_FLAGS:-} \
	>"$WORK/cubeproxy.log" 2>&1 &
PID[cubeproxy]=$!

for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$ADMIN/admin/healthz" >/dev/null 2>&1 &&
		(exec 3<>"/dev/tcp/127.0.0.1/$FAST") 2>/dev/null && break
	sleep 0.1
done

set +e
GOMAXPROCS=1 "$BIN/bench" soak -addr 127.0.0.1:$CUBE -admin 127.0.0.1:$ADMIN \
	-redis 127.0.0.1:$REDIS_PORT -fast-port $FAST -std-port $STD \
	-pid "${PID[cubeproxy]}" -backend-pid "${PID[backend]}" ${SOAK_PPROF:+-pprof "$SOAK_PPROF" -pprof-dir "$WORK"} "${SOAK_ARGS[@]}" "$@"
rc=$?
set -e
if ! kill -0 "${PID[cubeproxy]}" 2>/dev/null; then
	echo "soak.sh: cubeproxy exited during the soak; its log:" >&2
	tail -30 "$WORK/cubeproxy.log" >&2
	rc=1
fi
# Warnings are not a verdict (a kill may log some), but a new kind of
# them in a soak is worth a look: each kind once, with its count.
warns=$(grep -E 'level=(WARN|ERROR)' "$WORK/cubeproxy.log" | sed -E 's/^time=[^ ]+ //; s/ (sandbox_id|remote_addr|addr|err)=[^ ]+//g' |
	sort | uniq -c | sort -rn | head -8 || true)
if [ -n "$warns" ]; then
	echo "soak.sh: cubeproxy warnings and errors (count, message):" >&2
	echo "$warns" >&2
fi
if grep -qiE 'panic|fatal' "$WORK/cubeproxy.log"; then
	echo "soak.sh: cubeproxy logged a panic:" >&2
	grep -iE -m5 'panic|fatal' "$WORK/cubeproxy.log" >&2
	rc=1
fi
exit $rc
