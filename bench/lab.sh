# Shared by the node labs (bench/mcpts/run.sh, bench/interop/run.sh), which
# source it from the repository's root: node and npm, a work dir removed at
# exit (kept with keep=1), the processes in pids killed, a fresh cubeproxy
# binary in it, and the npm packages given installed there.
#
#   lab_setup NAME PACKAGE...    sets work

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "installing nodejs and npm"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

pids=()
lab_cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	# Gone before the script ends: its lock (interop's flock) goes with it,
	# and the run waiting for it checks first that the lab's ports are
	# free, which a proxy still shutting down was not ("port 18281 is
	# taken"). One still there after 10 s is killed outright.
	local until=$((SECONDS + 10))
	for p in "${pids[@]}"; do
		while kill -0 "$p" 2>/dev/null && ((SECONDS < until)); do sleep 0.05; done
		kill -9 "$p" 2>/dev/null || true
	done
	if ((keep)); then echo "work dir: $work"; else rm -rf "$work"; fi
}

lab_setup() { # name package...
	work=$(mktemp -d "/tmp/cubeproxy-$1.XXXXXX")
	shift
	trap lab_cleanup EXIT
	# The build (CPU) and npm install (the registry) side by side; a
	# package.json written here, as `npm init -y` took 2 s to write it.
	go build -o "$work/cubeproxy" ./cmd/cubeproxy &
	local build=$!
	echo '{"private": true}' >"$work/package.json"
	(cd "$work" && npm install --no-audit --no-fund --loglevel=error "$@" >npm.log 2>&1) ||
		{ cat "$work/npm.log"; wait "$build" || true; exit 1; }
	wait "$build"
}
