package bench

import (
	"fmt"
	"time"
)

// Options sizes a run.
type Options struct {
	// LatencyPods are created one after the other for the startup latency (and as many
	// floor samples are taken). Full run: 20.
	LatencyPods int
	// Pods is the burst size, and the pods running during the steady-state, restart and
	// offline-boot measurements. Full run: 30.
	Pods int
	// Reps repeats the burst and the restart (the report shows the median, and min and max
	// in the JSON). Full run: 3.
	Reps int
	// Steady is the steady-state window. Full run: 60s.
	Steady time.Duration
	// Settle is how long the pods run before the steady-state window opens, so the window
	// sees the agent idle rather than finishing the burst. Full run: 15s.
	Settle time.Duration
	// Uplink is the window in which the bytes and requests between the agent and the
	// apiserver are counted: it opens with the steady-state window and lasts at least as long
	// (longer, it extends it). Zero: the steady-state window. It should cover several Lease
	// renewals (10 s apart by default); the kubelet writes an unchanged node status every 5
	// minutes, which a shorter window catches or misses whole.
	Uplink time.Duration
	// HoldfastProfile is holdfast's uplinkProfile (agent/config): "" for the default (the
	// kubelet's heartbeats), "metered".
	HoldfastProfile string
	// MemProfileRate, when not 0, runs holdfast with GODEBUG=memprofilerate=N: its heap
	// profile (kept in OutDir, its largest sites in the report) then samples one allocation per
	// N bytes rather than the runtime's 512 KiB, fine enough to say where a few MiB of heap go;
	// the profiler's own buckets grow with it, so the run's RSS is not the default build's.
	MemProfileRate int
	// HoldfastCRI measures holdfast a second time on its CRI backend (runtime: cri, through
	// containerd's CRI plugin), as agent HoldfastCRI, between holdfast and the kubelet. Full
	// and quick runs: on; the smoke run: off.
	HoldfastCRI bool
	// KubeletPath is the upstream kubelet binary. Empty: holdfast is measured alone.
	KubeletPath string
	// FastDrain makes the harness wait, after deleting pods, only until no task runs, not
	// until their containers are removed from containerd (which the kubelet does in its
	// container garbage collection, once a minute). Quicker, less clean: for the smoke test.
	FastDrain bool
	// SkipOffline leaves out holdfast's offline boot (on both backends).
	SkipOffline bool
	// FlashWindow is the flash-wear phase's window of status changes (a pod's readiness
	// flipping every FlashPeriod, whole seconds), FlashSteady its window with no status change
	// before it. Full run: 60s, 60s and 10s. FlashWindow zero leaves the phase out.
	FlashWindow, FlashSteady, FlashPeriod time.Duration
	// Only narrows the run to one phase: OnlyFlash (-bench.only=flash) starts each agent,
	// creates Pods pods at once and runs the flash-wear phase, nothing else (no floors, no
	// Wasm). Empty: every phase.
	Only string
	// WasmBenchtime is passed to `go test -bench . -benchtime` for ./wasm/. Empty: the Wasm
	// figures are left out.
	WasmBenchtime string
	// PolicyDocsRoot is the module root whose docs/policies.md and README.md receive the
	// policy figures of the Wasm benchmarks (WritePolicyDocs). Empty: not written.
	PolicyDocsRoot string
	// OutDir receives results.md, results.json and the agents' logs. Empty: nothing written.
	OutDir string
	// OrderFile keeps the order the last run measured the agents in; each run measures them
	// in the reverse of it (agentOrder). Empty: the agents in their fixed order.
	OrderFile string
	// Mode names the preset in the report ("full", "quick", "smoke", "custom").
	Mode string
	// Logf reports progress (t.Logf if nil).
	Logf func(format string, args ...any)
}

// Full is the run `make bench` does: what issue 6 asks for.
func Full() Options {
	return Options{Mode: "full", LatencyPods: 20, Pods: 30, Reps: 3, Steady: 60 * time.Second, Settle: 15 * time.Second, WasmBenchtime: "1s", HoldfastCRI: true,
		FlashWindow: 60 * time.Second, FlashSteady: 60 * time.Second, FlashPeriod: 10 * time.Second}
}

// Quick is a run of a few minutes: fewer pods, one repetition, a shorter window.
func Quick() Options {
	return Options{Mode: "quick", LatencyPods: 8, Pods: 10, Reps: 1, Steady: 20 * time.Second, Settle: 5 * time.Second, WasmBenchtime: "200ms", HoldfastCRI: true,
		FlashWindow: 30 * time.Second, FlashSteady: 20 * time.Second, FlashPeriod: 10 * time.Second}
}

// Smoke is the smallest run that goes through every step: the test suite runs it, holdfast on
// its containerd backend only (HoldfastCRI off, to keep it small).
func Smoke() Options {
	return Options{Mode: "smoke", LatencyPods: 2, Pods: 3, Reps: 1, Steady: 3 * time.Second, Settle: time.Second, FastDrain: true,
		// Long enough for a Lease renewal or two of each agent (every 10 s).
		Uplink: 12 * time.Second,
		// Four flips in the churn window, a short steady window: the phase's steps, not its
		// figures (the test suite's time).
		FlashWindow: 20 * time.Second, FlashSteady: 4 * time.Second, FlashPeriod: 5 * time.Second}
}

func (o Options) validate() error {
	if o.LatencyPods < 1 || o.Pods < 1 || o.Reps < 1 {
		return fmt.Errorf("latency pods (%d), pods (%d) and reps (%d) must be at least 1", o.LatencyPods, o.Pods, o.Reps)
	}
	if o.Steady <= 0 || o.Settle < 0 || o.Uplink < 0 {
		return fmt.Errorf("steady window %s must be positive, settle %s and uplink window %s not negative", o.Steady, o.Settle, o.Uplink)
	}
	if o.FlashWindow < 0 || o.FlashSteady < 0 {
		return fmt.Errorf("flash-wear windows %s and %s must not be negative", o.FlashWindow, o.FlashSteady)
	}
	if o.FlashWindow > 0 && (o.FlashPeriod < 5*time.Second || o.FlashPeriod%time.Second != 0 || o.FlashWindow < o.FlashPeriod || o.FlashSteady < 2*time.Second) {
		return fmt.Errorf("flash wear: the flip period %s must be whole seconds, at least 5s (the readiness probe's 3 failures a second apart) and at most the window %s; the steady window %s at least 2s",
			o.FlashPeriod, o.FlashWindow, o.FlashSteady)
	}
	switch o.Only {
	case "":
	case OnlyFlash:
		if o.FlashWindow == 0 {
			return fmt.Errorf("only the flash-wear phase asked for, and its window is zero")
		}
	default:
		return fmt.Errorf("unknown phase %q (only %q can run alone)", o.Only, OnlyFlash)
	}
	return nil
}
