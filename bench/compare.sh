#!/usr/bin/env bash
# compare.sh: measure CubeProxy against nginx (tuned for streaming, and with
# the platform proxy's settings) and a direct connection, in one run.
#
#   bench/compare.sh            full run (< 15 min on 2 cores), writes bench/RESULTS.md
#   bench/compare.sh --quick    smoke run (< 3 min), writes /tmp/cube-bench-quick.md
#   options: --out FILE   report path;  --keep   keep the work dir (logs, samples)
#            --only "http idle"   run only these scenarios (http bytes sse ws mcp
#                                 cold idle; sse = all three SSE runs); no
#                                 micro-benchmarks
#
# Loopback only. Every subject gets CPU 0 (CubeProxy with GOMAXPROCS=1, nginx
# with one worker); the load generator, backend and redis share CPU 1.
# Each scenario runs REPS times per subject, interleaved (A B C D A B C D ...).
# A sample during which processes outside the harness used more than 5 % of
# the machine's CPU is rerun while the time budget allows; the report keeps
# the quietest attempt. See bench/README.md.
set -euo pipefail

MODE=full
OUT=""
ONLY=""
KEEP=0
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) MODE=quick ;;
	--keep) KEEP=1 ;;
	--only)
		ONLY=" $2 "
		shift
		;;
	--out)
		OUT="$2"
		shift
		;;
	-h | --help)
		sed -n '2,/^set /{/^#/p}' "$0"
		exit 0
		;;
	*)
		echo "compare.sh: unknown argument $1" >&2
		exit 2
		;;
	esac
	shift
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/cube-bench.XXXXXX)
chmod 755 "$WORK"
BIN=$WORK/bin
SAMPLES=$WORK/samples.jsonl
T0=$(date +%s)

# Fixed loopback ports: the nginx configs and routes.yaml name them too.
BACKEND_FAST=20001 # /small /bytes /sse (fasthttp)
BACKEND_STD=20002  # /ws /mcp (net/http)
CUBE_PORT=18080
CUBE_ADMIN=18090
CUBE_REDIS_PORT=18083
CUBE_REDIS_ADMIN=18093
NGINX_TUNED_PORT=18081
NGINX_PLATFORM_PORT=18082
REDIS_PORT=16379

# A process left over from an earlier run would answer in place of the one
# started here (whose listen fails), and its CPU would count as noise.
for p in $BACKEND_FAST $BACKEND_STD $CUBE_PORT $CUBE_ADMIN $CUBE_REDIS_PORT $CUBE_REDIS_ADMIN \
	$NGINX_TUNED_PORT $NGINX_PLATFORM_PORT $REDIS_PORT; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		echo "compare.sh: 127.0.0.1:$p is already in use (a leftover run?); stop it first" >&2
		exit 1
	fi
done

# BUDGET bounds reruns: the projected end of the last sample. After it come
# the micro-benchmarks and the report (quick ≈ 3 s, full ≈ 30 s), and the
# projection, at the average pace, leaves out that idle samples, run last,
# take 2-3 times as long as the others (quick, beside the compiler: 24-39 s
# for the nine, projected 12-14 s). Quick's 165 let a noisy run end past
# its 3 minutes; 140 ends by ~170 s.
if [ "$MODE" = quick ]; then
	REPS=3 DUR=700ms WARM=200ms IDLE_N=500 IDLE_HOLD=500ms COLD_R=3000 BUDGET=140 MAX_ATTEMPTS=2
	MICRO_TIME=100ms MICRO_COLD=300x
	: "${OUT:=/tmp/cube-bench-quick.md}" # outside the work dir, which is removed
else
	REPS=3 DUR=4s WARM=1s IDLE_N=2000 IDLE_HOLD=3s COLD_R=20000 BUDGET=840 MAX_ATTEMPTS=3
	MICRO_TIME=1s MICRO_COLD=2000x
	: "${OUT:=$ROOT/bench/RESULTS.md}"
fi

