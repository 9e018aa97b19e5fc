package accesslog

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

var testTime = time.Date(2026, time.November, 30, 4, 47, 48, 123456789, time.UTC)

func fullEntry() *Entry {
	return &Entry{
		Time:                 testTime,
		Host:                 "50005-sb1.example.com",
		RemoteAddr:           "203.0.113.9",
		XRealIP:              "198.51.100.7",
		XForwardedFor:        "198.51.100.7, 10.0.0.1",
		ServerAddr:           "10.0.0.5",
		XForwardedProto:      "https",
		Method:               "POST",
		RequestURI:           "/mcp?session=abc&cube_token=s3cr3t-token",
		Args:                 "session=abc&cube_token=s3cr3t-token",
		Protocol:             "HTTP/1.1",
		URI:                  "/mcp",
		Status:               200,
		BodyBytesSent:        5120,
		BytesIn:              42,
		RequestTime:          3*time.Millisecond + 900*time.Microsecond,
		ConnectionRequests:   7,
		UpstreamAddr:         "10.0.0.8:32001",
		UpstreamStatus:       200,
		UpstreamRetries:      1,
		UpstreamRetryCode:    "upstream_reset",
		UpstreamResponseTime: 2 * time.Millisecond,
		UserAgent:            "agent/1.0",
		RequestID:            "req-123",
		InstanceID:           "inst-9",
		BackendIP:            "10.0.0.8",
		SandboxID:            "sb1",
		Port:                 50005,
		RouteKind:            "sse",
		ErrorCode:            "",
		CacheResult:          "hit",
	}
}

func cubeLine(e *Entry) string { return string(appendCube(nil, e, testTime, newStamps(accessTime))) }

func TestCubeLineFieldByField(t *testing.T) {
	want := []string{
		"2026-11-30T04:47:48.123",              // access_time
		"50005-sb1.example.com",                // host
		"198.51.100.7",                         // x_real_ip
		"198.51.100.7, 10.0.0.1",               // x_forwarded_for
		"10.0.0.5",                             // server_addr
		"https",                                // x_forwarded_proto
		"POST",                                 // method
		"/mcp?session=abc&cube_token=REDACTED", // request_uri
		"session=abc&cube_token=REDACTED",      // args
		"HTTP/1.1",                             // protocol
		"/mcp",                                 // uri
		"200",                                  // status
		"5120",                                 // body_bytes_sent
		"0.003",                                // request_time (truncated like nginx)
		"7",                                    // connection_requests
		"10.0.0.8:32001",                       // upstream_addr
		"200",                                  // upstream_status
		"0.002",                                // upstream_response_time
		"agent/1.0",                            // user_agent
		"req-123",                              // x_cube_request_id
		"inst-9",                               // x_cube_instance_id
		"10.0.0.8",                             // backend_ip
	}
	got := strings.Split(cubeLine(fullEntry()), "||")
	if len(got) != 22 {
		t.Fatalf("%d fields, want 22: %q", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d = %q, want %q", i+1, got[i], want[i])
		}
	}
}

func TestCubeMissingValues(t *testing.T) {
	got := strings.Split(cubeLine(&Entry{Time: testTime}), "||")
	want := []string{"2026-11-30T04:47:48.123", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
		"-", "0", "0.000", "-", "-", "-", "-", "-", "-", "-", "-"}
	if strings.Join(got, "||") != strings.Join(want, "||") {
		t.Errorf("empty entry:\n got %q\nwant %q", got, want)
	}
	// A negative byte count (none the proxy means to give) is logged as
	// 0, as nginx's $body_bytes_sent never goes below it: a reader that
	// sums the field is not thrown off.
	if f := strings.Split(cubeLine(&Entry{Time: testTime, BodyBytesSent: -1}), "||")[12]; f != "0" {
		t.Errorf("body_bytes_sent -1 logged as %q, want 0", f)
	}
	// A zero Time means "now".
	if line := string(appendCube(nil, &Entry{}, testTime, newStamps(accessTime))); !strings.HasPrefix(line, "2026-11-30T04:47:48.123||") {
		t.Errorf("zero time not replaced by now: %q", line)
	}
	// The time of day is the entry's zone's, without the zone, as the
	// platform's log_phase.lua writes os.date's local time.
	e := &Entry{Time: testTime.In(time.FixedZone("CST", 8*3600))}
	if line := cubeLine(e); !strings.HasPrefix(line, "2026-11-30T12:47:48.123||") {
		t.Errorf("zoned time: %q", line)
	}
}

