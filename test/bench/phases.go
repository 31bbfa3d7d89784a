package bench

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// startPhaseMetric is holdfast's trace of each pod start, by phase.
const startPhaseMetric = "holdfast_pod_start_phase_duration_seconds"

// phaseTotals is one reading of holdfast's start trace: per phase, the seconds all traced
// pod starts spent in it, and how many starts were traced.
type phaseTotals struct {
	seconds map[string]float64
	starts  float64
}

// startPhases reads holdfast's start trace from /metrics on its local API socket.
func (a *agentProc) startPhases(ctx context.Context) (phaseTotals, error) {
	if a.socket == "" {
		return phaseTotals{}, fmt.Errorf("%s has no local API socket", a.kind)
	}
	body, err := testenv.LocalGet(ctx, a.socket, "/metrics")
	if err != nil {
		return phaseTotals{}, err
	}
	f, err := metricstest.Parse(bytes.NewReader(body))
	if err != nil {
		return phaseTotals{}, fmt.Errorf("parse holdfast's /metrics: %w", err)
	}
	pt := phaseTotals{seconds: map[string]float64{}}
	for _, p := range metrics.PodStartPhases {
		pt.seconds[p], _ = f.Sum(startPhaseMetric, "phase", p)
	}
	// Every traced start has a sample in every phase.
	pt.starts, _ = f.Value(startPhaseMetric, "phase", metrics.PhaseOther)
	return pt, nil
}

// perPodMS is the mean milliseconds per pod start in each phase between two readings; nil
// when no start was traced in between.
func (after phaseTotals) perPodMS(before phaseTotals) map[string]float64 {
	n := after.starts - before.starts
	if n <= 0 {
		return nil
	}
	out := map[string]float64{}
	for _, p := range metrics.PodStartPhases {
		out[p] = (after.seconds[p] - before.seconds[p]) * 1000 / n
	}
	return out
}

// tracePhases runs what and returns where holdfast's pod starts during it went (mean ms per
// pod and phase), on either backend; restarted: the agent is started again during run, so its
// trace starts from zero. nil for the kubelet, which has no such trace, or when the trace could
// not be read (said in the log: the figures are a breakdown, not a result the run depends on).
func (e *env) tracePhases(what string, restarted bool, run func()) map[string]float64 {
	if !isHoldfast(e.agent.kind) {
		run()
		return nil
	}
	var before phaseTotals
	if !restarted {
		var err error
		if before, err = e.agent.startPhases(context.Background()); err != nil {
			e.logf("%s: start trace not read before: %v", what, err)
			run()
			return nil
		}
	}
	run()
	after, err := e.agent.startPhases(context.Background())
	if err != nil {
		e.logf("%s: start trace not read after: %v", what, err)
		return nil
	}
	return after.perPodMS(before)
}

// phasesTable tabulates where the pod starts of agent (holdfast on one backend) went in each
// scenario, in the rows of metrics.PodStartPhases; "" when it was not measured or nothing was
// traced.
func (r *Report) phasesTable(agent string, markdown bool) string {
	h := r.Agent(agent)
	if h == nil {
		return ""
	}
	cols := []struct {
		name   string
		phases map[string]float64
	}{{"startup", h.StartPhasesMS}, {"burst", h.BurstPhasesMS}, {"offline boot", h.BootPhasesMS}}
	var b strings.Builder
	header, sep := "phase", "|---|"
	n := 0
	for _, c := range cols {
		if c.phases != nil {
			n++
		}
		header += " | " + c.name
		sep += "---:|"
	}
	if n == 0 {
		return ""
	}
	if markdown {
		b.WriteString("| " + header + " |\n" + sep + "\n")
	} else {
		fmt.Fprintf(&b, "%-10s", "phase")
		for _, c := range cols {
			fmt.Fprintf(&b, " | %12s", c.name)
		}
		b.WriteString("\n")
	}
	for _, p := range append(metrics.PodStartPhases, "total") {
		if markdown {
			fmt.Fprintf(&b, "| %s |", p)
		} else {
			fmt.Fprintf(&b, "%-10s", p)
		}
		for _, c := range cols {
			v, ok := c.phases[p]
			if p == "total" && c.phases != nil {
				v, ok = 0, true
				for _, x := range c.phases {
					v += x
				}
			}
			cell := "-"
			if ok {
				cell = fmt.Sprintf("%.0f ms", v)
			}
			if markdown {
				fmt.Fprintf(&b, " %s |", cell)
			} else {
				fmt.Fprintf(&b, " | %12s", cell)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