log() { printf '[%4ds] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }

# ---- processes we start, stopped by PID on exit ------------------------------
declare -A PID=()
cleanup() {
	local name
	for name in "${!PID[@]}"; do
		kill "${PID[$name]}" 2>/dev/null || true
	done
	for name in "${!PID[@]}"; do
		wait "${PID[$name]}" 2>/dev/null || true
	done
	# apt, when the run ends during the build (a failed build, ^C), is
	# waited for, not killed: a dpkg cut halfway leaves the machine's
	# packages for the next run to repair, and its lock held meanwhile.
	if [ -n "${PKG_PID:-}" ]; then
		wait "$PKG_PID" 2>/dev/null || true
	fi
	if [ -n "${MICRO_PID:-}" ]; then
		kill "$MICRO_PID" 2>/dev/null || true
		wait "$MICRO_PID" 2>/dev/null || true
	fi
	if [ "$KEEP" = 1 ] || [ "${FAILED:-0}" = 1 ]; then
		log "work dir kept: $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- CPU pinning ---------------------------------------------------------------
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
	PIN_SUBJECT="taskset -c 0"
	PIN_LOAD="taskset -c 1"
	PINNING="subjects on CPU 0; load generator, backend and redis on CPU 1"
else
	PIN_SUBJECT="" PIN_LOAD=""
	PINNING="not pinned (fewer than 2 CPUs or no taskset)"
	log "warning: $PINNING"
fi
# cold opens ~10,000 upstream connections a second, each closed after 1 s
# idle; the backend holds the other end. Raise the hard limit where allowed
# (root), then the soft one to it.
ulimit -Hn 262144 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- dependencies --------------------------------------------------------------
need_pkg() { # command package
	command -v "$1" >/dev/null && return 0
	log "installing $2"
	if [ -z "${APT_UPDATED:-}" ]; then
		apt-get update -qq
		APT_UPDATED=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
	command -v "$1" >/dev/null || {
		echo "compare.sh: $1 still missing after installing $2" >&2
		exit 1
	}
}
# The peers install while the binaries build (below): on a fresh machine
# both take a while, and apt waits on the network while go needs the CPUs.
(
	need_pkg nginx nginx
	need_pkg redis-server redis-server
) &
PKG_PID=$!

# ---- build ---------------------------------------------------------------------
# One go command for the three binaries and one for the micro-benchmarks'
# three test binaries: on a cold build cache (a fresh machine) six commands
# took 108 s, each running its link and its last packages on one core while
# the other idled, against 77 s for two. Both run before the samples: the
# test binaries compiled at the end added over a minute to a cold run.
cd "$ROOT"
log "building bench, backend and cubeproxy into $BIN"
HAVE_CUBE=1
if ! go build -o "$BIN/" ./bench ./bench/backend ./cmd/cubeproxy 2>"$WORK/cubeproxy-build.log"; then
	# The harness alone, so that nginx and direct are still measured
	# when only cubeproxy fails (a harness that fails ends the run).
	go build -o "$BIN/" ./bench ./bench/backend
	HAVE_CUBE=0
	log "cubeproxy does not build (see below); measuring nginx and direct only"
	head -20 "$WORK/cubeproxy-build.log" >&2
	if [ "${CUBE_BENCH_REQUIRE_PROXY:-0}" = 1 ]; then
		FAILED=1
		exit 1
	fi
fi
MICRO_BUILD=""
if [ "$HAVE_CUBE" = 1 ] && [ -z "$ONLY" ]; then
	if [ "$MODE" = quick ]; then
		MICRO_BUILD=later # during the idle samples, below
	else
		go test -c -o "$BIN/" ./routing ./proxy ./routing/redisstore
	fi
fi
wait "$PKG_PID" || {
	echo "compare.sh: installing nginx or redis-server failed (above)" >&2
	exit 1
}

# ---- subjects ------------------------------------------------------------------
wait_ready() { # addr port
	"$BIN/bench" wait -addr "$1" -port "$2" -timeout 20s
}

start_backend() {
	GOMAXPROCS=1 $PIN_LOAD "$BIN/backend" -fast-ports $BACKEND_FAST -std-ports $BACKEND_STD \
		>"$WORK/backend.log" 2>&1 &
	PID[backend]=$!
	wait_ready 127.0.0.1:$BACKEND_FAST $BACKEND_FAST
}

start_redis() {
	$PIN_LOAD redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$WORK" >"$WORK/redis.log" 2>&1 &
	PID[redis]=$!
	local i
	for i in $(seq 50); do
		if redis-cli -p $REDIS_PORT ping >/dev/null 2>&1; then
			# The "bench" sandbox for the Redis-backed CubeProxy (same fields as
			# configs/bench/routes.yaml); the cold scenario adds its own ids.
			redis-cli -p $REDIS_PORT HSET cube:v1:shared:sandbox:proxy:bench HostIP 127.0.0.1 \
				SandboxIP 127.0.0.1 CreatedAt 1 $BACKEND_FAST $BACKEND_FAST $BACKEND_STD $BACKEND_STD >/dev/null
			return 0
		fi
		sleep 0.1
	done
	echo "compare.sh: redis-server did not start" >&2
	cat "$WORK/redis.log" >&2
	FAILED=1
	exit 1
}

# CubeProxy's access log is switched off, as nginx runs with access_log off:
# through the environment (CUBEPROXY_ACCESS_LOG_FORMAT=off)
# and the matching flag when the binary has one. The per-sandbox-port
# connection cap is raised above the idle scenario's stream count: nginx has
# no such cap, and every stream here goes to one sandbox.
CUBE_FLAGS=(--upstream-max-conns 8192)
HAVE_CUBE_REDIS=0
cube_flags() {
	local help
	help=$("$BIN/cubeproxy" serve --help 2>&1 || true)
	if grep -Eq -- '^\s+-access-log-format\s' <<<"$help"; then
		CUBE_FLAGS+=(--access-log-format off)
	elif grep -Eq -- '^\s+-access-log\s' <<<"$help"; then
		CUBE_FLAGS+=(--access-log off)
	else
		log "cubeproxy has no access-log flag; relying on CUBEPROXY_ACCESS_LOG_FORMAT=off"
	fi
	if grep -Eq -- '^\s+-redis-addr\s' <<<"$help"; then
		HAVE_CUBE_REDIS=1
	else
		log "cubeproxy has no --redis-addr yet: the cold scenario measures direct only"
	fi
}

# CubeProxy runs with the GODEBUG its image ships (Dockerfile, README
# Performance: it keeps the runtime's sysmon out of its deep sleep), as
# nginx runs with its tuned config.
CUBE_GODEBUG=$(sed -n 's/^ENV GODEBUG=//p' "$ROOT/Dockerfile")
start_cube() { # name port admin [extra args]
	local name=$1 port=$2 admin=$3
	shift 3
	GODEBUG=$CUBE_GODEBUG CUBEPROXY_ACCESS_LOG_FORMAT=off GOMAXPROCS=1 $PIN_SUBJECT "$BIN/cubeproxy" serve \
		--http-addr 127.0.0.1:"$port" --admin-addr 127.0.0.1:"$admin" \
		--node-ip 127.0.0.1 --log-format json "${CUBE_FLAGS[@]}" "$@" \
		>>"$WORK/$name.log" 2>&1 &
	PID[$name]=$!
}

start_nginx() { # name conf
	local name=$1 conf=$2 prefix=$WORK/$1
	mkdir -p "$prefix/logs"
	chmod 755 "$prefix"
	$PIN_SUBJECT nginx -p "$prefix/" -c "$ROOT/configs/bench/$conf" >>"$WORK/$name.log" 2>&1 &
	PID[$name]=$!
}

start_subject() { # name
	case "$1" in
	cubeproxy) start_cube cubeproxy $CUBE_PORT $CUBE_ADMIN --routes "$ROOT/configs/bench/routes.yaml" ;;
	cubeproxy-redis)
		# Each cold id is a sandbox with its own upstream pool, and all of them
		# point at one loopback backend: idle pooled connections are closed
		# after 1 s so 20,000 ids stay under the descriptor limit.
		start_cube cubeproxy-redis $CUBE_REDIS_PORT $CUBE_REDIS_ADMIN \
			--store redis --redis-addr 127.0.0.1:$REDIS_PORT --upstream-idle-conn-timeout 1s
		;;
	nginx-tuned) start_nginx nginx-tuned nginx-tuned.conf ;;
	nginx-platform) start_nginx nginx-platform nginx-platform.conf ;;
	direct) return 0 ;;
	esac
	if ! wait_ready "$(addr_of "$1" fast)" $BACKEND_FAST; then
		echo "compare.sh: $1 did not become ready; its log:" >&2
		tail -20 "$WORK/$1.log" >&2
		FAILED=1
		exit 1
	fi
}

