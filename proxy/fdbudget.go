package proxy

import "log/slog"

// descriptorHeadroom is what the check below leaves the process beyond
// its client and sandbox connections: the listeners, the admin listener's
// reserve and probes, log files, the runtime's own descriptors and a few
// Redis connections (a proxy with the memory store holds about 20 at
// start).
const descriptorHeadroom = 64

// warnDescriptorBudget warns, as nginx warns of worker_connections that
// exceed the open files limit, when client.max_conns cannot be reached
// within the descriptor limit: every stream, WebSocket or request in
// flight holds two descriptors, the client's and the sandbox's. Then the
// descriptors run out first, and at that limit new clients wait in the
// listen backlog (a 4,096 limit with client.max_conns 2,040: 2,038 streams
// and the next client waited without an answer) instead of getting 503
// proxy_overloaded at once, and the connections waiting for a request are
// not closed for them, which client.max_conns is there for. limit 0
// (unknown) or maxConns 0 (no bound) check nothing.
func warnDescriptorBudget(log *slog.Logger, maxConns int, limit uint64) {
	if maxConns <= 0 || limit == 0 {
		return
	}
	fits := uint64(0)
	if limit > descriptorHeadroom {
		fits = (limit - descriptorHeadroom) / 2
	}
	if uint64(maxConns) <= fits {
		return
	}
	log.Warn("client.max_conns exceed what the open files limit holds: each stream, WebSocket or request in flight takes two descriptors (client and sandbox), so the descriptors run out first and new clients then wait in the listen backlog instead of getting 503 proxy_overloaded; lower client.max_conns or raise the limit (systemd LimitNOFILE=, docker --ulimit nofile=) above twice it plus 64",
		"max_conns", maxConns, "open_files_limit", limit, "max_conns_within_limit", fits)
}
