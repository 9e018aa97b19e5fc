# make test: the whole suite, as CI runs it. Installs what the tests need
# (redis-server; node and npm for the TypeScript MCP SDK interop test, which
# runs npm ci in proxy/testdata/tsmcp itself when its node_modules is
# missing or stale; nginx for the differential lab's test; python3, curl
# and openssl for the interop lab's) when it is missing; a test never skips
# for a missing part.
.PHONY: test build bench fuzz

test:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (tests use a real one)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
		echo "installing nodejs and npm (the TypeScript MCP SDK client test)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	@{ command -v python3 && command -v curl && command -v openssl; } >/dev/null 2>&1 || { \
		echo "installing python3, curl and openssl (bench's interop lab)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 curl openssl >/dev/null; }
	@{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null 2>&1 || { \
		echo "installing nginx (bench/differ's test compares CubeProxy with the platform's nginx config)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
		/usr/sbin/nginx -s quit 2>/dev/null || true; }
	go vet ./...
	go test -race -count=1 -timeout 9m ./...
	# The allocation tests skip under -race (it changes allocation counts).
	go test -count=1 -run Alloc ./...

build:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o cubeproxy ./cmd/cubeproxy

bench:
	bash bench/compare.sh

# make fuzz: every Fuzz target in the tree, one after the other, each for
# FUZZTIME with one worker (a fuzz run takes every core by default). A
# crasher lands in the package's testdata/fuzz: keep it as a regression.
FUZZTIME ?= 60s
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$(dirname $$f) $$t"; \
			go test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -parallel 1 $$(dirname $$f); \
		done; \
	done
