package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Sample is one measured run of one scenario against one subject; the
// harness appends one JSON line per sample and `bench report` aggregates.
type Sample struct {
	Label    string             `json:"label"`            // scenario variant, e.g. "sse-lat-4k"
	Scenario string             `json:"scenario"`         // http, bytes, sse, idle, ws, mcp, cold
	Subject  string             `json:"subject"`          // cubeproxy, nginx-tuned, nginx-platform, direct
	Rep      int                `json:"rep"`              // repetition number (compare.sh counts from 1)
	Attempt  int                `json:"attempt"`          // 0, or the rerun of a repetition whose window was noisy
	Time     time.Time          `json:"time"`             // when the sample was recorded (UTC)
	WallSec  float64            `json:"wall_sec"`         // measured window
	Metrics  map[string]float64 `json:"metrics"`          // the scenario's measures by name
	Ops      int64              `json:"ops"`              // operations completed in the window
	Errors   int64              `json:"errors"`           // operations that failed
	Failed   string             `json:"failed,omitempty"` // why the sample is unusable
	// OtherCPUPct is busy CPU of processes outside the benchmark during the
	// window, in % of the machine's CPU capacity; samples above the limit
	// are rerun by compare.sh.
	OtherCPUPct float64 `json:"other_cpu_pct"`
	StealPct    float64 `json:"steal_pct"`       // CPU stolen by the hypervisor, % of capacity
	BusyPct     float64 `json:"busy_pct"`        // machine's busy CPU, % of capacity
	SubjectCPU  float64 `json:"subject_cpu_sec"` // CPU seconds the subject used in the window
	Params      string  `json:"params"`          // load generator settings, for the report
}

func appendSample(path string, s *Sample) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode sample: %w", err)
	}
	b = append(b, '\n')
	if path == "" || path == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open samples file: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("write samples file %s: %w", path, err)
	}
	return nil
}

// tally is what one load worker counted; workers embed it.
type tally struct {
	h         *hist
	ops, errs int64
	err       error // first error seen
}

func (t *tally) counts() *tally { return t }

// mergeTallies adds the workers' counts to s and returns their merged
// latency histogram and the first error any of them saw.
func mergeTallies[W interface{ counts() *tally }](s *Sample, workers []W) (*hist, error) {
	h := newHist()
	var firstErr error
	for _, w := range workers {
		t := w.counts()
		h.merge(t.h)
		s.Ops += t.ops
		s.Errors += t.errs
		if firstErr == nil {
			firstErr = t.err
		}
	}
	return h, firstErr
}
