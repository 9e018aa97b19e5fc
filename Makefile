# make test: the whole suite, as CI runs it. Installs what the tests need
# (redis-server; node and npm for the TypeScript MCP SDK interop test, which
# runs npm ci in proxy/testdata/tsmcp itself when its node_modules is
# missing or stale; nginx for the differential lab's test; python3, curl
# and openssl for the interop lab's; chromium and firefox-esr for the
# browser test of the signed-link cookies; Python's requests, httpx and
# websockets for the proxy tests that run them, found by a python3 on PATH
# or Debian's /usr/bin/python3, where apt puts them, as the tests look)
# when it is missing, in one apt-get run, and stops the nginx service apt
# may start; a test never skips for a missing part.
.PHONY: test build bench fuzz

test:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	{ command -v node && command -v npm; } >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	{ command -v python3 && command -v curl && command -v openssl; } >/dev/null 2>&1 || missing="$$missing python3 curl openssl"; \
	{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null 2>&1 || missing="$$missing nginx"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	{ command -v firefox-esr || command -v firefox; } >/dev/null 2>&1 || missing="$$missing firefox-esr"; \
	for py in python3 /usr/bin/python3; do $$py -c 'import requests, httpx, websockets' 2>/dev/null && break; done \
		|| missing="$$missing python3-requests python3-httpx python3-websockets"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (the tests use real ones; see the comment above)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
		case "$$missing" in *nginx*) /usr/sbin/nginx -s quit 2>/dev/null || true;; esac; \
	fi
	# The TypeScript MCP interop test's npm ci, started in the background
	# with the test's own lock and stamp (proxy/mcp_tsclient_test.go): on
	# a fresh clone it took 24 s of the proxy package's sequential run,
	# which now finds node_modules installed, or waits on the lock for the
	# rest. The test checks the stamp itself and installs if this failed.
	# Bounded: the test waits on the lock with no deadline, so a hung npm
	# ci would hold the proxy package's run until go test's -timeout.
	cd proxy/testdata/tsmcp && flock .npm-ci.lock sh -c 'sum=$$(sha256sum package-lock.json | cut -c1-64); \
		[ "$$(cat node_modules/.cubeproxy-lock-sha256 2>/dev/null)" = "$$sum" ] || \
		{ timeout -k 10 240 npm ci --no-audit --no-fund && printf %s "$$sum" > node_modules/.cubeproxy-lock-sha256; }' >/dev/null 2>&1 &
	go vet ./...
	# -parallel 16: the tests marked t.Parallel wait on timers, not on the
	# CPU (see proxy/harness_test.go); the default, GOMAXPROCS, ran them
	# two at a time.
	go test -race -count=1 -timeout 9m -parallel 16 ./...
	# The allocation tests, the memory tests (the sizing of every kind of
	# connection, what heads of many lines leave) and the TLS handshake's
	# stack test skip under -race (it changes allocation counts, memory and
	# stacks; config's TestMakefileRunsEveryRaceSkippedTest holds every such
	# test to a line here): run here. The sizing measures
	# each kind in a proxy process of its own, two at a time (the figures
	# are per process, and held the same): what earlier tests or kinds
	# leave in the runtime and in fasthttp's pools moved the count either
	# way (an idle connection after TestLentBodyAllocs's 32 KiB answers
	# 82 KiB against 49; an idle SSE stream after the other kinds 3 KiB
	# against 7-10). The stack test runs on its own too: it counts stacks.
	# The allocation run names the packages that have such tests: on ./...
	# it built and linked a test binary for every other package as well,
	# time a fresh machine's cold build cache pays in full.
	go test -count=1 -run Alloc ./accesslog ./auth ./proxy ./routing ./telemetry
	go test -count=1 -run 'NoMemory|TestREADMESizing' ./proxy
	go test -count=1 -run TestTLSHandshakeStackIsNotTheConnections ./proxy

build:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o cubeproxy ./cmd/cubeproxy

bench:
	bash bench/compare.sh

# make fuzz: every Fuzz target in the tree, one after the other, each for
# FUZZTIME with one worker (a fuzz run takes every core by default), each
# new input minimized for at most 10 s (the default 60 s let a short run on
# a loaded machine spend itself minimizing: 31 executions in 45 s). A
# crasher lands in the package's testdata/fuzz: keep it as a regression.
# Go 1.26's fuzz coordinator can end a clean run "context deadline
# exceeded" as FUZZTIME runs out (go.dev/issue/75804, fixed in Go 1.27):
# a failure whose only message is that, with no input written, is said
# and passed over; any other stops the loop.
FUZZTIME ?= 60s
fuzz:
	@set -e; out=$$(mktemp); rc=$$(mktemp); trap 'rm -f $$out $$rc' EXIT; \
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			d=$$(dirname $$f); echo "== $$d $$t"; \
			before=$$(ls $$d/testdata/fuzz/$$t 2>/dev/null | wc -l); \
			{ if go test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 10s -parallel 1 $$d; \
				then echo 0 > $$rc; else echo 1 > $$rc; fi; } 2>&1 | tee $$out; \
			if [ "$$(cat $$rc)" = 0 ]; then continue; fi; \
			after=$$(ls $$d/testdata/fuzz/$$t 2>/dev/null | wc -l); \
			if [ "$$after" = "$$before" ] && [ "$$(grep -c '^    ' $$out)" = 1 ] && grep -qx '    context deadline exceeded' $$out; then \
				echo "== $$t: ended 'context deadline exceeded' with no input written: Go's fuzz coordinator (go.dev/issue/75804), not a finding"; \
				continue; \
			fi; \
			exit 1; \
		done; \
	done