stop_subject() { # name
	[ -n "${PID[$1]:-}" ] || return 0
	kill "${PID[$1]}" 2>/dev/null || true
	wait "${PID[$1]}" 2>/dev/null || true
	unset "PID[$1]"
}

addr_of() { # subject fast|std
	local backend=$BACKEND_FAST
	[ "$2" = std ] && backend=$BACKEND_STD
	case "$1" in
	cubeproxy) echo 127.0.0.1:$CUBE_PORT ;;
	cubeproxy-redis) echo 127.0.0.1:$CUBE_REDIS_PORT ;;
	nginx-tuned) echo 127.0.0.1:$NGINX_TUNED_PORT ;;
	nginx-platform) echo 127.0.0.1:$NGINX_PLATFORM_PORT ;;
	direct) echo 127.0.0.1:$backend ;;
	esac
}

all_pids() { local IFS=,; echo "${PID[*]}"; }

# ---- time budget -----------------------------------------------------------------
PLANNED=0 DONE=0 SAMPLES_T0=""
may_rerun() {
	# Rerun only if, at the average pace of the samples so far, the
	# remaining samples plus this rerun still fit in the budget. The pace
	# counts from the first sample: divided over the samples, the build
	# and the subjects' starts before it (83 s on a fresh machine) made it
	# 90 s a sample at first, and no noisy sample of the first scenarios
	# (the first 45 of 99) could be rerun though the run had minutes to
	# spare. In milliseconds: whole seconds rounded up made quick mode's
	# 1.2 s a sample 2 s, and its projection 29 samples × 0.8 s too long.
	local now_ms left=$((PLANNED - DONE))
	now_ms=$(date +%s%3N)
	[ "$DONE" -gt 0 ] || return 1
	local pace=$(((now_ms - SAMPLES_T0) / DONE))
	[ $((now_ms - T0 * 1000 + (left + 1) * pace)) -lt $((BUDGET * 1000)) ]
}

