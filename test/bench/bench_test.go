package bench_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/bench"
	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Flags of the full run; `make bench` passes them after -args. The sizes default to the
// preset's (-bench.quick for a run of a few minutes).
var (
	sideBySide  = flag.Bool("bench.side-by-side", false, "run TestSideBySide, the full benchmark (make bench)")
	quick       = flag.Bool("bench.quick", false, "quick preset: fewer pods, one repetition, a shorter window")
	latencyPods = flag.Int("bench.latency-pods", 0, "pods created one after the other for the startup latency (preset: 20, quick 8)")
	pods        = flag.Int("bench.pods", 0, "burst size and pods running for steady state, restart, offline boot (preset: 30, quick 10)")
	reps        = flag.Int("bench.reps", 0, "repetitions of the burst and the restart (preset: 3, quick 1)")
	steady      = flag.Duration("bench.steady", 0, "steady-state window (preset: 60s, quick 20s)")
	uplink      = flag.Duration("bench.uplink", 0, "uplink window, opened with the steady-state window (default: as long as it)")
	settle      = flag.Duration("bench.settle", -1, "wait before the steady-state window (preset: 15s, quick 5s)")
	wasmTime    = flag.String("bench.wasm-benchtime", "", `-benchtime for ./wasm/'s benchmarks, "none" to skip (preset: 1s, quick 200ms)`)
	profile     = flag.String("bench.holdfast-profile", "", "holdfast's uplinkProfile (agent/config), on both backends: metered; default: the kubelet's heartbeats")
	cri         = flag.Bool("bench.cri", true, "measure holdfast on its CRI backend too (holdfast-cri: runtime: cri, containerd's CRI plugin); false leaves it out")
	kubelet     = flag.String("bench.kubelet", "", "kubelet binary (default: kubelet-"+testenv.KubeAPIServerVersion+" in the test binary cache); \"none\" for holdfast alone")
	out         = flag.String("bench.out", "", "results directory (default: _output/bench/DATE at the module root)")
	memProfile  = flag.Int("bench.memprofilerate", 0, "run holdfast with GODEBUG=memprofilerate=N (a heap profile fine enough to break a few MiB down; its RSS is then not the default build's); 0: heap profiling off, the agent's default")
	only        = flag.String("bench.only", "", `run one phase alone: "flash" (flash wear: each agent started, 10 pods (-bench.pods), one more whose readiness flips; syncs and disk writes per status change)`)
	flashWindow = flag.Duration("bench.flash-window", 0, "flash wear: the window of status changes (preset: 60s, quick 30s; -bench.flash=false leaves the phase out)")
	flashSteady = flag.Duration("bench.flash-steady", 0, "flash wear: the window with no status change before it (preset: 60s, quick 20s)")
	flashPeriod = flag.Duration("bench.flash-period", 0, "flash wear: a readiness flip every (whole seconds, at least 5s; preset: 10s)")
	flash       = flag.Bool("bench.flash", true, "run the flash-wear phase (after the steady state); false leaves it out")
	policies    = flag.Bool("bench.policies", false, "run TestPolicyFigures, the policy benchmarks alone (make bench-policies)")
	policyDocs  = flag.Bool("bench.policy-docs", true, "write the Wasm benchmarks' policy figures to docs/policies.md, README.md and docs/policy-figures.json")
)

// kubeletPath returns the kubelet hack/build-kubelet.sh builds (same version as the
// apiserver), or "" if it has not been built.
func kubeletPath() string {
	p := filepath.Join(testenv.BinDir(), "kubelet-"+testenv.KubeAPIServerVersion)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
		return p
	}
	return ""
}

