package bench

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var s series
	for i := 1; i <= 20; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1 * time.Millisecond}, {50, 10 * time.Millisecond}, {99, 20 * time.Millisecond}, {100, 20 * time.Millisecond}} {
		if got := s.percentile(c.q); got != c.want {
			t.Errorf("p%v = %v, want %v", c.q, got, c.want)
		}
	}
	if got := (series{}).percentile(50); got != 0 {
		t.Errorf("empty p50 = %v", got)
	}
}

func TestParseBenchOutput(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/holdfast-dev/holdfast/wasm
BenchmarkAdmit/go/allowed-registries-2         	   10000	    105432 ns/op	  21.50 MB/s	    98000 cpu-ns/op	    4096 B/op	      12 allocs/op
BenchmarkColdStart/compile-2                   	       1	1523456789 ns/op	1400000000 cpu-ns/op
PASS
ok  	github.com/holdfast-dev/holdfast/wasm	12.3s
`
	got := parseBenchOutput(out)
	if len(got) != 2 {
		t.Fatalf("parsed %d benchmarks, want 2: %+v", len(got), got)
	}
	if got[0].Name != "BenchmarkAdmit/go/allowed-registries" || got[0].Iterations != 10000 ||
		got[0].Metrics["ns/op"] != 105432 || got[0].Metrics["allocs/op"] != 12 || got[0].Metrics["MB/s"] != 21.5 {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].Name != "BenchmarkColdStart/compile" || got[1].Metrics["cpu-ns/op"] != 1.4e9 {
		t.Errorf("second: %+v", got[1])
	}
}

func TestReportRendering(t *testing.T) {
	r := newReport(Smoke())
	r.Agents = []*AgentResult{
		{Agent: Holdfast, Version: "dev", FloorMS: []float64{100, 200}, NetworkAddMS: []float64{50, 60}, NetworkDelMS: []float64{40},
			StartupMS: []float64{300, 400}, BurstFloorS: []float64{1}, BurstS: []float64{2}, BootFloorS: []float64{0.5},
			Steady:   &Steady{WindowS: 3, AgentRSSMiB: 20, Breakdown: map[string]*Share{"agent": {Processes: 1, CPUMillicores: 12.5, PSSMiB: 30, WriteKiBPerMin: 4}}},
			Restarts: []Restart{{NodeReadyS: 1, PodsReadyS: 2}}, OfflineBootS: []float64{3}},
		{Agent: Kubelet, Version: "v1.37.2", FloorMS: []float64{100, 200}, StartupMS: []float64{600, 800}, BurstS: []float64{4},
			Steady: &Steady{WindowS: 3, AgentRSSMiB: 80}, Restarts: []Restart{{NodeReadyS: 2, PodsReadyS: 4, ContainersRestarted: 1}}},
	}
	r.Wasm = &WasmResult{Benchtime: "1x", Output: "BenchmarkX-2 1 2000 ns/op", Benchmarks: parseBenchOutput("BenchmarkX-2 1 2000 ns/op")}
	r.finish()
	table, md := r.Table(), r.Markdown()
	for _, want := range []string{"pod startup p99", "400 ms", "800 ms", "0.50", "cannot", "BenchmarkX", "2.00 us/op"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for _, want := range []string{"| metric | holdfast | kubelet |", "| pod startup p99 | 400 ms | 800 ms | 0.50 |", "```\nBenchmarkX-2", "| holdfast | 12.5 / 30.0 / 4 (1) |",
		// Ratios to the floors: startup p50 300 ms over the floor's 100 ms, and over 100 + 50 ms
		// of network floor; burst 2 s over 1 s; offline boot 3 s over 0.5 s. The kubelet has no
		// network, burst or boot floor here: no ratio for it.
		"| pod startup p50 / floor p50 | 3.0x | 6.0x | 0.50 |", "| pod startup p50 / (floor p50 + network floor p50) | 2.0x | - |  |",
		"| burst / burst floor | 2.0x | - |  |", "| offline boot / boot floor | 6.0x | - |  |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// holdfast-cri was not measured: no column for it.
	if strings.Contains(table, HoldfastCRI) || strings.Contains(md, HoldfastCRI) {
		t.Errorf("holdfast-cri not measured, yet in the table or the markdown:\n%s\n%s", table, md)
	}
}