func TestCubeEscaping(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain ascii", "plain ascii"},
		{"a||b", `a\x7C\x7Cb`},
		{"line\nbreak\r", `line\x0Abreak\x0D`},
		{`quote"back\slash`, `quote\x22back\x5Cslash`},
		{"tab\there", `tab\x09here`},
		{"é", `\xC3\xA9`},
		{"\x7f", `\x7F`},
	}
	for _, tt := range tests {
		e := &Entry{Time: testTime, UserAgent: tt.in, RequestURI: "/" + tt.in}
		fields := strings.Split(cubeLine(e), "||")
		if len(fields) != 22 {
			t.Errorf("%q: %d fields, want 22", tt.in, len(fields))
			continue
		}
		if fields[18] != tt.want {
			t.Errorf("user_agent %q logged as %q, want %q", tt.in, fields[18], tt.want)
		}
		if fields[7] != "/"+tt.want {
			t.Errorf("request_uri %q logged as %q, want %q", "/"+tt.in, fields[7], "/"+tt.want)
		}
	}
}

func TestSecondsFormat(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0.000"},
		{3 * time.Millisecond, "0.003"},
		{999999 * time.Microsecond, "0.999"},
		{1234567 * time.Microsecond, "1.234"},
		{61 * time.Second, "61.000"},
		{2 * time.Hour, "7200.000"},
		{-5 * time.Millisecond, "0.000"},
	}
	for _, tt := range tests {
		if got := string(appendSeconds(nil, tt.d)); got != tt.want {
			t.Errorf("%v -> %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestRedaction(t *testing.T) {
	const secret = "s3cr3t"
	tests := []struct{ uri, want string }{
		{"/p?cube_token=" + secret, "/p?cube_token=REDACTED"},
		{"/p?a=1&cube_token=" + secret + "&b=2", "/p?a=1&cube_token=REDACTED&b=2"},
		{"/p?CUBE_TOKEN=" + secret, "/p?CUBE_TOKEN=REDACTED"},
		{"/p?cube%5Ftoken=" + secret, "/p?cube%5Ftoken=REDACTED"},
		{"/p?cube%5ftoken=" + secret + "&cube_token=" + secret, "/p?cube%5ftoken=REDACTED&cube_token=REDACTED"},
		{"/p?cube_token=&x=1", "/p?cube_token=REDACTED&x=1"},
		{"/p?cube_tokens=keep&xcube_token=keep", "/p?cube_tokens=keep&xcube_token=keep"},
		{"/p?cube_token", "/p?cube_token"},
		// A name without a value holds no token: what follows it is kept.
		{"/p?cube_token&x=1", "/p?cube_token&x=1"},
		{"/p?cube_token#frag", "/p?cube_token#frag"},
		{"/cube_token=inpath", "/cube_token=inpath"},
		{"/p?", "/p?"},
		{"/p?&&", "/p?&&"},
		// Names a lenient parser reads as cube_token: '+' and %20 decode
		// to a space, which trimming parsers (and PHP, leading ones) drop;
		// PHP files ' ' and '.' in a name under '_'; PHP, Rack and qs read
		// cube_token[] and cube_token[0] as an array named cube_token.
		{"/p?cube_token+=" + secret + "&b=2", "/p?cube_token+=REDACTED&b=2"},
		{"/p?cube_token%20=" + secret, "/p?cube_token%20=REDACTED"},
		{"/p?+%09cube_token%0D=" + secret, "/p?+%09cube_token%0D=REDACTED"},
		{"/p?cube+token=" + secret, "/p?cube+token=REDACTED"},
		{"/p?Cube.Token=" + secret, "/p?Cube.Token=REDACTED"},
		{"/p?cube%2etoken=" + secret, "/p?cube%2etoken=REDACTED"},
		{"/p?cube_token[]=" + secret + "&cube_token%5B0%5D=" + secret, "/p?cube_token[]=REDACTED&cube_token%5B0%5D=REDACTED"},
		{"/p?cube_token+[x]=" + secret, "/p?cube_token+[x]=REDACTED"},
		// PHP reads a name as a C string: a NUL ends it, so
		// "cube_token%00x" is its cube_token.
		{"/p?cube_token%00=" + secret + "&cube.token+%00x=" + secret, "/p?cube_token%00=REDACTED&cube.token+%00x=REDACTED"},
		// Other names stay: no parser reads these as cube_token.
		{"/p?cube-token=keep&cube__token=keep&cube_token_=keep", "/p?cube-token=keep&cube__token=keep&cube_token_=keep"},
		{"/p?my+cube_token=keep&cube_token+x=keep&cube_tokenx[]=keep", "/p?my+cube_token=keep&cube_token+x=keep&cube_tokenx[]=keep"},
		{"/p?cube[token]=keep&cube_toke=keep", "/p?cube[token]=keep&cube_toke=keep"},
		// A cut escape at a name's end is no escape: kept, and read safely.
		{"/p?cube_token%5=keep&%2=keep&%=keep", "/p?cube_token%5=keep&%2=keep&%=keep"},
	}
	for _, tt := range tests {
		got := string(appendRedactedURI(nil, tt.uri, appendCubeEscaped))
		if got != tt.want {
			t.Errorf("uri %q -> %q, want %q", tt.uri, got, tt.want)
		}
		q := tt.uri[strings.IndexByte(tt.uri, '?')+1:]
		if strings.Contains(tt.uri, "?") {
			wantQ := tt.want[strings.IndexByte(tt.want, '?')+1:]
			if gotQ := string(appendRedactedQuery(nil, q, appendJSONEscaped)); gotQ != wantQ {
				t.Errorf("args %q -> %q, want %q", q, gotQ, wantQ)
			}
		}
		// Whole lines in both formats never carry the secret.
		e := &Entry{Time: testTime, RequestURI: tt.uri, Args: q}
		if strings.Contains(tt.want, "REDACTED") {
			for _, line := range []string{cubeLine(e), string(appendJSON(nil, e, testTime, newStamps(jsonTime)))} {
				if strings.Contains(line, secret) {
					t.Errorf("line leaks the token: %s", line)
				}
			}
		}
	}
}

func TestJSONLine(t *testing.T) {
	line := appendJSON(nil, fullEntry(), testTime, newStamps(jsonTime))
	var got map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, line)
	}
	want := map[string]any{
		"time": "2026-11-30T04:47:48.123Z", "remote_addr": "203.0.113.9", "host": "50005-sb1.example.com",
		"method": "POST", "request_uri": "/mcp?session=abc&cube_token=REDACTED",
		"args": "session=abc&cube_token=REDACTED", "uri": "/mcp", "protocol": "HTTP/1.1",
		"status": json.Number("200"), "body_bytes_sent": json.Number("5120"), "bytes_in": json.Number("42"),
		"request_time": json.Number("0.003"), "connection_requests": json.Number("7"),
		"sandbox_id": "sb1", "port": json.Number("50005"), "route_kind": "sse", "cache_result": "hit",
		"error_code": "", "upstream_addr": "10.0.0.8:32001", "upstream_status": json.Number("200"),
		"upstream_response_time": json.Number("0.002"), "upstream_retries": json.Number("1"),
		"upstream_retry_code": "upstream_reset", "backend_ip": "10.0.0.8", "server_addr": "10.0.0.5",
		"x_real_ip": "198.51.100.7", "x_forwarded_for": "198.51.100.7, 10.0.0.1", "x_forwarded_proto": "https",
		"user_agent": "agent/1.0", "x_cube_request_id": "req-123", "x_cube_instance_id": "inst-9",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d keys, want %d: %s", len(got), len(want), line)
	}

	// No upstream: its numbers are null, the keys stay. The line is
	// dated by its entry (the request's start), not by when it is written.
	var empty map[string]any
	if err := json.Unmarshal(appendJSON(nil, &Entry{Time: testTime}, testTime.Add(90*time.Second), newStamps(jsonTime)), &empty); err != nil {
		t.Fatal(err)
	}
	if empty["time"] != want["time"] {
		t.Errorf("time = %#v, want the entry's %#v", empty["time"], want["time"])
	}
	for _, k := range []string{"upstream_status", "upstream_response_time"} {
		if v, ok := empty[k]; !ok || v != nil {
			t.Errorf("%s = %#v (present %v), want null", k, v, ok)
		}
	}
	if len(empty) != len(want) {
		t.Errorf("empty entry has %d keys, want %d", len(empty), len(want))
	}

	// A refusal: the proxy's error code, and no upstream.
	var refused map[string]any
	e := &Entry{Time: testTime, Status: 404, ErrorCode: "sandbox_not_found"}
	if err := json.Unmarshal(appendJSON(nil, e, testTime, newStamps(jsonTime)), &refused); err != nil {
		t.Fatal(err)
	}
	if refused["error_code"] != "sandbox_not_found" || refused["status"] != 404.0 {
		t.Errorf("refusal logged as error_code %#v, status %#v", refused["error_code"], refused["status"])
	}
}

