package config

import (
	"reflect"
	"testing"
)

// A misspelled CUBEPROXY_* variable is reported, with the setting it most
// likely meant; real settings, the config path and Kubernetes' service
// links (a Service named cubeproxy) are not.
func TestUnknownEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		want    []UnknownVar
	}{
		{"none", []string{"PATH=/bin", "HOME=/root"}, nil},
		{"known settings", []string{"CUBEPROXY_ROUTES=r.yaml", "CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT=1s", "CUBEPROXY_CONFIG=c.yaml", "CUBEPROXY_REDIS_SENTINEL_PASSWORD="}, nil},
		{"missing letter", []string{"CUBEPROXY_ROUTE=r.yaml"}, []UnknownVar{{"CUBEPROXY_ROUTE", "CUBEPROXY_ROUTES"}}},
		{"longer spelling", []string{"CUBEPROXY_REDIS_ADDRESS=r:6379"}, []UnknownVar{{"CUBEPROXY_REDIS_ADDRESS", "CUBEPROXY_REDIS_ADDR"}}},
		{"lower case", []string{"CUBEPROXY_admin_token=x"}, []UnknownVar{{"CUBEPROXY_admin_token", "CUBEPROXY_ADMIN_TOKEN"}}},
		{"section missing", []string{"CUBEPROXY_CONNECT_TIMEOUT=1s"}, []UnknownVar{{"CUBEPROXY_CONNECT_TIMEOUT", "CUBEPROXY_UPSTREAM_CONNECT_TIMEOUT"}}},
		{"nothing close", []string{"CUBEPROXY_IMAGE_TAG=v1"}, []UnknownVar{{"CUBEPROXY_IMAGE_TAG", ""}}},
		{"no value", []string{"CUBEPROXY_DOMIANS"}, []UnknownVar{{"CUBEPROXY_DOMIANS", "CUBEPROXY_DOMAINS"}}},
		{"kubernetes service links", []string{
			"CUBEPROXY_SERVICE_HOST=10.96.0.7", "CUBEPROXY_SERVICE_PORT=8081", "CUBEPROXY_SERVICE_PORT_HTTP=8081",
			"CUBEPROXY_PORT=tcp://10.96.0.7:8081", "CUBEPROXY_PORT_8081_TCP=tcp://10.96.0.7:8081",
			"CUBEPROXY_PORT_8081_TCP_PROTO=tcp", "CUBEPROXY_PORT_8081_TCP_PORT=8081", "CUBEPROXY_PORT_8081_TCP_ADDR=10.96.0.7",
		}, nil},
		// Services named cubeproxy-…: a Helm release "cubeproxy" with
		// a Redis subchart (cubeproxy-redis-master), a Service for the
		// admin API or the metrics listener. Their variables were
		// warned about at every start, and listed under every failed
		// one as if misspelled settings.
		{"kubernetes service links of cubeproxy-… Services", []string{
			"CUBEPROXY_REDIS_MASTER_SERVICE_HOST=10.96.0.9", "CUBEPROXY_REDIS_MASTER_SERVICE_PORT=6379",
			"CUBEPROXY_REDIS_MASTER_SERVICE_PORT_TCP_REDIS=6379", "CUBEPROXY_REDIS_MASTER_PORT=tcp://10.96.0.9:6379",
			"CUBEPROXY_REDIS_MASTER_PORT_6379_TCP=tcp://10.96.0.9:6379", "CUBEPROXY_REDIS_MASTER_PORT_6379_TCP_PROTO=tcp",
			"CUBEPROXY_REDIS_MASTER_PORT_6379_TCP_PORT=6379", "CUBEPROXY_REDIS_MASTER_PORT_6379_TCP_ADDR=10.96.0.9",
			"CUBEPROXY_ADMIN_SERVICE_HOST=fd00::9", "CUBEPROXY_ADMIN_PORT=tcp://[fd00::9]:8082",
			"CUBEPROXY_ADMIN_PORT_8082_TCP_ADDR=fd00::9", "CUBEPROXY_METRICS_PORT_18082_UDP=udp://10.96.0.8:18082",
		}, nil},
		// The shape of a link's name is not enough: its value must be a
		// link's too, or a misspelled setting could hide behind it.
		{"link names with other values", []string{
			"CUBEPROXY_REDIS_PORT=6379", "CUBEPROXY_ADMIN_SERVICE_HOST=admin.internal",
			"CUBEPROXY_TLS_REDIRECT_PORT_443_TCP_PORT=x", "CUBEPROXY_REDIRECT_PORT=443",
		}, []UnknownVar{
			{"CUBEPROXY_ADMIN_SERVICE_HOST", ""}, {"CUBEPROXY_REDIRECT_PORT", "CUBEPROXY_TLS_REDIRECT_PORT"},
			{"CUBEPROXY_REDIS_PORT", ""}, {"CUBEPROXY_TLS_REDIRECT_PORT_443_TCP_PORT", ""},
		}},
		// A link has at most PORT_<n>_<PROTO>_<PORT|PROTO|ADDR>, and its
		// PROTO is the protocol of its name.
		{"longer than a link, or a PROTO of another protocol", []string{
			"CUBEPROXY_PORT_8081_TCP_ADDR_X=10.96.0.7", "CUBEPROXY_PORT_8081_TCP_PROTO=udp",
		}, []UnknownVar{{"CUBEPROXY_PORT_8081_TCP_ADDR_X", ""}, {"CUBEPROXY_PORT_8081_TCP_PROTO", ""}}},
		// Port 0 is no Service's, and a link's URL is tcp://, udp:// or sctp://.
		{"port 0, or a URL of another scheme", []string{"CUBEPROXY_SERVICE_PORT=0", "CUBEPROXY_PORT=http://10.96.0.7:8081"},
			[]UnknownVar{{"CUBEPROXY_PORT", ""}, {"CUBEPROXY_SERVICE_PORT", ""}}},
		// Two settings end in _PASSWORD: naming either would be a guess.
		{"suffix of two settings", []string{"CUBEPROXY_PASSWORD=x"}, []UnknownVar{{"CUBEPROXY_PASSWORD", ""}}},
		{"sorted", []string{"CUBEPROXY_ZZZ=1", "CUBEPROXY_DRAIN_TIMOUT=5s"}, []UnknownVar{{"CUBEPROXY_DRAIN_TIMOUT", "CUBEPROXY_DRAIN_TIMEOUT"}, {"CUBEPROXY_ZZZ", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := UnknownEnv(tc.environ); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("UnknownEnv(%q) = %+v, want %+v", tc.environ, got, tc.want)
			}
		})
	}
}

// A variable spelling a setting that exists only in the YAML file (a list
// of sections, a map) is named as such: "not a setting" alone left an
// operator who set CUBEPROXY_TLS_FILES to guess why the file's key works
// and the variable does not.
func TestFileOnlySetting(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"CUBEPROXY_TLS_FILES", "tls.files"},
		{"CUBEPROXY_TLS_FILES_0_CERT_FILE", "tls.files"},
		{"CUBEPROXY_TLS_ACME_DNS_OPTIONS", "tls.acme.dns.options"},
		{"CUBEPROXY_TLS_ACME_DNS_OPTIONS_SERVER", "tls.acme.dns.options"},
		{"CUBEPROXY_TLS_FILESYSTEM", ""},
		{"CUBEPROXY_ROUTE", ""},
		{"CUBEPROXY_TLS_CERT_FILE", ""}, // a setting: no note at all
	} {
		if got := FileOnlySetting(tc.name); got != tc.want {
			t.Errorf("FileOnlySetting(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
