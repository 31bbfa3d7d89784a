package bench_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/test/bench"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestHarnessSmoke runs the benchmark harness through every step with a few pods and one
// repetition, so that it cannot rot between `make bench` runs, and logs its table: the floors
// and the ratios to them. It asserts that every figure was produced, never what it is: the
// machine running the test suite is busy. The kubelet takes part if hack/build-kubelet.sh has
// built it; otherwise holdfast is measured alone. holdfast on its CRI backend (holdfast-cri)
// takes part only with HOLDFAST_BENCH_SMOKE_CRI=1, to keep the test suite's run small.
func TestHarnessSmoke(t *testing.T) {
	testenv.RequireIntegration(t)
	opts := bench.Smoke()
	opts.HoldfastCRI = os.Getenv("HOLDFAST_BENCH_SMOKE_CRI") == "1"
	opts.KubeletPath = kubeletPath()
	if opts.KubeletPath == "" {
		t.Logf("kubelet binary not built (hack/build-kubelet.sh): measuring holdfast only")
	}
	rep := bench.Run(t, opts)
	if t.Failed() {
		return
	}
	t.Logf("\n%s", rep.Table())
	// `make test` prints it after the run: go test shows a passing test's log only with -v.
	if path := os.Getenv("HOLDFAST_BENCH_SMOKE_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(rep.Table()), 0o644); err != nil {
			t.Errorf("write the table for make test: %v", err)
		}
	}

	agents := []string{bench.Holdfast}
	if opts.HoldfastCRI {
		agents = append(agents, bench.HoldfastCRI)
	}
	if opts.KubeletPath != "" {
		agents = append(agents, bench.Kubelet)
	}
	for _, name := range agents {
		a := rep.Agent(name)
		if a == nil {
			t.Fatalf("no result for %s", name)
		}
		if len(a.FloorMS) != opts.LatencyPods || len(a.StartupMS) != opts.LatencyPods ||
			len(a.NetworkAddMS) != opts.LatencyPods || len(a.NetworkDelMS) != opts.LatencyPods {
			t.Errorf("%s: %d floor, %d startup, %d CNI ADD and %d CNI DEL samples, want %d each",
				name, len(a.FloorMS), len(a.StartupMS), len(a.NetworkAddMS), len(a.NetworkDelMS), opts.LatencyPods)
		}
		if len(a.BurstS) != opts.Reps || len(a.BurstFloorS) != opts.Reps || len(a.Restarts) != opts.Reps {
			t.Errorf("%s: %d bursts, %d burst floors and %d restarts, want %d each", name, len(a.BurstS), len(a.BurstFloorS), len(a.Restarts), opts.Reps)
		}
		if s := a.Steady; s == nil || s.Samples == 0 || s.AgentRSSMiB <= 0 || !s.ContainerdFound || s.WorkloadProcesses != opts.Pods ||
			s.Breakdown["agent"] == nil || s.Breakdown["containerd"] == nil {
			t.Errorf("%s: steady state %+v: want samples, a positive RSS, containerd found and %d workload processes", name, s, opts.Pods)
		}
		// holdfast's memory breakdown (the harness logs rather than fails a run without it):
		// its executable resident, its heap and goroutines read from its local socket.
		if name != bench.Kubelet && a.Steady != nil {
			if m := a.Steady.Memory; m == nil || m.ExecutableMiB <= 0 || m.AnonymousMiB <= 0 || m.HeapInuseMiB <= 0 || m.Goroutines == 0 {
				t.Errorf("%s: memory breakdown %+v: want the executable's and anonymous pages, the heap in use and the goroutines", name, m)
			}
		}
		// Counting works: bytes both ways, and at least the Lease renewals the window was made
		// long enough for.
		if a.Steady == nil || a.Steady.Uplink == nil {
			t.Errorf("%s: no uplink figures", name)
		} else {
			u := a.Steady.Uplink
			if u.UpBytes <= 0 || u.DownBytes <= 0 {
				t.Errorf("%s: uplink %d bytes up, %d down in %.0fs: want both positive", name, u.UpBytes, u.DownBytes, u.WindowS)
			}
			// A renewal, or the Lease's creation: the kubelet's first renewal on a loaded
			// machine may fall in the window as a get and a create.
			if u.Requests["update leases"]+u.Requests["create leases"] == 0 {
				t.Errorf("%s: no Lease write (update or create leases) counted in the audit log in %.0fs: %v", name, u.WindowS, u.Requests)
			}
		}
		// The churn's pods were started: their status written, through the relay.
		if c := a.Churn; c == nil || c.UpBytes <= 0 || c.DownBytes <= 0 || (c.Requests["patch pods/status"]+c.Requests["update pods/status"]) == 0 {
			t.Errorf("%s: churn uplink %+v: want bytes both ways and pod status writes", name, c)
		}
		for _, r := range a.Restarts {
			if r.TasksBefore < opts.Pods {
				t.Errorf("%s: %d tasks before the restart, want at least %d", name, r.TasksBefore, opts.Pods)
			}
		}
		if a.Version == "" {
			t.Errorf("%s: no version on its Node", name)
		}
		// The flash-wear phase: flips seen in its window, none in the steady one, and the
		// agent's syscalls traced in both where strace is installed.
		if f := a.Flash; f == nil || f.Steady == nil || f.Churn == nil {
			t.Errorf("%s: no flash-wear figures", name)
		} else {
			if f.Churn.StatusChanges == 0 || f.Steady.StatusChanges != 0 || f.Steady.WindowS <= 0 || f.Churn.WindowS <= 0 {
				t.Errorf("%s: flash wear: %d status changes in %.0fs of flips, %d in %.0fs without: want some, and none",
					name, f.Churn.StatusChanges, f.Churn.WindowS, f.Steady.StatusChanges, f.Steady.WindowS)
			}
			if _, err := exec.LookPath("strace"); err == nil && (!f.Steady.Traced || !f.Churn.Traced) {
				t.Errorf("%s: flash wear: syscalls not traced: %q, %q", name, f.Steady.TraceError, f.Churn.TraceError)
			}
		}
	}
	h := rep.Agent(bench.Holdfast)
	if len(h.OfflineBootS) != 1 || len(h.BootFloorS) != 1 {
		t.Errorf("holdfast: %d offline boots and %d boot floors, want 1 each", len(h.OfflineBootS), len(h.BootFloorS))
	}
	if c := rep.Agent(bench.HoldfastCRI); c != nil && (len(c.OfflineBootS) != 1 || len(c.BootFloorS) != 0) {
		t.Errorf("holdfast-cri: %d offline boots and %d boot floors, want 1 and none", len(c.OfflineBootS), len(c.BootFloorS))
	}
	// holdfast's start trace was read in each scenario, on each backend: its containers were
	// created and started in every one.
	for _, name := range agents {
		a := rep.Agent(name)
		if name == bench.Kubelet || a == nil {
			continue
		}
		for scenario, phases := range map[string]map[string]float64{"startup": a.StartPhasesMS, "burst": a.BurstPhasesMS, "offline boot": a.BootPhasesMS} {
			if phases["create"] <= 0 || phases["start"] <= 0 {
				t.Errorf("%s's start trace in the %s: %v, want create and start phases", name, scenario, phases)
			}
		}
		if !strings.Contains(rep.Table(), "Where "+name+"'s pod starts went") {
			t.Errorf("the table lacks %s's start trace", name)
		}
	}
	if len(rep.Rows) == 0 {
		t.Error("no rows in the report")
	}
	// Every floor and every ratio to a floor is in the table, with its figure for every agent
	// it applies to.
	for _, want := range []string{"floor p50", "network floor: CNI ADD", "network floor: CNI DEL", "/ floor p50",
		"/ (floor p50 + network floor p50)", "burst floor:", "burst / burst floor", "burst floor with holdfast's logger", "burst / burst floor with holdfast's logger",
		"bytes up and down per day", "requests/min: Lease", "boot floor:", "offline boot / boot floor",
		"sync calls per status change", "disk writes per status change, less the steady rate"} {
		if !slices.ContainsFunc(rep.Rows, func(r bench.Row) bool { return strings.Contains(r.Metric, want) }) {
			t.Errorf("no row %q in the report", want)
		}
	}
	for _, r := range rep.Rows {
		if !strings.Contains(r.Metric, "floor") {
			continue
		}
		if r.Holdfast == nil {
			t.Errorf("holdfast: no figure for %q", r.Metric)
		}
		// holdfast-cri has neither holdfast's logger nor the boot floor (containerd backend
		// only).
		if opts.HoldfastCRI && r.HoldfastCRI == nil && !strings.Contains(r.Metric, "holdfast's logger") && !strings.Contains(r.Metric, "boot floor") {
			t.Errorf("holdfast-cri: no figure for %q", r.Metric)
		}
		if opts.KubeletPath != "" && r.Kubelet == nil && !strings.Contains(r.Section, "holdfast only") && !strings.Contains(r.Metric, "holdfast's logger") {
			t.Errorf("kubelet: no figure for %q", r.Metric)
		}
	}
}