// FuzzJSONEscape checks that any string survives a JSON line exactly as
// encoding/json would carry it.
func FuzzJSONEscape(f *testing.F) {
	for _, s := range []string{"", "plain", `q"b\`, "ctl\x00\x01\x1f\b\f\n\r\t", "é中文🙂", "bad\xff\xfeutf8", "\u2028\u2029", "<>&", "\xed\xa0\x80",
		"u:p@w@Box.test", "@Box.test", "Mozilla/5.0 (X11; Linux x86_64) ~!#$%&'*+,-./:;<=>?@[]^_`{|}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		line := appendJSON(nil, &Entry{Time: testTime, UserAgent: s, Host: s}, testTime, newStamps(jsonTime))
		var got map[string]any
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("invalid JSON for %q: %v\n%s", s, err, line)
		}
		// Valid JSON raw, but a line break to JavaScript and to viewers
		// that follow Unicode: escaped, as encoding/json escapes them.
		// Invalid UTF-8 is written as U+FFFD: a log reader that checks
		// its input (RFC 8259 §8.1) would refuse the whole line.
		if !utf8.Valid(line) {
			t.Fatalf("%q: line is not valid UTF-8: %q", s, line)
		}
		if strings.ContainsAny(string(line), "\u2028\u2029") {
			t.Fatalf("%q: line carries U+2028 or U+2029 unescaped: %s", s, line)
		}
		ref, _ := json.Marshal(s)
		var want string
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if got["user_agent"] != want {
			t.Errorf("%q decoded as %q, encoding/json gives %q", s, got["user_agent"], want)
		}
		// Printable ASCII other than '"' and '\\' is written as it is,
		// as encoding/json writes it: a user agent is mostly spaces and
		// punctuation, each worth six bytes escaped.
		if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '"' || r == '\\' }) &&
			!strings.Contains(string(line), `"user_agent":"`+s+`"`) {
			t.Errorf("%q not written as it is: %s", s, line)
		}
		// The host's userinfo is redacted (appendRedactedHost).
		if at := strings.LastIndexByte(want, '@'); at > 0 {
			want = redacted + want[at:]
		}
		if got["host"] != want {
			t.Errorf("host %q decoded as %q, want %q", s, got["host"], want)
		}
	})
}

