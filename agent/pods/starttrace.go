package pods

import (
	"log/slog"
	"time"

	"github.com/holdfast-dev/holdfast/agent/metrics"
)

// startTrace is where a pod's first start spent its time, by phase (metrics.PodStartPhases):
// the per-pod trace that tells, in every agent's /metrics and log, what separates a pod's
// start from what containerd and CNI alone need. Only a start from nothing is traced (the
// worker's startPending); what no timed phase covers is metrics.PhaseOther.
type startTrace map[string]time.Duration

// timePhase adds the time since began to a phase of the pod's start, while it is starting.
func (w *worker) timePhase(phase string, began time.Time) {
	if !w.startPending {
		return
	}
	if w.trace == nil {
		w.trace = startTrace{}
	}
	w.trace[phase] += w.m.now().Sub(began)
}

// reportStart records the pod's start, which took total from the pod first seen until all
// its containers ran: its duration and phases in the metrics, and one log line with both.
func (w *worker) reportStart(log *slog.Logger, total time.Duration) {
	phases := w.trace
	w.trace = nil
	if phases == nil {
		phases = startTrace{}
	}
	var timed time.Duration
	for _, d := range phases {
		timed += d
	}
	phases[metrics.PhaseOther] = max(total-timed, 0)
	w.m.cfg.Metrics.ObservePodStart(total)
	w.m.cfg.Metrics.ObservePodStartPhases(phases)
	args := []any{"duration", total.Round(time.Millisecond)}
	for _, p := range metrics.PodStartPhases {
		args = append(args, p, phases[p].Round(time.Millisecond))
	}
	log.Info("pod started", args...)
}
