package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A port another process holds fails the start (exit 1) with the setting
// named and how to choose another, for serve and for the demo, whose
// newcomer meets it first (another server on 8081): the message said
// "http listener: listen tcp :8081: bind: address already in use".
func TestPortInUseNamesTheSetting(t *testing.T) {
	for _, tc := range []struct {
		command, key, flag, env string
	}{
		{"serve", "http_addr", "--http-addr", "CUBEPROXY_HTTP_ADDR"},
		{"serve", "https_addr", "--https-addr", "CUBEPROXY_HTTPS_ADDR"},
		{"serve", "admin_addr", "--admin-addr", "CUBEPROXY_ADMIN_ADDR"},
		{"demo", "http_addr", "--http-addr", "CUBEPROXY_HTTP_ADDR"},
		{"demo", "admin_addr", "--admin-addr", "CUBEPROXY_ADMIN_ADDR"},
	} {
		t.Run(tc.command+" "+tc.key, func(t *testing.T) {
			_, held := holdAddr(t)
			addrs := map[string]string{"--http-addr": "127.0.0.1:0", "--admin-addr": "127.0.0.1:0"}
			if tc.key == "https_addr" {
				addrs["--https-addr"] = "127.0.0.1:0"
			}
			addrs[tc.flag] = held
			args := []string{tc.command, "--routes="}
			for f, a := range addrs {
				args = append(args, f, a)
			}
			var out, errb bytes.Buffer
			// Bounded: a start that wrongly succeeds runs until cancelled.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := run(ctx, args, noEnv, &out, &errb)
			want := tc.key + ` "` + held + `": listen tcp ` + held + ": bind: address already in use" +
				" (another process listens there: stop it, or choose another address with " + tc.flag + " or " + tc.env + ")" +
				" (" + tc.key + " is set by " + tc.flag + ")" // where the address in use came from
			if code != 1 || !strings.Contains(errb.String(), "cubeproxy: "+want+"\n") {
				t.Errorf("exit %d, stderr %q\nwant 1 and: cubeproxy: %s", code, errb.String(), want)
			}
		})
	}
}

// The privileged-port hint goes only with a port below 1024: a refused
// bind of a high port (a raised net.ipv4.ip_unprivileged_port_start, an
// LSM) is not cured by choosing "a port from 1024 up".
func TestListenErrorHintsOnlyForPrivilegedPorts(t *testing.T) {
	const hint = "a port below 1024 needs root"
	for _, tc := range []struct {
		addr string
		hint bool
	}{
		{":80", true},
		{"127.0.0.1:1023", true},
		{":1024", false},
		{":8080", false},
	} {
		ta, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		bindErr := &net.OpError{Op: "listen", Net: "tcp", Addr: ta, Err: os.NewSyscallError("bind", syscall.EACCES)}
		msg := listenError("http_addr", tc.addr, false, bindErr).Error()
		if strings.Contains(msg, hint) != tc.hint {
			t.Errorf("listenError(%q, EACCES) = %q; want the privileged-port hint: %v", tc.addr, msg, tc.hint)
		}
	}
}

// The privileged ports' bound is read from the sysctl's file; a file
// missing (other systems) or unreadable as a number leaves 1024.
func TestUnprivilegedPortStart(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string // "" = no file
		want    int
	}{
		{"1024\n", 1024},
		{"2000\n", 2000},
		{"0\n", 0},
		{"", 1024},
		{"x\n", 1024},
		{"-5\n", 1024},
	} {
		path := filepath.Join(dir, "missing")
		if tc.content != "" {
			path = filepath.Join(dir, "start")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := unprivilegedPortStart(path); got != tc.want {
			t.Errorf("unprivilegedPortStart(%q) = %d, want %d", tc.content, got, tc.want)
		}
	}
}