# run_sample label-for-log scenario subject kind rep [scenario flags]
run_sample() {
	local scenario=$1 subject=$2 kind=$3 rep=$4
	shift 4
	local name=$subject pids=""
	[ "$subject" = cubeproxy-redis ] && name=cubeproxy
	[ -n "${PID[$subject]:-}" ] && pids=${PID[$subject]}
	local attempt=0 rc
	while :; do
		set +e
		GOMAXPROCS=1 $PIN_LOAD "$BIN/bench" "$scenario" -addr "$(addr_of "$subject" "$kind")" \
			-subject "$name" -rep "$rep" -attempt "$attempt" -pids "$pids" -own-pids "$(all_pids)" \
			-d "$DUR" -warm "$WARM" -out "$SAMPLES" "$@"
		rc=$?
		set -e
		if [ "$rc" = 3 ] && [ $((attempt + 1)) -lt "$MAX_ATTEMPTS" ] && may_rerun; then
			attempt=$((attempt + 1))
			log "  noisy sample, rerun $attempt"
			continue
		fi
		break
	done
	DONE=$((DONE + 1))
	sleep "$PAUSE" # let closed streams and pooled connections drain
}
PAUSE=0.2

# wanted scenario: whether --only (if given) names it
wanted() { [ -z "$ONLY" ] || [[ $ONLY == *" $1 "* ]]; }

# scenario kind subjects flags...: interleaved reps over the subjects
run_scenario() {
	local scenario=$1 kind=$2 subjects=$3
	shift 3
	wanted "$scenario" || return 0
	local rep s
	log "scenario $scenario $* [$subjects]"
	for rep in $(seq "$REPS"); do
		for s in $subjects; do
			run_sample "$scenario" "$s" "$kind" "$rep" "$@"
		done
	done
}

