package config

import (
	"strings"
	"testing"
)

// A Redis address the client could never dial is refused at the start,
// naming its key, rather than passing check and leaving serve unready for
// good ("dial tcp: address 99999: invalid port" once a second in the log).
// A password in redis.url is never part of the error.
func TestRedisAddressesAreDialable(t *testing.T) {
	const redis = "store: redis\nredis:\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"addr without a port", redis + "  addr: redis.internal\n", `redis.addr "redis.internal": address redis.internal: missing port in address; want host:port, for example 127.0.0.1:6379`},
		{"addr port above 65535", redis + "  addr: redis.internal:99999\n", `redis.addr "redis.internal:99999": port 99999 is above 65535`},
		{"addr port zero", redis + "  addr: redis.internal:0\n", `redis.addr "redis.internal:0": port 0 cannot be dialed`},
		{"addr empty port", redis + "  addr: 'redis.internal:'\n", `redis.addr "redis.internal:": port 0 cannot be dialed`},
		{"addr port no number", redis + "  addr: redis.internal:sixthree\n", `redis.addr "redis.internal:sixthree": port "sixthree" is no number and no known service`},
		{"sentinel addr", redis + "  sentinel:\n    master_name: m\n    addrs: [10.0.0.1:26379, 10.0.0.2]\n", `an entry of redis.sentinel.addrs "10.0.0.2": address 10.0.0.2: missing port in address; want host:port, for example 10.0.0.5:26379`},
		{"cluster addr", redis + "  cluster:\n    addrs: ['10.0.0.1:70000']\n", `an entry of redis.cluster.addrs "10.0.0.1:70000": port 70000 is above 65535; want host:port, for example 10.0.0.5:6379`},
		{"url port above 65535", redis + "  url: redis://proxy:hunter2@redis.internal:99999/0\n", `redis.url: host "redis.internal:99999": port 99999 is above 65535`},
		{"url port zero", redis + "  url: rediss://redis.internal:0\n", `redis.url: host "redis.internal:0": port 0 cannot be dialed`},
		// A raw '/', '?' or '#' in the password ends the authority: the
		// host would be "proxy:0" and the rest go-redis's db or option.
		{"url password with a raw slash", redis + "  url: 'redis://proxy:0/hunter2@redis.internal:6379'\n", `redis.url redis://xxxxx@redis.internal:6379: its user name or password holds a raw '/', '?' or '#'`},
		{"url password with a raw hash", redis + "  url: 'redis://proxy:#hunter2@redis.internal:6379'\n", `redis.url redis://xxxxx@redis.internal:6379: its user name or password holds a raw`},
		{"url password with a raw question mark", redis + "  url: 'redis://:?hunter2@redis.internal:6379'\n", `redis.url redis://xxxxx@redis.internal:6379: its user name or password holds a raw`},
		{"url password encoded", redis + "  url: 'redis://proxy:0%2Fhun%3Fter%232@redis.internal:6379'\n", ""},
		{"addr", redis + "  addr: redis.internal:6379\n", ""},
		{"addr ipv6", redis + "  addr: '[::1]:6379'\n", ""},
		{"url without a port", redis + "  url: redis://proxy:hunter2@redis.internal/0\n", ""},
		{"url with an empty port", redis + "  url: 'redis://redis.internal:/0'\n", ""},
		{"url", redis + "  url: redis://proxy:hunter2@redis.internal:6380/0\n", ""},
		{"sentinel", redis + "  sentinel:\n    master_name: m\n    addrs: [10.0.0.1:26379, '[::1]:26379']\n", ""},
		{"cluster", redis + "  cluster:\n    addrs: [10.0.0.1:7000]\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loadWants(t, tc.yaml, tc.want)
			if tc.want != "" {
				_, err := Load([]string{"--config", writeFile(t, tc.yaml)}, env(nil), nil)
				if strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("error %q shows the password", err)
				}
			}
		})
	}
}
