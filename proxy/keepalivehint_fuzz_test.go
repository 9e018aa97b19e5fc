package proxy

import (
	"strings"
	"testing"
	"time"
)

// FuzzKeepAliveReuse holds keepAliveReuse, which reads a header every
// sandbox answer may carry, to a plain string reading of RFC 9110 5.6.6
// parameters: the first "timeout" parameter decides, a number of 1 to
// maxKeepAliveHint digits, optionally quoted, gives N seconds less the
// margin, anything else no limit. Whatever the bytes, the answer is never
// negative and never reaches N: a connection kept past the sandbox's own
// timeout is the reset POST the hint exists to avoid.
func FuzzKeepAliveReuse(f *testing.F) {
	for _, s := range []string{
		"", "timeout=5", "timeout=5, max=100", "max=100, timeout=5", " Timeout = 5 ,max=1000",
		"TIMEOUT=30", `timeout="5"`, "timeout=2", "timeout=1", "timeout=0", "timeout=", "timeout=-5",
		"timeout=5s", "timeout=1.5", "timeout=99999999999999999999", "max=100", "timeouts=5",
		"timeout", ",,,", `timeout="`, `timeout=""`, "timeout=999999", "timeout=1000000",
		"timeout=abc, timeout=5", "\u0085timeout=7\u00a0",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		got := keepAliveReuse(v)
		if want := refKeepAliveReuse(string(v)); got != want {
			t.Fatalf("keepAliveReuse(%q) = %v, want %v", v, got, want)
		}
		if got < 0 || got >= time.Duration(1e6)*time.Second {
			t.Fatalf("keepAliveReuse(%q) = %v: out of 0 .. %d digits of seconds", v, got, maxKeepAliveHint)
		}
	})
}

// refKeepAliveReuse is keepAliveReuse written for clarity, not speed.
func refKeepAliveReuse(v string) time.Duration {
	for _, param := range strings.Split(v, ",") {
		param = strings.TrimSpace(param)
		name, num, ok := strings.Cut(param, "=")
		if !ok || !strings.EqualFold(strings.Trim(name, " \t"), "timeout") {
			continue
		}
		num = strings.Trim(num, " \t")
		if len(num) >= 2 && strings.HasPrefix(num, `"`) && strings.HasSuffix(num, `"`) {
			num = num[1 : len(num)-1]
		}
		if num == "" || len(num) > maxKeepAliveHint || strings.Trim(num, "0123456789") != "" {
			return 0
		}
		secs := 0
		for _, c := range num {
			secs = secs*10 + int(c-'0')
		}
		n := time.Duration(secs) * time.Second
		switch {
		case n == 0:
			return 0
		case n <= 2*time.Second:
			return n / 2
		}
		return n - time.Second
	}
	return 0
}