# idle: every sample starts from a freshly started subject, so that memory
# kept from earlier scenarios does not hide the per-stream cost.
run_idle() {
	local subjects=$1 rep s
	wanted idle || return 0
	log "scenario idle -n $IDLE_N [$subjects]"
	for rep in $(seq "$REPS"); do
		for s in $subjects; do
			stop_subject "$s"
			start_subject "$s"
			sleep 0.3
			local saved=$DUR
			DUR=$IDLE_HOLD
			# RSS does not depend on CPU noise: no reruns for idle samples.
			run_sample idle "$s" fast "$rep" -n "$IDLE_N" -max-other 100
			DUR=$saved
		done
	done
}

# ---- run -------------------------------------------------------------------------
SUBJECTS="nginx-tuned nginx-platform direct"
PROXIES="nginx-tuned nginx-platform"
COLD_SUBJECTS="direct"
if [ "$HAVE_CUBE" = 1 ]; then
	cube_flags
	SUBJECTS="cubeproxy $SUBJECTS"
	PROXIES="cubeproxy $PROXIES"
	[ "$HAVE_CUBE_REDIS" = 1 ] && COLD_SUBJECTS="cubeproxy-redis direct"
fi
n_subj=$(wc -w <<<"$SUBJECTS")
n_prox=$(wc -w <<<"$PROXIES")
n_cold=$(wc -w <<<"$COLD_SUBJECTS")
# Only the scenarios this run makes count: with --only, planning all of
# them made may_rerun expect samples that never come, so no noisy sample
# was ever rerun.
per_rep=0
for sc in http bytes sse sse sse ws mcp; do wanted $sc && per_rep=$((per_rep + n_subj)); done
wanted cold && per_rep=$((per_rep + n_cold))
wanted idle && per_rep=$((per_rep + n_prox))
PLANNED=$((REPS * per_rep))

# A smoke run ends within 3 minutes on a fresh machine too, where the first
# build takes half of them (83 s on 2 cores): the windows shrink to fit what
# is left, down to 300 + 100 ms. A warm build cache leaves them as set above.
# QUICK_FIXED is what the run spends outside the windows and the pauses
# between samples: the subjects' starts, cold's longer pauses, idle's
# restarts, the micro-benchmarks and the report (≈ 30 s, measured).
if [ "$MODE" = quick ] && [ -z "$ONLY" ]; then
	QUICK_LIMIT=175 QUICK_FIXED=30
	left=$((QUICK_LIMIT - QUICK_FIXED - ($(date +%s) - T0)))
	per=$((left * 1000 / PLANNED - 200)) # ms of windows per sample; 200 = PAUSE
	if [ "$per" -lt 900 ]; then
		[ "$per" -lt 400 ] && per=400
		DUR=$((per * 3 / 4))ms WARM=$((per / 4))ms IDLE_HOLD=$((per * 3 / 4))ms
		log "quick: the build took $(($(date +%s) - T0))s, so each window is $DUR after $WARM of warm-up"
	fi
fi

start_backend
start_redis
for s in $SUBJECTS; do start_subject "$s"; done
[ "$HAVE_CUBE_REDIS" = 1 ] && start_subject cubeproxy-redis
log "mode $MODE: $PLANNED samples planned, budget ${BUDGET}s; $PINNING"
SAMPLES_T0=$(date +%s%3N) # ms

