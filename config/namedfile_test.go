//go:build unix

package config

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The config file must be a regular file or a pipe of at most 4 MiB:
// /dev/zero or a huge file named by mistake was read until the process ran
// out of memory.
func TestLoadRefusesWhatIsNoConfigFile(t *testing.T) {
	dir := t.TempDir()
	sparse := testenv.SparseFile(t, dir, "huge.yaml", 4<<20+1)
	for _, tc := range []struct {
		name, path, want string
	}{
		{"directory", dir, "is a directory, not a regular file"},
		{"/dev/zero", "/dev/zero", "is a character device, not a regular file"},
		{"sparse file above 4 MiB", sparse, "above the 4 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := Load([]string{"--config", tc.path}, env(nil), io.Discard)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Load --config %s has not returned after 10s", tc.path)
			}
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error naming %s: %q", err, tc.path, tc.want)
			}
		})
	}
}

// A configuration made on the spot comes through a pipe: `--config
// <(envsubst < tmpl)` names /dev/fd/N, `--config /dev/stdin` a pipe too,
// and a named FIFO is read once its writer comes. A pipe that gives
// nothing (the command meant to write it failed) or too much is refused,
// not taken for an empty configuration.
func TestLoadConfigFromAPipe(t *testing.T) {
	const yaml = "http_addr: 127.0.0.1:18999\n"
	fifo := testenv.Mkfifo(t, t.TempDir(), "cubeproxy.fifo")
	for _, tc := range []struct {
		name  string
		write []byte
		fifo  bool   // a named FIFO, else an anonymous pipe named by /dev/fd/N
		want  string // "" loads, with http_addr from the pipe
	}{
		{"anonymous pipe", []byte(yaml), false, ""},
		{"named FIFO", []byte(yaml), true, ""},
		{"empty pipe", nil, false, "a pipe, gave nothing"},
		{"pipe above 4 MiB", make([]byte, 4<<20+1), false, "gave more than the 4 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := fifo
			var w *os.File
			if !tc.fifo {
				r, pw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				w = pw
				path = fmt.Sprintf("/dev/fd/%d", r.Fd())
			}
			go func() {
				f := w
				if f == nil {
					var err error
					if f, err = os.OpenFile(fifo, os.O_WRONLY, 0); err != nil {
						return
					}
				}
				f.Write(tc.write)
				f.Close()
			}()
			done := make(chan struct{})
			var cfg *Config
			var err error
			go func() {
				defer close(done)
				cfg, err = Load([]string{"--config", path}, env(nil), io.Discard)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Load --config %s has not returned after 10s", path)
			}
			if tc.want == "" {
				if err != nil || cfg.HTTPAddr != "127.0.0.1:18999" {
					t.Fatalf("Load = %+v, %v; want http_addr from the pipe", cfg, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error naming %s: %q", err, path, tc.want)
			}
		})
	}
}
