package testenv

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// PromSample is one sample line of the Prometheus text exposition.
type PromSample struct {
	Name   string            // metric name, with its _bucket/_sum/_count suffix
	Labels map[string]string // label values, unescaped
	Value  float64           // sample value
}

// ParsePromText parses every sample line of a Prometheus text exposition
// (comments skipped; label values may contain escaped quotes).
func ParsePromText(r io.Reader) ([]PromSample, error) {
	var out []PromSample
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parsePromLine(line)
		if err != nil {
			return nil, fmt.Errorf("parse %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// parsePromLine parses `name{a="x",b="y"} value`.
func parsePromLine(line string) (PromSample, error) {
	s := PromSample{Labels: map[string]string{}}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return s, strconv.ErrSyntax
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	series := line[:sp]
	br := strings.IndexByte(series, '{')
	if br < 0 {
		s.Name = series
		return s, nil
	}
	s.Name = series[:br]
	rest := strings.TrimSuffix(series[br+1:], "}")
	for rest != "" {
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return s, strconv.ErrSyntax
		}
		q, err := strconv.QuotedPrefix(rest[eq+1:])
		if err != nil {
			return s, err
		}
		val, err := strconv.Unquote(q)
		if err != nil {
			return s, err
		}
		s.Labels[rest[:eq]] = val
		rest = strings.TrimPrefix(rest[eq+1+len(q):], ",")
	}
	return s, nil
}
