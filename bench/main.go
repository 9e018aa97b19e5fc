// Command bench is the load generator of the CubeProxy benchmark harness.
//
//	go run ./bench <scenario> [flags]   scenarios: http bytes sse idle ws mcp cold
//	go run ./bench report -in samples.jsonl -out RESULTS.md
//	go run ./bench wait -addr 127.0.0.1:18080 -port 20001
//	go run ./bench soak -pid P -backend-pid B   (bench/soak.sh runs it)
//
// Every scenario dials -addr and sends the Host header built from -host
// (placeholders {port} and {id}), so one binary measures CubeProxy, nginx and
// a direct connection to the backend alike. Each run appends one JSON sample
// to -out; bench/compare.sh drives the whole comparison.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// exitNoisy tells compare.sh that the sample was taken while other
// processes used more CPU than -max-other allows, so it should be rerun.
const exitNoisy = 3

type scenarioFunc func(o *options, args []string) (*Sample, error)

var scenarios = map[string]scenarioFunc{
	"http":  runHTTP,
	"bytes": runBytes,
	"sse":   runSSE,
	"idle":  runIdle,
	"ws":    runWS,
	"mcp":   runMCP,
	"cold":  runCold,
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	name, args := os.Args[1], os.Args[2:]
	switch name {
	case "report":
		exitOn(runReport(args))
		return
	case "wait":
		exitOn(runWait(args))
		return
	case "soak":
		exitOn(runSoak(args))
		return
	}
	fn, ok := scenarios[name]
	if !ok {
		usage()
	}
	o := &options{scenario: name, defLabel: name}
	s, err := fn(o, args)
	if err != nil {
		if o.out != "" && !errors.Is(err, flag.ErrHelp) {
			// A repetition that ended in an error is reported as a failed
			// sample, not left out of the report.
			_ = appendSample(o.out, o.failedSample(err))
		}
		exitOn(fmt.Errorf("%s: %w", name, err))
	}
	if err := appendSample(o.out, s); err != nil {
		exitOn(err)
	}
	fmt.Fprintf(os.Stderr, "%-15s %-15s rep %d: %s other-cpu %.1f%%%s\n",
		s.Label, s.Subject, s.Rep, summary(s), s.OtherCPUPct, failNote(s))
	if s.Failed != "" {
		os.Exit(1)
	}
	if s.OtherCPUPct > o.maxOther {
		os.Exit(exitNoisy)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: bench <http|bytes|sse|idle|ws|mcp|cold|report|wait|soak> [flags]  (bench <cmd> -h for flags)")
	os.Exit(2)
}

func exitOn(err error) {
	if err == nil {
		return
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func failNote(s *Sample) string {
	if s.Failed == "" {
		return ""
	}
	return " FAILED: " + s.Failed
}

// options are the flags every scenario shares.
type options struct {
	scenario string
	addr     string
	hostTmpl string
	port     int
	id       string
	subject  string
	label    string
	defLabel string // the label the scenario's flags give (set once parsed)
	rep      int
	attempt  int
	out      string
	dur      time.Duration
	warm     time.Duration
	pids     string
	ownPids  string
	maxOther float64
	maxErr   float64
}

func (o *options) register(fs *flag.FlagSet, defPort int) {
	fs.StringVar(&o.addr, "addr", "127.0.0.1:20001", "address to dial (proxy, nginx or the backend itself)")
	fs.StringVar(&o.hostTmpl, "host", "{port}-{id}.bench.test", "Host header template; {port} and {id} are replaced")
	fs.IntVar(&o.port, "port", defPort, "sandbox (backend) port put into {port}")
	fs.StringVar(&o.id, "id", "bench", "sandbox id put into {id}")
	fs.StringVar(&o.subject, "subject", "direct", "name of the subject under test, recorded in the sample")
	fs.StringVar(&o.label, "label", "", "scenario variant label (default: derived from the scenario and its parameters)")
	fs.IntVar(&o.rep, "rep", 0, "repetition number, recorded in the sample")
	fs.IntVar(&o.attempt, "attempt", 0, "attempt number of this repetition, recorded in the sample")
	fs.StringVar(&o.out, "out", "-", "append the JSON sample to this file (- = stdout)")
	fs.DurationVar(&o.dur, "d", 5*time.Second, "measured duration")
	fs.DurationVar(&o.warm, "warm", time.Second, "warm-up before measuring")
	fs.StringVar(&o.pids, "pids", "", "comma-separated PIDs of the subject (children included) for CPU and RSS")
	fs.StringVar(&o.ownPids, "own-pids", "", "comma-separated PIDs of other harness processes (backend, redis)")
	fs.Float64Var(&o.maxOther, "max-other", 5, "exit 3 when other processes used more than this % of CPU")
	fs.Float64Var(&o.maxErr, "max-errors", 1, "mark the sample failed when errors exceed this % of operations")
}

func (o *options) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if _, err := parsePIDs(o.pids); err != nil {
		return err
	}
	_, err := parsePIDs(o.ownPids)
	return err
}

// host expands the Host template for sandbox id.
func (o *options) host(id string) string {
	return strings.NewReplacer("{port}", strconv.Itoa(o.port), "{id}", id).Replace(o.hostTmpl)
}

func (o *options) newMeter() *meter {
	subj, _ := parsePIDs(o.pids)
	own, _ := parsePIDs(o.ownPids)
	return newMeter(subj, own)
}

// newSample fills the fields every scenario shares from the meter.
func (o *options) newSample(label, params string, m *meter) *Sample {
	if o.label != "" {
		label = o.label
	}
	s := &Sample{
		Label: label, Scenario: o.scenario, Subject: o.subject, Rep: o.rep, Attempt: o.attempt,
		Time: time.Now().UTC(), WallSec: m.wall.Seconds(), Metrics: map[string]float64{},
		OtherCPUPct: m.otherPct, StealPct: m.stealPct, BusyPct: m.busyPct,
		SubjectCPU: m.subjectCPU.Seconds(), Params: params,
	}
	// Both CPU shares go into every sample: a closed-loop rate says how
	// fast the subject is only when the subject, not the harness, ran out
	// of CPU, and the report shows which one did.
	if sec := m.wall.Seconds(); sec > 0 {
		s.Metrics["harness_cpu_pct"] = 100 * m.harnessCPU.Seconds() / sec
		if len(m.subject) > 0 {
			s.Metrics["subject_cpu_pct"] = 100 * m.subjectCPU.Seconds() / sec
		}
	}
	if m.err != nil {
		s.Failed = m.err.Error()
	}
	return s
}

// failedSample records a repetition that ended in err before it had a
// sample of its own.
func (o *options) failedSample(err error) *Sample {
	label := o.defLabel
	if o.label != "" {
		label = o.label
	}
	return &Sample{
		Label: label, Scenario: o.scenario, Subject: o.subject, Rep: o.rep, Attempt: o.attempt,
		Time: time.Now().UTC(), Metrics: map[string]float64{}, Failed: err.Error(),
	}
}

// checkErrors marks the sample failed when too many operations failed.
func (o *options) checkErrors(s *Sample, firstErr error) {
	total := s.Ops + s.Errors
	if total == 0 {
		s.Failed = "no operation completed"
		if firstErr != nil {
			s.Failed += ": " + firstErr.Error()
		}
		return
	}
	if pct := 100 * float64(s.Errors) / float64(total); pct > o.maxErr {
		s.Failed = fmt.Sprintf("%.1f%% of operations failed", pct)
		if firstErr != nil {
			s.Failed += "; first error: " + firstErr.Error()
		}
	}
}

func parsePIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("bad pid %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

func summary(s *Sample) string {
	var b strings.Builder
	for _, k := range summaryKeys[s.Scenario] {
		if v, ok := s.Metrics[k]; ok {
			fmt.Fprintf(&b, "%s=%.4g ", k, v)
		}
	}
	return b.String()
}

var summaryKeys = map[string][]string{
	"http":  {"rps", "p99_us", "cpu_us_per_req"},
	"bytes": {"mib_per_s", "p99_us"},
	"sse":   {"events_per_s", "mib_per_s", "lat_p99_us", "ttfe_p50_us"},
	"idle":  {"rss_kib_per_stream", "streams"},
	"ws":    {"rtt_per_s", "p99_us"},
	"mcp":   {"calls_per_s", "p99_us"},
	"cold":  {"lookups_per_s", "p99_us"},
}
