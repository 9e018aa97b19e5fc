# make test: the whole suite, as CI runs it. Installs what the tests need
# (redis-server) when it is missing; a test never skips for a missing part.
.PHONY: test build bench fuzz

test:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (tests use a real one)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	go vet ./...
	go test -race -count=1 -timeout 9m ./...
	# The allocation tests skip under -race (it changes allocation counts).
	go test -count=1 -run Alloc ./...

build:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o cubeproxy ./cmd/cubeproxy

bench:
	bash bench/compare.sh

fuzz:
	go test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 60s ./routing
	go test -run '^$$' -fuzz '^FuzzStartupSettings$$' -fuzztime 60s ./cmd/cubeproxy
