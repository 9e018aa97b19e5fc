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