// FuzzCubeFields checks that no value can add a field or a line break,
// and that every value reads back from its field unchanged.
func FuzzCubeFields(f *testing.F) {
	for _, s := range []string{"", "||", "|", "a\nb", "x||y||z", "\r\n", "é", "-", "/a/../b%7C%7C", "/%2e%2E/x",
		"/a%3Fcube_token=t/..", "//u:p@h/a/..", "//h/a/./b", "/a?cube_token=t&b=1", "/%7C%0A/./"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := &Entry{Time: testTime, Host: s, XForwardedFor: s, RequestURI: s, Args: s, URI: s,
			UserAgent: s, RequestID: s, InstanceID: s, BackendIP: s, UpstreamAddr: s}
		line := cubeLine(e)
		if n := len(strings.Split(line, "||")); n != 22 {
			t.Errorf("%q gives %d fields: %s", s, n, line)
		}
		if strings.ContainsAny(line, "\n\r") {
			t.Errorf("%q leaks a line break: %q", s, line)
		}
		// And the value can be read back: each field that holds it
		// unescapes to it exactly, so a log pipeline loses nothing (but
		// "-", which stands for empty, as in nginx, and the target's
		// fields, which are redacted).
		fields := strings.Split(line, cubeSep)
		if u, ok := nginxURI(s); (!ok || u == s) && fields[10] != fields[7] {
			t.Errorf("uri %q and request_uri %q of the same %q differ", fields[10], fields[7], s)
		}
		// The uri field reads back as nginx's $uri of the path (the path
		// as sent where nginx refuses it, or where its "//" starts an
		// authority whose userinfo is redacted), with spans redacted and
		// nothing else changed.
		if s != "" && s != "-" {
			got, resolved := unescapeCube(fields[10]), s
			if u, ok := nginxURI(s); ok {
				resolved = u
			}
			if !keptFrom(resolved, got) && !(strings.HasPrefix(s, "//") && keptFrom(s, got)) {
				t.Errorf("uri of %q reads back as %q, want %q with spans redacted", s, got, resolved)
			}
		}
		for _, i := range []int{1, 3, 15, 18, 19, 20, 21} {
			want := s
			if i == 1 {
				if want = nginxHost(s); want == "-" {
					want = "" // "-." is nginx's "-" too, and reads as missing
				}
			}
			if got := unescapeCube(fields[i]); s != "" && s != "-" && got != want {
				t.Errorf("field %d of %q reads back as %q, want %q: %s", i, s, got, want, line)
			}
		}
	})
}

