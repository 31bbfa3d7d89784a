package bench_test

import (
	"testing"

	"github.com/holdfast-dev/holdfast/bench"
	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// TestHarnessSmoke runs the benchmark harness through every step with a few pods and one
// repetition, so that it cannot rot between `make bench` runs. It asserts that every figure
// was produced, never what it is: the machine running the test suite is busy. The kubelet
// takes part if hack/build-kubelet.sh has built it; otherwise holdfast is measured alone.
func TestHarnessSmoke(t *testing.T) {
	testenv.RequireIntegration(t)
	opts := bench.Smoke()
	opts.KubeletPath = kubeletPath()
	if opts.KubeletPath == "" {
		t.Logf("kubelet binary not built (hack/build-kubelet.sh): measuring holdfast only")
	}
	rep := bench.Run(t, opts)
	if t.Failed() {
		return
	}
	t.Logf("\n%s", rep.Table())

	agents := []string{bench.Holdfast}
	if opts.KubeletPath != "" {
		agents = append(agents, bench.Kubelet)
	}
	for _, name := range agents {
		a := rep.Agent(name)
		if a == nil {
			t.Fatalf("no result for %s", name)
		}
		if len(a.FloorMS) != opts.LatencyPods || len(a.StartupMS) != opts.LatencyPods {
			t.Errorf("%s: %d floor and %d startup samples, want %d each", name, len(a.FloorMS), len(a.StartupMS), opts.LatencyPods)
		}
		if len(a.BurstS) != opts.Reps || len(a.Restarts) != opts.Reps {
			t.Errorf("%s: %d bursts and %d restarts, want %d each", name, len(a.BurstS), len(a.Restarts), opts.Reps)
		}
		if s := a.Steady; s == nil || s.Samples == 0 || s.AgentRSSMiB <= 0 || !s.ContainerdFound || s.WorkloadProcesses != opts.Pods ||
			s.Breakdown["agent"] == nil || s.Breakdown["containerd"] == nil {
			t.Errorf("%s: steady state %+v: want samples, a positive RSS, containerd found and %d workload processes", name, s, opts.Pods)
		}
		for _, r := range a.Restarts {
			if r.TasksBefore < opts.Pods {
				t.Errorf("%s: %d tasks before the restart, want at least %d", name, r.TasksBefore, opts.Pods)
			}
		}
		if a.Version == "" {
			t.Errorf("%s: no version on its Node", name)
		}
	}
	if h := rep.Agent(bench.Holdfast); len(h.OfflineBootS) != 1 {
		t.Errorf("holdfast: %d offline boots, want 1", len(h.OfflineBootS))
	}
	if len(rep.Rows) == 0 {
		t.Error("no rows in the report")
	}
}