// TestSideBySide is the benchmark `make bench` runs: holdfast on its containerd backend,
// holdfast on its CRI backend (unless -bench.cri=false) and the kubelet, one after the other,
// printed as one table and written to the results directory. Not part of `go test ./...`: it
// runs only with -bench.side-by-side.
func TestSideBySide(t *testing.T) {
	if !*sideBySide {
		// skip-ok: entry point of make bench
		t.Skip("the full benchmark runs with -bench.side-by-side (make bench)")
	}
	opts := bench.Full()
	if *quick {
		opts = bench.Quick()
	}
	if *latencyPods > 0 {
		opts.LatencyPods, opts.Mode = *latencyPods, "custom"
	}
	if *pods > 0 {
		opts.Pods, opts.Mode = *pods, "custom"
	}
	if *reps > 0 {
		opts.Reps, opts.Mode = *reps, "custom"
	}
	if *steady > 0 {
		opts.Steady, opts.Mode = *steady, "custom"
	}
	if *uplink > 0 {
		opts.Uplink = *uplink
	}
	if *settle >= 0 {
		opts.Settle = *settle
	}
	if *flashWindow > 0 {
		opts.FlashWindow = *flashWindow
	}
	if *flashSteady > 0 {
		opts.FlashSteady = *flashSteady
	}
	if *flashPeriod > 0 {
		opts.FlashPeriod = *flashPeriod
	}
	if !*flash {
		opts.FlashWindow = 0
	}
	opts.Only = *only
	if opts.Only == bench.OnlyFlash {
		// The setup (#28): 10 pods beside the one that flips. Nothing else is measured:
		// no Wasm, no policy pages; the pods are deleted at the end without waiting for the
		// kubelet's container garbage collection.
		if *pods == 0 {
			opts.Pods = 10
		}
		opts.Mode, opts.WasmBenchtime, opts.FastDrain = bench.OnlyFlash+" alone", "", true
	}
	opts.HoldfastProfile = *profile
	opts.MemProfileRate = *memProfile
	opts.HoldfastCRI = *cri
	switch *wasmTime {
	case "":
	case "none":
		opts.WasmBenchtime = ""
	default:
		opts.WasmBenchtime = *wasmTime
	}
	switch *kubelet {
	case "":
		opts.KubeletPath = kubeletPath()
		if opts.KubeletPath == "" {
			t.Fatalf("no kubelet at %s: build it with hack/build-kubelet.sh, or pass -bench.kubelet=none for holdfast alone",
				filepath.Join(testenv.BinDir(), "kubelet-"+testenv.KubeAPIServerVersion))
		}
	case "none":
	default:
		opts.KubeletPath = *kubelet
	}
	root := repo.Root(t)
	opts.OutDir = *out
	if opts.OutDir == "" {
		opts.OutDir = filepath.Join(root, "_output", "bench", time.Now().UTC().Format("20060102-150405"))
	}
	if *policyDocs && opts.Only == "" {
		opts.PolicyDocsRoot = root
	}
	opts.OrderFile = filepath.Join(root, "_output", "bench", "agent-order")
	rep := bench.Run(t, opts)
	fmt.Printf("\nholdfast side by side with the kubelet (%s mode, %s):\n\n%s\nresults in %s\n",
		rep.Mode, rep.Date.Format("2006-01-02 15:04 MST"), rep.Table(), opts.OutDir)
}

// TestPolicyFigures is `make bench-policies`: the policy benchmarks alone (bench.PolicyBenchPattern
// in wasm/, OPA's evaluators on the same Rego, data and input), written to the generated blocks
// of docs/policies.md and README.md (unless -bench.policy-docs=false) and printed. It runs only
// with -bench.policies; -bench.wasm-benchtime sets -benchtime (default 1s, as make bench's).
func TestPolicyFigures(t *testing.T) {
	if !*policies {
		// skip-ok: entry point of make bench-policies
		t.Skip("the policy benchmarks run with -bench.policies (make bench-policies)")
	}
	benchtime := *wasmTime
	switch benchtime {
	case "":
		benchtime = bench.Full().WasmBenchtime
	case "none":
		t.Fatal("-bench.wasm-benchtime=none: the policy benchmarks are all this test runs")
	}
	run := bench.RunPolicyBench(t, benchtime)
	fmt.Printf("\n%s\n", run.Figures())
	if !*policyDocs {
		return
	}
	root := repo.Root(t)
	if err := bench.WritePolicyDocs(root, run); err != nil {
		t.Fatalf("policy figures: %v", err)
	}
	fmt.Printf("written to docs/policies.md, README.md and docs/policy-figures.json\n")
}