// A line's time reads as time.AppendFormat writes it, whether its second
// was formatted before or not: across seconds, in zones that change
// between lines of the same second, at the millisecond's edges, and as now
// for an entry without a time.
func TestStampsMatchAppendFormat(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("NPT", 5*3600+45*60), time.FixedZone("", -(3*3600 + 30*60)), time.Local}
	for _, layout := range []string{jsonTime, accessTime} {
		t.Run(layout, func(t *testing.T) {
			ts := newStamps(layout)
			base := time.Date(2026, 11, 30, 23, 59, 58, 999_000_000, time.UTC)
			for k := range 60 {
				// Steps of 337 ms cross seconds (and a day and a month);
				// the zone changes every second line, often within a second.
				at := base.Add(time.Duration(k) * 337 * time.Millisecond).In(zones[k/2%len(zones)])
				if got, want := string(ts.append(nil, at, time.Time{})), at.Format(layout); got != want {
					t.Fatalf("line %d: %q, want %q", k, got, want)
				}
				if got, want := string(ts.append([]byte("x"), time.Time{}, at)), "x"+at.Format(layout); got != want {
					t.Fatalf("line %d, no time of its own: %q, want %q", k, got, want)
				}
			}
		})
	}
}

func BenchmarkStamp(b *testing.B) {
	now := time.Now()
	b.Run("AppendFormat", func(b *testing.B) {
		buf := make([]byte, 0, 64)
		for b.Loop() {
			buf = now.AppendFormat(buf[:0], jsonTime)
		}
	})
	b.Run("stamps", func(b *testing.B) {
		ts, buf := newStamps(jsonTime), make([]byte, 0, 64)
		for b.Loop() {
			buf = ts.append(buf[:0], now, time.Time{})
		}
	})
}

