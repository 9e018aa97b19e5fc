package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/cube-sandbox/cubeproxy/internal/namedfile"
)

// AdminAddr reads admin_addr alone, from where LoadCommand would take it:
// the file at path (CUBEPROXY_CONFIG when path is empty), then
// CUBEPROXY_ADMIN_ADDR, else the default. No other setting is read or
// checked: `cubeproxy health` asks a running proxy, whose file may since
// have been edited into one that no longer loads (an unknown key, a bad
// value elsewhere), and the running proxy is not the worse for it.
func AdminAddr(path string, getenv func(string) string) (string, error) {
	addr := Default().AdminAddr
	if path == "" {
		path = getenv(EnvPrefix + "CONFIG")
	}
	if path != "" {
		data, err := namedfile.ReadOnce(path, namedfile.MaxSmall)
		if err != nil {
			return "", fmt.Errorf("read config: %w", err)
		}
		var doc struct {
			AdminAddr *string `yaml:"admin_addr"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return "", fmt.Errorf("config %s: %w", path, err)
		}
		if doc.AdminAddr != nil {
			addr = *doc.AdminAddr
		}
	}
	if v := getenv(EnvPrefix + "ADMIN_ADDR"); v != "" {
		addr = v
	}
	return addr, nil
}