# -gzip: send Accept-Encoding: gzip as browsers and most HTTP clients do; only
# nginx-platform compresses (text/plain, text/event-stream, application/json).
run_scenario http fast "$SUBJECTS" -c 64 -gzip
run_scenario bytes fast "$SUBJECTS" -c 8 -size 65536
run_scenario sse fast "$SUBJECTS" -n 16 -size 256
run_scenario sse fast "$SUBJECTS" -n 32 -size 256 -interval 10ms -gzip
run_scenario sse fast "$SUBJECTS" -n 32 -size 4096 -interval 10ms -gzip
run_scenario ws std "$SUBJECTS" -c 32 -size 64
run_scenario mcp std "$SUBJECTS" -m 8 -steps 5
PAUSE=1.5
run_scenario cold fast "$COLD_SUBJECTS" -r "$COLD_R" -c 8 -redis 127.0.0.1:$REDIS_PORT
PAUSE=0.2
# The micro-benchmarks' test binaries build (quick mode) while the idle
# samples run: those measure memory, which CPU taken by the compiler does
# not change, and are never rerun for noise. On a fresh machine this takes
# 21 s off the run.
MICRO_PID=""
if [ "$MICRO_BUILD" = later ]; then
	go test -c -o "$BIN/" ./routing ./proxy ./routing/redisstore >"$WORK/micro-build.log" 2>&1 &
	MICRO_PID=$!
fi
run_idle "$PROXIES"
if [ -n "$MICRO_PID" ]; then
	if ! wait "$MICRO_PID"; then
		cat "$WORK/micro-build.log" >&2
		FAILED=1
		exit 1
	fi
	MICRO_PID=""
fi

# Hot-path micro-benchmarks (go test -bench), after the load runs so they
# do not disturb them: host parsing and cache hit (0 allocs targets, which
# the report judges from this output), header rewriting, a full request
# with and without instrumentation (tracing off), and a cold Redis lookup.
micro() { # package-dir test-binary benchtime pattern; runs where go test would
	(cd "$ROOT/$1" && GOMAXPROCS=1 $PIN_SUBJECT "$BIN/$2" -test.run '^$' -test.benchmem \
		-test.benchtime "$3" -test.bench "$4" 2>&1 | grep -E '^(Benchmark|PASS|FAIL)' | sed "s|^PASS\$|ok  	$1|")
}
MICRO_OUT=""
if [ "$HAVE_CUBE" = 1 ] && [ -z "$ONLY" ]; then
	log "micro-benchmarks"
	MICRO_OUT="$WORK/micro.txt"
	{
		micro routing routing.test "$MICRO_TIME" 'BenchmarkParse$|BenchmarkCacheHit$'
		micro proxy proxy.test "$MICRO_TIME" \
			'BenchmarkHeaderRewrite$|BenchmarkRequestPlain$|BenchmarkRequestInstrumentedTracingOff$'
		micro routing/redisstore redisstore.test "$MICRO_COLD" 'BenchmarkLookupCold$'
	} >"$MICRO_OUT"
fi
# The header's "run took" is the whole run, micro-benchmarks included
# (up to 30 s of a full run); only the report's own writing is left out.
ELAPSED=$(($(date +%s) - T0))
mkdir -p "$(dirname "$OUT")"
"$BIN/bench" report -in "$SAMPLES" -out "$OUT" -mode "$MODE" -elapsed "${ELAPSED}s" -micro "$MICRO_OUT" \
	-nginx "$(nginx -v 2>&1)" -pinning "$PINNING; CubeProxy with its image's GODEBUG=$CUBE_GODEBUG" -have-cube="$([ "$HAVE_CUBE" = 1 ] && echo true || echo false)"
cp "$SAMPLES" "${OUT%.md}.jsonl"
if [ -n "$MICRO_OUT" ]; then
	{
		echo
		echo "## Micro-benchmarks (go test -bench, -benchmem)"
		echo
		echo "GOMAXPROCS=1 on CPU 0. \`RequestPlain\` has no telemetry and no access log;"
		echo "\`RequestInstrumentedTracingOff\` has metrics and a JSON access log to io.Discard."
		echo "A full request (client, proxy and backend in one process) allocates nothing."
		echo
		echo '```'
		cat "$MICRO_OUT"
		echo '```'
		if [ "$MICRO_BUILD" = later ]; then
			echo
			echo "These test binaries compiled while the idle samples ran (quick mode), so"
			echo "the idle table's other CPU % is the compiler's; RSS does not depend on it."
		fi
	} >>"$OUT"
fi
# What the profiles found (kept by hand in bench/FINDINGS.md).
{
	echo
	cat "$ROOT/bench/FINDINGS.md"
} >>"$OUT"
log "done in ${ELAPSED}s: $OUT (samples: ${OUT%.md}.jsonl)"
