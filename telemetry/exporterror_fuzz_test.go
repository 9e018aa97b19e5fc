package telemetry

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzExportError checks a failed export's error as the log gets it
// (newExportError with headerSecrets): whatever the collector's answer
// around them, no OTLP header value of minSecretLen bytes or more, as sent
// or as written, nor such a word of it, is left in the text, and the text
// is at most maxExportErrorLen bytes plus the note of what was cut, valid
// UTF-8 where the answer was.
func FuzzExportError(f *testing.F) {
	f.Add("x-api-key=SECRETKEY123,authorization=Bearer%20tok-abcdef", "400: ", " and ", "", uint8(0), uint8(3))
	f.Add("a=abcdefgh,b=ghijklmn", "", "", "", uint8(0), uint8(1))
	f.Add("k=%5Bredacted%5Dxyz", "[", "", "", uint8(1), uint8(0))
	f.Add("k=Basic%20dXNlcjpw", strings.Repeat("é", 300), "\xff", "", uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, headers, a, b, c string, i, j uint8) {
		env := envMap(map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": headers})
		hidden := exportSecretForms(headers)
		msg := a
		if len(hidden) > 0 {
			msg += hidden[int(i)%len(hidden)] + b + hidden[int(j)%len(hidden)]
		}
		msg += c
		cause := errors.New(msg)
		err := newExportError(cause, headerSecrets(env))
		got := err.Error()
		if !errors.Is(err, cause) {
			t.Errorf("the error does not unwrap to the exporter's")
		}
		for _, s := range hidden {
			if strings.Contains(got, s) {
				t.Fatalf("%q is left in %q", s, got)
			}
		}
		if len(got) > maxExportErrorLen+len(fmt.Sprintf("... (%d bytes more)", len(msg))) {
			t.Errorf("%d bytes: %q", len(got), got)
		}
		if utf8.ValidString(msg) && !utf8.ValidString(got) {
			t.Errorf("not valid UTF-8: %q", got)
		}
	})
}

// exportSecretForms are the forms of the values in an
// OTEL_EXPORTER_OTLP_HEADERS that README says are hidden in a failed
// export's error, those of minSecretLen bytes or more: as written
// (trimmed), as sent (percent-decoded, trimmed) and each word of the sent
// one.
func exportSecretForms(headers string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= minSecretLen {
			out = append(out, s)
		}
	}
	for entry := range strings.SplitSeq(headers, ",") {
		_, raw, ok := strings.Cut(entry, "=")
		if !ok {
			continue
		}
		add(strings.TrimSpace(raw))
		if dec, err := url.PathUnescape(raw); err == nil {
			add(strings.TrimSpace(dec))
			for _, w := range strings.Fields(dec) {
				add(w)
			}
		}
	}
	return out
}
