#!/usr/bin/env bash
# profile.sh: pprof profiles of CubeProxy under one bench scenario.
#
#   bench/profile.sh SCENARIO [SECONDS]
#   SCENARIO: http | bytes | sse | sse-lat | ws | mcp | idle | cold
#
# Builds CubeProxy from a copy of the module with net/http/pprof added (the
# tree itself is not touched), runs it pinned like compare.sh does (CPU 0,
# GOMAXPROCS=1, access log off), drives the scenario from CPU 1, and saves
# cpu.pprof, allocs.pprof and heap.pprof (inuse, taken while idle streams are
# open for `idle`) into a work dir it prints, with the top functions.
set -euo pipefail

SCENARIO=${1:-}
SECS=${2:-10}
case "$SCENARIO" in
http | bytes | sse | sse-lat | ws | mcp | idle | cold) ;;
*)
	sed -n '2,11p' "$0"
	exit 2
	;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PPROF=127.0.0.1:18099
PORT=18080
# A leftover process on one of these would answer in place of ours.
for p in $PORT 18090 ${PPROF##*:} 20001 20002 16379; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "profile.sh: 127.0.0.1:$p is already in use (a leftover run?); stop it first" >&2
		exit 1
	fi
done
WORK=$(mktemp -d /tmp/cube-prof.XXXXXX)
BIN=$WORK/bin
declare -A PID=()
cleanup() {
	local n
	for n in "${!PID[@]}"; do kill "${PID[$n]}" 2>/dev/null || true; done
	for n in "${!PID[@]}"; do wait "${PID[$n]}" 2>/dev/null || true; done
	rm -rf "$WORK/src"
}
trap cleanup EXIT

PIN_SUBJECT="" PIN_LOAD=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
	PIN_SUBJECT="taskset -c 0" PIN_LOAD="taskset -c 1"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "copying the module and adding pprof to cmd/cubeproxy" >&2
mkdir -p "$WORK/src" "$BIN"
tar -C "$ROOT" --exclude=./.git --exclude='*.test' --exclude=./cubeproxy -cf - . | tar -C "$WORK/src" -xf -
cat >"$WORK/src/cmd/cubeproxy/zz_bench_pprof.go" <<'EOF'
package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

// Added by bench/profile.sh only; never part of the tree.
func init() {
	if addr := os.Getenv("CUBE_BENCH_PPROF_ADDR"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
EOF
(cd "$WORK/src" && go build -o "$BIN/cubeproxy" ./cmd/cubeproxy && go build -o "$BIN/bench" ./bench &&
	go build -o "$BIN/backend" ./bench/backend)

GOMAXPROCS=1 $PIN_LOAD "$BIN/backend" >"$WORK/backend.log" 2>&1 &
PID[backend]=$!
STORE=(--routes "$ROOT/configs/bench/routes.yaml")
if [ "$SCENARIO" = cold ]; then
	$PIN_LOAD redis-server --port 16379 --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
	PID[redis]=$!
	for _ in $(seq 50); do redis-cli -p 16379 ping >/dev/null 2>&1 && break; sleep 0.1; done
	redis-cli -p 16379 HSET cube:v1:shared:sandbox:proxy:bench HostIP 127.0.0.1 SandboxIP 127.0.0.1 \
		CreatedAt 1 20001 20001 20002 20002 >/dev/null
	# Every cold id is its own sandbox with its own upstream pool; all of them
	# point at one loopback backend, so idle pooled connections are closed
	# quickly to stay under the descriptor limit (see README).
	STORE=(--store redis --redis-addr 127.0.0.1:16379 --upstream-idle-conn-timeout 1s)
fi
# With the GODEBUG the image ships (Dockerfile), as compare.sh runs it.
GODEBUG=$(sed -n 's/^ENV GODEBUG=//p' "$ROOT/Dockerfile") \
	CUBE_BENCH_PPROF_ADDR=$PPROF CUBEPROXY_ACCESS_LOG_FORMAT=off GOMAXPROCS=1 \
	$PIN_SUBJECT "$BIN/cubeproxy" serve --http-addr 127.0.0.1:$PORT --admin-addr 127.0.0.1:18090 \
	"${STORE[@]}" --node-ip 127.0.0.1 --log-format json --access-log-format off \
	--upstream-max-conns 8192 >"$WORK/cubeproxy.log" 2>&1 &
PID[cubeproxy]=$!
"$BIN/bench" wait -addr 127.0.0.1:20001 -port 20001
"$BIN/bench" wait -addr 127.0.0.1:$PORT -port 20001

load() { # duration
	local common=(-addr 127.0.0.1:$PORT -subject cubeproxy -pids "${PID[cubeproxy]}" -d "$1" -warm 1s -max-other 100 -out "$WORK/samples.jsonl")
	case "$SCENARIO" in
	http) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" http "${common[@]}" -c 64 ;;
	bytes) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" bytes "${common[@]}" -c 8 ;;
	sse) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" sse "${common[@]}" -n 16 -size 256 ;;
	sse-lat) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" sse "${common[@]}" -n 32 -size 4096 -interval 10ms ;;
	ws) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" ws "${common[@]}" -c 32 ;;
	mcp) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" mcp "${common[@]}" -m 8 ;;
	idle) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" idle "${common[@]}" -n 2000 ;;
	cold) GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" cold "${common[@]}" -c 8 -r $((SECS * 12000)) -redis 127.0.0.1:16379 ;;
	esac
}

if [ "$SCENARIO" = idle ]; then
	load "${SECS}s" &
	LOAD=$!
	sleep $((SECS / 2 + 3)) # streams open and settled
	curl -s -o "$WORK/heap.pprof" "http://$PPROF/debug/pprof/heap?gc=1"
	curl -s -o "$WORK/goroutine.txt" "http://$PPROF/debug/pprof/goroutine?debug=1"
	wait $LOAD
	echo "== heap in use with 2000 idle streams open (top 25)"
	go tool pprof -top -sample_index=inuse_space -nodecount=25 "$BIN/cubeproxy" "$WORK/heap.pprof" 2>/dev/null
	echo "== goroutines (first stacks): $WORK/goroutine.txt"
	head -40 "$WORK/goroutine.txt"
else
	load "$((SECS + 2))s" &
	LOAD=$!
	sleep 1.5
	[ "$SCENARIO" = cold ] && sleep 2 # writing the ids to Redis comes first
	curl -s -o "$WORK/cpu.pprof" "http://$PPROF/debug/pprof/profile?seconds=$SECS"
	curl -s -o "$WORK/allocs.pprof" "http://$PPROF/debug/pprof/allocs"
	wait $LOAD
	echo "== CPU (top 30, cumulative order in cpu.pprof)"
	go tool pprof -top -nodecount=30 "$BIN/cubeproxy" "$WORK/cpu.pprof" 2>/dev/null
	echo "== allocations since start (top 20 by space)"
	go tool pprof -top -sample_index=alloc_space -nodecount=20 "$BIN/cubeproxy" "$WORK/allocs.pprof" 2>/dev/null
fi
echo "profiles in $WORK (e.g. go tool pprof -http=127.0.0.1:8000 $BIN/cubeproxy $WORK/cpu.pprof)" >&2