// TestReportRenderingCRI: holdfast on its CRI backend gets its own column between holdfast and
// the kubelet, and its own ratio to the kubelet after holdfast's, which stays as it was.
func TestReportRenderingCRI(t *testing.T) {
	r := newReport(Full())
	r.Agents = []*AgentResult{
		{Agent: Holdfast, Version: "dev", FloorMS: []float64{100, 200}, NetworkAddMS: []float64{50, 60}, StartupMS: []float64{300, 400},
			BurstFloorS: []float64{1}, LoggedBurstFloorS: []float64{1.5}, BurstS: []float64{2}, BootFloorS: []float64{0.5},
			Steady:   &Steady{WindowS: 60, AgentRSSMiB: 20, Breakdown: map[string]*Share{"agent": {Processes: 1, CPUMillicores: 12.5, PSSMiB: 30, WriteKiBPerMin: 4}}},
			Restarts: []Restart{{NodeReadyS: 1, PodsReadyS: 2}}, OfflineBootS: []float64{3},
			StartPhasesMS: map[string]float64{"create": 10, "start": 20}},
		// The CRI backend: no logged burst floor, no boot floor.
		{Agent: HoldfastCRI, Version: "dev", FloorMS: []float64{150, 200}, NetworkAddMS: []float64{50, 60}, StartupMS: []float64{450, 600},
			BurstFloorS: []float64{1}, BurstS: []float64{3},
			Steady:   &Steady{WindowS: 60, AgentRSSMiB: 25, Breakdown: map[string]*Share{"helpers": {Processes: 30, CPUMillicores: 1, PSSMiB: 9, WriteKiBPerMin: 0}}},
			Restarts: []Restart{{NodeReadyS: 1.5, PodsReadyS: 3}}, OfflineBootS: []float64{4},
			StartPhasesMS: map[string]float64{"create": 30, "start": 40}},
		{Agent: Kubelet, Version: "v1.37.2", FloorMS: []float64{100, 200}, StartupMS: []float64{600, 800}, BurstS: []float64{4},
			Steady: &Steady{WindowS: 60, AgentRSSMiB: 80}, Restarts: []Restart{{NodeReadyS: 2, PodsReadyS: 4}}},
	}
	r.finish()
	table, md := r.Table(), r.Markdown()
	for _, want := range []string{
		"| metric | holdfast | holdfast-cri | kubelet | holdfast/kubelet | holdfast-cri/kubelet |\n|---|---:|---:|---:|---:|---:|\n",
		"| **startup, 20 pods one after the other** | | | | | |",
		// p99: 400 and 600 ms against 800: 0.50 as without holdfast-cri, and 0.75.
		"| pod startup p99 | 400 ms | 600 ms | 800 ms | 0.50 | 0.75 |",
		"| pod startup p50 / floor p50 | 3.0x | 3.0x | 6.0x | 0.50 | 0.50 |",
		"| agent RSS (avg) | 20.0 MiB | 25.0 MiB | 80.0 MiB | 0.25 | 0.31 |",
		// Only holdfast's containerd backend has its logger and the boot floor.
		"| burst floor with holdfast's logger (a process per container), median | 1.50 s | - | - |  |  |",
		"| burst / burst floor | 2.0x | 3.0x | - |  |  |",
		"| reboot, apiserver down -> 30 cached pods running | 3.00 s | 4.00 s | cannot |  |  |",
		"| offline boot / boot floor | 6.0x | - | - |  |  |",
		"| holdfast-cri | - | - | - | 1.0 / 9.0 / 0 (30) |",
		"Where holdfast-cri's pod starts went (CRI backend)",
		"Agents: holdfast dev, holdfast-cri dev, kubelet v1.37.2.",
		"holdfast-cri's offline boot has no boot floor",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	header, _, _ := strings.Cut(table, "\n")
	if f := strings.Fields(strings.ReplaceAll(header, "|", " ")); strings.Join(f, " ") != "metric holdfast holdfast-cri kubelet holdfast/kubelet holdfast-cri/kubelet" {
		t.Errorf("table header %q", header)
	}
	for _, want := range []string{"Where holdfast's pod starts went",
		"Where holdfast-cri's pod starts went (CRI backend)", "70 ms"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	js, err := json.Marshal(r.Rows)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"holdfast":400,"holdfastCri":600,"kubelet":800,"ratio":0.5,"ratioCri":0.75`) {
		t.Errorf("results.json rows lack holdfast-cri's figure and ratio: %s", js)
	}
}

func TestParseStrace(t *testing.T) {
	out := `4453  02:49:36.123456 fdatasync(7</var/lib/holdfast/state.db>) = 0
4453  pwrite64(7</var/lib/holdfast/state.db>, ""..., 4096, 8192) = 4096
4454  write(2</tmp/x/holdfast.log>, ""..., 180 <unfinished ...>
4453  write(9<socket:[1234]>, ""..., 500) = 500
4455  fsync(8</var/lib/holdfast> <unfinished ...>
4454  <... write resumed>) = 180
4455  <... fsync resumed>) = 0
4456  msync(0x7f0000000000, 4096, MS_ASYNC) = 0
4456  msync(0x7f0000000000, 4096, MS_SYNC) = 0
4457  writev(3<pipe:[99]>, [{iov_base=""..., iov_len=10}], 1) = 10
4458  write(2</tmp/x/holdfast.log>, ""..., 20) = -1 EAGAIN (Resource temporarily unavailable)
4459  sync() = 0
`
	r, err := parseStrace(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.syncs != 4 || r.syncsByCall["fdatasync"] != 1 || r.syncsByCall["fsync"] != 1 || r.syncsByCall["msync"] != 1 || r.syncsByCall["sync"] != 1 {
		t.Errorf("syncs %d %v, want 4: fdatasync, fsync, msync MS_SYNC, sync", r.syncs, r.syncsByCall)
	}
	files := r.files("/tmp/x")
	want := []FileIO{
		{Path: "/var/lib/holdfast/state.db", Syncs: 1, WriteCalls: 1, Bytes: 4096},
		{Path: "<dir>/holdfast.log", WriteCalls: 2, Bytes: 180},
		{Path: "/var/lib/holdfast", Syncs: 1},
	}
	if len(files) != len(want) {
		t.Fatalf("files %+v, want %+v", files, want)
	}
	for i := range want {
		if files[i] != want[i] {
			t.Errorf("file %d: %+v, want %+v", i, files[i], want[i])
		}
	}
}

func TestFlashRows(t *testing.T) {
	r := newReport(Smoke())
	r.Options["only"] = OnlyFlash
	// 60 s with no change: 2 syncs and 60 KiB; 60 s of 6 changes: 14 syncs and 660 KiB.
	r.Agents = []*AgentResult{
		{Agent: Holdfast, Flash: &Flash{SteadyPods: 10, PeriodS: 10,
			Steady: &FlashWindow{WindowS: 60, Traced: true, SyncCalls: 2, WriteBytes: 60 << 10},
			Churn: &FlashWindow{WindowS: 60, Traced: true, SyncCalls: 14, WriteBytes: 660 << 10, StatusChanges: 6, StatusWrites: 6,
				Files: []FileIO{{Path: "<dir>/state.db", Syncs: 14, WriteCalls: 30, Bytes: 600 << 10}}}}},
		{Agent: Kubelet, Flash: &Flash{SteadyPods: 10, PeriodS: 10,
			Steady: &FlashWindow{WindowS: 60, TraceError: "strace not found", WriteBytes: 12 << 10},
			Churn:  &FlashWindow{WindowS: 60, TraceError: "strace not found", WriteBytes: 72 << 10, StatusChanges: 6}}},
	}
	r.finish()
	md := r.Markdown()
	for _, want := range []string{
		"| no status change: sync calls (fsync, fdatasync, sync_file_range, syncfs, sync, msync MS_SYNC) | 2.00 /min | - |  |",
		"| sync calls per status change | 2.33 /change | - |  |",
		"| sync calls per status change, less the steady rate | 2.00 /change | - |  |",
		"| disk writes per status change | 110 KiB | 12.0 KiB | 9.17 |",
		"| disk writes per status change, less the steady rate | 100 KiB | 10.0 KiB | 10.00 |",
		"| <dir>/state.db | 0 / 14 | 0 / 30 | 0.0 / 600.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Alone, the phase's rows are the report's.
	for _, rw := range r.Rows {
		if !strings.HasPrefix(rw.Section, "flash wear") {
			t.Errorf("row %q of section %q in a flash-only report", rw.Metric, rw.Section)
		}
	}
}

// Each run measures the agents in the reverse of the run before's order, so that none is
// always first (warming the caches for the others) or last.
func TestAgentOrderAlternatesBetweenRuns(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bench", "agent-order")
	agents := []string{Holdfast, HoldfastCRI, Kubelet}
	var orders []string
	for range 3 {
		got, err := agentOrder(agents, file)
		if err != nil {
			t.Fatal(err)
		}
		orders = append(orders, strings.Join(got, ","))
	}
	fwd, rev := "holdfast,holdfast-cri,kubelet", "kubelet,holdfast-cri,holdfast"
	if want := []string{fwd, rev, fwd}; !slices.Equal(orders, want) {
		t.Errorf("three runs measured the agents in the orders %q, want %q", orders, want)
	}
	if agents[0] != Holdfast {
		t.Errorf("agentOrder reordered its caller's slice: %v", agents)
	}
	// Another set of agents than the last run's (-bench.cri=false): the order given.
	if got, _ := agentOrder([]string{Holdfast, Kubelet}, file); !slices.Equal(got, []string{Holdfast, Kubelet}) {
		t.Errorf("a run of other agents: %v", got)
	}
}