// A secret that fasthttp does not read as a query parameter is still a
// secret: a cube_token in a fragment (which the proxy forwards as sent),
// after a separator other parsers split on, or the userinfo of an
// absolute-form target (a password) never reaches a line, in request_uri,
// args or uri, as fillEntry splits them.
func TestRedactionBeyondTheQuery(t *testing.T) {
	const secret = "s3cr3t"
	tests := []struct{ uri, want string }{
		{"/p#cube_token=" + secret, "/p#cube_token=REDACTED"},
		{"/p?a=1#cube_token=" + secret, "/p?a=1#cube_token=REDACTED"},
		{"/p?a=1#x=2&cube_token=" + secret, "/p?a=1#x=2&cube_token=REDACTED"},
		{"/p#frag?cube_token=" + secret, "/p#frag?cube_token=REDACTED"},
		{"/p?a=1;cube_token=" + secret, "/p?a=1;cube_token=REDACTED"},
		{"/p?a=1;CUBE%5Ftoken=" + secret + "&b=2", "/p?a=1;CUBE%5Ftoken=REDACTED&b=2"},
		// A redacted value runs to the next '&', as fasthttp reads it.
		{"/p?cube_token=" + secret + "#" + secret + ";" + secret + "&b=2", "/p?cube_token=REDACTED&b=2"},
		{"http://u:" + secret + "@h.test/p?q=1", "http://REDACTED@h.test/p?q=1"},
		{"http://" + secret + "@h.test", "http://REDACTED@h.test"},
		{"https://a@b:" + secret + "@h.test:8080/p", "https://REDACTED@h.test:8080/p"},
		{"http://u:" + secret + "@h.test/p?cube_token=" + secret, "http://REDACTED@h.test/p?cube_token=REDACTED"},
		// fasthttp reads an authority there when the request has no Host.
		{"//u:" + secret + "@h.test/p", "//REDACTED@h.test/p"},
		// Not userinfo: an empty one, or an '@' after the authority.
		{"http://@h.test/p", "http://@h.test/p"},
		{"http://h.test/a@b?x=c@d#e@f", "http://h.test/a@b?x=c@d#e@f"},
		// The authority ends at '?' and '#' too, and a "//" after a '/' is
		// no authority: a path or a query's redirect target is kept whole.
		{"http://h.test?x=c@d", "http://h.test?x=c@d"},
		{"http://h.test#e@f", "http://h.test#e@f"},
		{"/a//b@c/d", "/a//b@c/d"},
		{"/p?next=//u@h.test/", "/p?next=//u@h.test/"},
		{"/p@q", "/p@q"},
		{"/p#frag", "/p#frag"},
		{"/p?a=1;b=2#c", "/p?a=1;b=2#c"},
	}
	for _, tt := range tests {
		if got := string(appendRedactedURI(nil, tt.uri, appendCubeEscaped)); got != tt.want {
			t.Errorf("uri %q -> %q, want %q", tt.uri, got, tt.want)
		}
		e := &Entry{Time: testTime, RequestURI: tt.uri, URI: tt.uri}
		if path, args, ok := strings.Cut(tt.uri, "?"); ok {
			e.URI, e.Args = path, args
		}
		if !strings.Contains(tt.want, "REDACTED") {
			continue
		}
		for _, line := range []string{cubeLine(e), string(appendJSON(nil, e, testTime, newStamps(jsonTime)))} {
			if strings.Contains(line, secret) {
				t.Errorf("%q: line leaks the secret: %s", tt.uri, line)
			}
		}
	}
}

// nginxHost is what the cube format's host field holds for a Host: nginx's
// $host (lowercased, no port, no trailing dot), its userinfo redacted.
func nginxHost(s string) string {
	prefix := ""
	if at := strings.LastIndexByte(s, '@'); at > 0 {
		prefix, s = redacted+"@", s[at+1:]
	}
	if strings.HasPrefix(s, "[") { // an IPv6 literal: its colons are no port's
		if i := strings.IndexByte(s, ']'); i >= 0 {
			s = s[:i+1]
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimSuffix(s, ".")
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return prefix + string(b)
}

// The cube format's host is nginx's $host, as nginx 1.22.1 logs it.
func TestCubeHost(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"50005-sb1.example.com", "50005-sb1.example.com"},
		{"Foo.EXAMPLE.com:8080", "foo.example.com"},
		{"10.0.0.5:8081", "10.0.0.5"},
		{"example.com.", "example.com"},
		{"example.com.:443", "example.com"},
		{"[::1]:8080", "[::1]"},
		{"[FE80::1]", "[fe80::1]"},
		{"AZ.Zz-az.TEST", "az.zz-az.test"}, // both ends of the range
		{":80", "-"},
		{"u:pw@Box.cube.test:8081", "REDACTED@box.cube.test"},
		{"Caf\xc3\xa9.Test", `caf\xC3\xA9.test`}, // the escapes' hex digits stay upper case
	} {
		if got := strings.Split(cubeLine(&Entry{Time: testTime, Host: tt.in}), cubeSep)[1]; got != tt.want {
			t.Errorf("Host %q: logged %q, want %q", tt.in, got, tt.want)
		}
	}
}
