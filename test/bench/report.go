package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/internal/procfs"
)

// AgentResult is everything measured for one agent. Durations are in the unit their name
// says; every sample is kept.
type AgentResult struct {
	Agent string `json:"agent"`
	// Version is what the agent reports as the Node's kubeletVersion.
	Version string `json:"version"`
	// BinaryMiB is the size of the agent's binary (stripped, -s -w).
	BinaryMiB float64 `json:"binaryMiB"`
	// FirstNodeReadyS is the agent's first start until its Node is Ready.
	FirstNodeReadyS float64   `json:"firstNodeReadySeconds"`
	FloorMS         []float64 `json:"floorMs"`
	// NetworkAddMS and NetworkDelMS are the network floor: CNI ADD and DEL of the agents'
	// network configuration in a fresh network namespace, one sample per latency pod.
	NetworkAddMS []float64 `json:"networkAddMs"`
	NetworkDelMS []float64 `json:"networkDelMs"`
	StartupMS    []float64 `json:"startupMs"`
	// Churn is the uplink while the ChurnPods latency pods were created, started, deleted and
	// gone, one after the other.
	Churn     *Uplink `json:"churn,omitempty"`
	ChurnPods int     `json:"churnPods,omitempty"`
	// BurstFloorS is the burst floor: as many containers as the burst has pods, created and
	// started at once through the containerd client, one per repetition of the burst.
	BurstFloorS []float64 `json:"burstFloorSeconds"`
	// LoggedBurstFloorS (holdfast on its containerd backend only) is the burst floor with each
	// container's output going through holdfast's container logger, a process per container as
	// holdfast runs them. On the CRI backend the runtime writes the logs.
	LoggedBurstFloorS []float64 `json:"loggedBurstFloorSeconds,omitempty"`
	BurstS            []float64 `json:"burstSeconds"`
	// GoneS is, for every batch of pods deleted, the time from the delete calls until the
	// pods were gone from the API (the agent confirmed each pod's containers stopped).
	GoneS []float64 `json:"goneSeconds"`
	// DrainS is, for the same batches, the time until their containers were removed from
	// containerd too: the kubelet removes dead containers in its garbage collection, once a
	// minute, so for it this measures that timer more than the deletion.
	DrainS       []float64 `json:"drainSeconds"`
	Steady       *Steady   `json:"steady"`
	Restarts     []Restart `json:"restarts"`
	OfflineBootS []float64 `json:"offlineBootSeconds,omitempty"`
	// BootFloorS is the boot floor of each offline boot: the same reboot, the containers
	// started again from their stored specs by a minimal loop (networks included). holdfast
	// on its containerd backend only (see the note finish adds for holdfast-cri).
	BootFloorS []float64 `json:"bootFloorSeconds,omitempty"`
	// StartPhasesMS, BurstPhasesMS and BootPhasesMS (holdfast, either backend) are where
	// holdfast's pod starts went in the startup, burst and offline boot scenarios: mean
	// milliseconds per pod in each phase of its start trace
	// (holdfast_pod_start_phase_duration_seconds).
	StartPhasesMS map[string]float64 `json:"startPhasesMs,omitempty"`
	BurstPhasesMS map[string]float64 `json:"burstPhasesMs,omitempty"`
	BootPhasesMS  map[string]float64 `json:"bootPhasesMs,omitempty"`
	// Flash is the flash-wear phase: the agent's syncs and disk writes with no status change
	// and per status change.
	Flash *Flash `json:"flash,omitempty"`
}

// Steady is the steady-state window with Pods pods running.
type Steady struct {
	WindowS float64 `json:"windowSeconds"`
	Pods    int     `json:"pods"`
	Samples int     `json:"samples"`
	// The agent process alone.
	AgentRSSMiB    float64 `json:"agentRssMiB"`
	AgentRSSMaxMiB float64 `json:"agentRssMaxMiB"`
	// AgentRSSFileMiB and AgentRSSAnonMiB split AgentRSSMiB: pages of files (mostly the
	// agent's executable) and anonymous pages (heap, stacks).
	AgentRSSFileMiB     float64 `json:"agentRssFileMiB"`
	AgentRSSAnonMiB     float64 `json:"agentRssAnonMiB"`
	AgentCPUMillicores  float64 `json:"agentCpuMillicores"`
	AgentWriteKiBPerMin float64 `json:"agentWriteKiBPerMin"`
	// AgentLogKiBPerMin is how fast the agent's own log (its stdout and stderr, a file
	// here, the journal on a gateway) grew: part of AgentWriteKiBPerMin.
	AgentLogKiBPerMin float64 `json:"agentLogKiBPerMin"`
	// Node overhead: the agent, the containerd daemon, its shims and the helper processes
	// (holdfast's per-container loggers, the CRI plugin's pause sandboxes). PSS, so shared
	// pages are counted once.
	NodePSSMiB         float64 `json:"nodePssMiB"`
	NodeCPUMillicores  float64 `json:"nodeCpuMillicores"`
	NodeWriteKiBPerMin float64 `json:"nodeWriteKiBPerMin"`
	HelperProcesses    int     `json:"helperProcesses"`
	Shims              int     `json:"shims"`
	WorkloadProcesses  int     `json:"workloadProcesses"`
	ContainerdFound    bool    `json:"containerdFound"`
	// Breakdown splits the node overhead by process kind: agent, containerd, shims, helpers
	// (PSS at the end of the window).
	Breakdown map[string]*Share `json:"breakdown"`
	// Uplink is what the agent exchanged with the apiserver, in a window that opens with this
	// one (Options.Uplink).
	Uplink *Uplink `json:"uplink,omitempty"`
	// Memory is where holdfast's memory was at the end of the window (holdfast only).
	Memory *Memory `json:"memory,omitempty"`
}

// Share is one kind of process's part of the node overhead.
type Share struct {
	Processes      int     `json:"processes"`
	CPUMillicores  float64 `json:"cpuMillicores"`
	PSSMiB         float64 `json:"pssMiB"`
	WriteKiBPerMin float64 `json:"writeKiBPerMin"`
}

// Restart is one kill -9 and start of the agent.
type Restart struct {
	NodeReadyS          float64 `json:"nodeReadySeconds"`
	PodsReadyS          float64 `json:"podsReadySeconds"`
	ContainersRestarted int     `json:"containersRestarted"`
	TasksBefore         int     `json:"tasksBefore"`
}

// Row is one line of the table. Ratio is holdfast / kubelet: below 1, holdfast needs less;
// RatioCRI is holdfast-cri / kubelet, holdfast on its CRI backend.
type Row struct {
	Section  string   `json:"section"`
	Metric   string   `json:"metric"`
	Unit     string   `json:"unit"`
	Holdfast *float64 `json:"holdfast,omitempty"`
	// HoldfastCRI is agent HoldfastCRI's figure: holdfast on its CRI backend.
	HoldfastCRI *float64 `json:"holdfastCri,omitempty"`
	Kubelet     *float64 `json:"kubelet,omitempty"`
	Ratio       *float64 `json:"ratio,omitempty"`
	RatioCRI    *float64 `json:"ratioCri,omitempty"`
	// KubeletText replaces a missing kubelet value ("cannot").
	KubeletText string `json:"kubeletText,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPU        string `json:"cpu"`
	Cores      int    `json:"cores"`
	MemoryGiB  int    `json:"memoryGiB"`
	Kernel     string `json:"kernel"`
	OS         string `json:"os"`
	Go         string `json:"go"`
	Containerd string `json:"containerd"`
	Runc       string `json:"runc"`
	// LoadBefore and LoadAfter are /proc/loadavg's 1, 5 and 15 minute averages: other work
	// on the machine shows here.
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
}

// Report is a run's result.
type Report struct {
	Date    time.Time      `json:"date"`
	Mode    string         `json:"mode"`
	Options map[string]any `json:"options"`
	Machine Machine        `json:"machine"`
	Took    string         `json:"took"`
	Agents  []*AgentResult `json:"agents"`
	Rows    []Row          `json:"rows"`
	Wasm    *WasmResult    `json:"wasm,omitempty"`
	Notes   []string       `json:"notes,omitempty"`
}

func newReport(o Options) *Report {
	return &Report{
		Date: time.Now().UTC(),
		Mode: o.Mode,
		Options: map[string]any{
			"latencyPods": o.LatencyPods, "pods": o.Pods, "reps": o.Reps,
			"steady": o.Steady.String(), "settle": o.Settle.String(), "wasmBenchtime": o.WasmBenchtime,
			"uplink": max(o.Uplink, o.Steady).String(), "holdfastProfile": o.HoldfastProfile, "memProfileRate": o.MemProfileRate,
			"flashWindow": o.FlashWindow.String(), "flashSteady": o.FlashSteady.String(), "flashPeriod": o.FlashPeriod.String(),
			"only": o.Only,
		},
		Machine: describeMachine(),
	}
}

// Agent returns the result of one agent, nil if it was not measured.
func (r *Report) Agent(name string) *AgentResult {
	for _, a := range r.Agents {
		if a.Agent == name {
			return a
		}
	}
	return nil
}

// finish builds the rows from the results.
func (r *Report) finish() {
	r.Took = time.Since(r.Date).Round(time.Second).String()
	r.Machine.LoadAfter = loadavg()
	h, c, k := r.Agent(Holdfast), r.Agent(HoldfastCRI), r.Agent(Kubelet)
	lat, pods, reps := r.Options["latencyPods"], r.Options["pods"], r.Options["reps"]
	value := func(a *AgentResult, get func(*AgentResult) (float64, bool)) *float64 {
		if a == nil {
			return nil
		}
		if v, ok := get(a); ok {
			return &v
		}
		return nil
	}
	ratio := func(x, y *float64) *float64 {
		if x == nil || y == nil || *y == 0 {
			return nil
		}
		return ptr.To(*x / *y)
	}
	row := func(section, metric, unit string, get func(*AgentResult) (float64, bool)) {
		rw := Row{Section: section, Metric: metric, Unit: unit,
			Holdfast: value(h, get), HoldfastCRI: value(c, get), Kubelet: value(k, get)}
		rw.Ratio, rw.RatioCRI = ratio(rw.Holdfast, rw.Kubelet), ratio(rw.HoldfastCRI, rw.Kubelet)
		r.Rows = append(r.Rows, rw)
	}
	pct := func(f func(*AgentResult) []float64, q float64) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			xs := f(a)
			return percentile(xs, q), len(xs) > 0
		}
	}
	floor := func(a *AgentResult) []float64 { return a.FloorMS }
	startup := func(a *AgentResult) []float64 { return a.StartupMS }
	sec := fmt.Sprintf("startup, %v pods one after the other", lat)
	row(sec, "floor: container create+start via containerd client, min", "ms", pct(floor, 0))
	row(sec, "floor p50", "ms", pct(floor, 50))
	row(sec, "floor p99", "ms", pct(floor, 99))
	netAdd := func(a *AgentResult) []float64 { return a.NetworkAddMS }
	row(sec, "network floor: CNI ADD in a fresh netns, p50", "ms", pct(netAdd, 50))
	row(sec, "network floor: CNI DEL, p50", "ms", pct(func(a *AgentResult) []float64 { return a.NetworkDelMS }, 50))
	row(sec, "pod created -> Running+Ready (watch), min", "ms", pct(startup, 0))
	row(sec, "pod startup p50", "ms", pct(startup, 50))
	row(sec, "pod startup p99", "ms", pct(startup, 99))
	row(sec, "pod startup p50 / floor p50", "x", ratioOf(pct(startup, 50), pct(floor, 50)))
	row(sec, "pod startup p50 / (floor p50 + network floor p50)", "x", ratioOf(pct(startup, 50), sumOf(pct(floor, 50), pct(netAdd, 50))))
	sec = fmt.Sprintf("burst, %v pods at once", pods)
	burstFloor, burst := pct(func(a *AgentResult) []float64 { return a.BurstFloorS }, 50), pct(func(a *AgentResult) []float64 { return a.BurstS }, 50)
	row(sec, "burst floor: as many containers at once via containerd client, median", "s", burstFloor)
	row(sec, fmt.Sprintf("all Running+Ready, median of %v", reps), "s", burst)
	row(sec, "burst / burst floor", "x", ratioOf(burst, burstFloor))
	loggedFloor := pct(func(a *AgentResult) []float64 { return a.LoggedBurstFloorS }, 50)
	row(sec, "burst floor with holdfast's logger (a process per container), median", "s", loggedFloor)
	row(sec, "burst / burst floor with holdfast's logger", "x", ratioOf(burst, loggedFloor))

	row(sec, fmt.Sprintf("delete %v pods -> gone from the API, median", pods), "s",
		pct(func(a *AgentResult) []float64 { return a.GoneS }, 50))
	row(sec, fmt.Sprintf("delete %v pods -> containers removed from containerd, median (the kubelet: its minute-long GC)", pods), "s",
		pct(func(a *AgentResult) []float64 { return a.DrainS }, 50))

	steady := func(f func(*Steady) float64) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			if a.Steady == nil {
				return 0, false
			}
			return f(a.Steady), true
		}
	}
	sec = fmt.Sprintf("steady state, %v pods", pods)
	if h != nil && h.Steady != nil {
		sec = fmt.Sprintf("steady state, %v pods, %.0fs", pods, h.Steady.WindowS)
	}
	row(sec, "agent binary size (stripped)", "MiB", func(a *AgentResult) (float64, bool) { return a.BinaryMiB, a.BinaryMiB > 0 })
	row(sec, "agent RSS (avg)", "MiB", steady(func(s *Steady) float64 { return s.AgentRSSMiB }))
	row(sec, "  of which pages of files: the executable's, libraries' (avg)", "MiB", steady(func(s *Steady) float64 { return s.AgentRSSFileMiB }))
	row(sec, "  of which anonymous: heap, stacks (avg)", "MiB", steady(func(s *Steady) float64 { return s.AgentRSSAnonMiB }))
	row(sec, "agent CPU (avg)", "millicores", steady(func(s *Steady) float64 { return s.AgentCPUMillicores }))
	row(sec, "agent disk writes", "KiB/min", steady(func(s *Steady) float64 { return s.AgentWriteKiBPerMin }))
	row(sec, "  of which the agent's own log", "KiB/min", steady(func(s *Steady) float64 { return s.AgentLogKiBPerMin }))
	row(sec, "node overhead PSS: agent+containerd+shims+helpers", "MiB", steady(func(s *Steady) float64 { return s.NodePSSMiB }))
	row(sec, "node overhead CPU", "millicores", steady(func(s *Steady) float64 { return s.NodeCPUMillicores }))
	row(sec, "node overhead disk writes", "KiB/min", steady(func(s *Steady) float64 { return s.NodeWriteKiBPerMin }))
	row(sec, "helper processes (holdfast loggers / CRI pause)", "count", steady(func(s *Steady) float64 { return float64(s.HelperProcesses) }))
	row(sec, "containerd shims", "count", steady(func(s *Steady) float64 { return float64(s.Shims) }))

	uplink := func(f func(*Uplink) float64) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			if a.Steady == nil || a.Steady.Uplink == nil {
				return 0, false
			}
			return f(a.Steady.Uplink), true
		}
	}
	sec = fmt.Sprintf("uplink to the apiserver, steady state, %v pods", pods)
	if h != nil && h.Steady != nil && h.Steady.Uplink != nil {
		sec = fmt.Sprintf("uplink to the apiserver, steady state, %v pods, %.0fs", pods, h.Steady.Uplink.WindowS)
	}
	row(sec, "bytes up (agent -> apiserver, TLS included) per day", "MB", uplink(func(u *Uplink) float64 { return u.PerDay(u.UpBytes) / 1e6 }))
	row(sec, "bytes down per day", "MB", uplink(func(u *Uplink) float64 { return u.PerDay(u.DownBytes) / 1e6 }))
	row(sec, "bytes up and down per day", "MB", uplink(func(u *Uplink) float64 { return u.PerDay(u.UpBytes+u.DownBytes) / 1e6 }))
	row(sec, "connections opened in the window", "count", uplink(func(u *Uplink) float64 { return float64(u.ConnectionsOpened) }))
	row(sec, "connections open", "count", uplink(func(u *Uplink) float64 { return float64(u.ConnectionsOpen) }))
	for _, k := range requestKinds {
		row(sec, "requests/min: "+k.name, "/min", uplink(func(u *Uplink) float64 { return u.PerMinute(k.match) }))
	}

	// Per pod of the churn, less what the heartbeats and watches sent meanwhile (the steady
	// state's rate over the churn's duration; the kubelet's churn lasts longer, until its
	// container garbage collection removes the containers).
	churn := func(f func(u *Uplink) float64) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			if a.Churn == nil || a.ChurnPods == 0 || a.Steady == nil || a.Steady.Uplink == nil || a.Steady.Uplink.WindowS <= 0 {
				return 0, false
			}
			idle := f(a.Steady.Uplink) * a.Churn.WindowS / a.Steady.Uplink.WindowS
			return (f(a.Churn) - idle) / float64(a.ChurnPods), true
		}
	}
	sec = fmt.Sprintf("uplink, churn: %v pods created, started, deleted one after the other, per pod (bytes: steady traffic subtracted)", lat)
	row(sec, "bytes up per pod", "KB", churn(func(u *Uplink) float64 { return float64(u.UpBytes) / 1e3 }))
	row(sec, "bytes down per pod", "KB", churn(func(u *Uplink) float64 { return float64(u.DownBytes) / 1e3 }))
	// Requests are counted as they are, the Lease renewals left out (the periodic ones).
	perPod := func(match func(verb, resource string) bool) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			if a.Churn == nil || a.ChurnPods == 0 {
				return 0, false
			}
			return a.Churn.PerMinute(match) * a.Churn.WindowS / 60 / float64(a.ChurnPods), true
		}
	}
	row(sec, "requests per pod, Lease renewals left out", "/pod", perPod(func(_, r string) bool { return r != "leases" }))
	for _, k := range requestKinds[1:] {
		if k.name == "lists" || k.name == "Lease" {
			continue
		}
		row(sec, "requests per pod: "+k.name, "/pod", perPod(k.match))
	}

	flashStart := len(r.Rows)
	r.flashRows(row)
	if r.Options["only"] == OnlyFlash {
		r.Rows = slices.Delete(r.Rows, 0, flashStart)
		return
	}

	restarts := func(f func(Restart) float64) func(*AgentResult) []float64 {
		return func(a *AgentResult) []float64 {
			var xs []float64
			for _, r := range a.Restarts {
				xs = append(xs, f(r))
			}
			return xs
		}
	}
	sec = fmt.Sprintf("agent restart, kill -9 with %v pods, median of %v", pods, reps)
	row(sec, "first start -> node Ready", "s", func(a *AgentResult) (float64, bool) { return a.FirstNodeReadyS, a.FirstNodeReadyS > 0 })
	row(sec, "restart -> node Ready again", "s", pct(restarts(func(r Restart) float64 { return r.NodeReadyS }), 50))
	row(sec, "restart -> node Ready again, worst", "s", pct(restarts(func(r Restart) float64 { return r.NodeReadyS }), 100))
	row(sec, "restart -> all pods Ready again in the API", "s", pct(restarts(func(r Restart) float64 { return r.PodsReadyS }), 50))
	row(sec, "containers restarted (all reps)", "count", func(a *AgentResult) (float64, bool) {
		n := 0
		for _, r := range a.Restarts {
			n += r.ContainersRestarted
		}
		return float64(n), len(a.Restarts) > 0
	})
	if (h != nil && len(h.OfflineBootS) > 0) || (c != nil && len(c.OfflineBootS) > 0) {
		sec = "offline boot (holdfast only)"
		bootFloor, boot := pct(func(a *AgentResult) []float64 { return a.BootFloorS }, 50), pct(func(a *AgentResult) []float64 { return a.OfflineBootS }, 50)
		row(sec, "boot floor: minimal loop, netns + CNI ADD + task start per cached pod", "s", bootFloor)
		row(sec, fmt.Sprintf("reboot, apiserver down -> %v cached pods running", pods), "s", boot)
		if k != nil {
			r.Rows[len(r.Rows)-1].KubeletText = "cannot"
		}
		row(sec, "offline boot / boot floor", "x", ratioOf(boot, bootFloor))
		if c != nil && len(c.OfflineBootS) > 0 && len(c.BootFloorS) == 0 {
			r.Notes = append(r.Notes, "holdfast-cri's offline boot has no boot floor: the floor's loop restarts the containers "+
				"from their stored specs through the containerd client, and the CRI plugin's containers need what the reboot took "+
				"(each sandbox's /dev/shm in containerd's state directory, its network namespace); on the CRI backend the runtime "+
				"makes a new sandbox per pod, which that loop does not do")
		}
	}
	if r.Wasm != nil {
		for _, b := range r.Wasm.Benchmarks {
			if v, ok := b.Metrics["ns/op"]; ok {
				r.Rows = append(r.Rows, Row{Section: "wasm (go test -bench ./wasm/)", Metric: b.Name, Unit: "us/op", Holdfast: ptr.To(v / 1000)})
			}
		}
	}
}

// ratioOf divides two figures of an agent, if both were measured and the divisor is positive.
func ratioOf(num, den func(*AgentResult) (float64, bool)) func(*AgentResult) (float64, bool) {
	return func(a *AgentResult) (float64, bool) {
		n, okN := num(a)
		d, okD := den(a)
		return n / d, okN && okD && d > 0
	}
}

// sumOf adds two figures of an agent, if both were measured.
func sumOf(x, y func(*AgentResult) (float64, bool)) func(*AgentResult) (float64, bool) {
	return func(a *AgentResult) (float64, bool) {
		vx, okX := x(a)
		vy, okY := y(a)
		return vx + vy, okX && okY
	}
}

// percentile is series.percentile over float samples.
func percentile(xs []float64, q float64) float64 {
	s := make(series, len(xs))
	for i, x := range xs {
		s[i] = time.Duration(x * float64(time.Millisecond))
	}
	return millis(s.percentile(q))
}

func formatValue(v *float64, unit, text string) string {
	switch {
	case v == nil && text != "":
		return text
	case v == nil:
		return "-"
	case unit == "count":
		return fmt.Sprintf("%.0f", *v)
	case unit == "x":
		return fmt.Sprintf("%.1fx", *v)
	}
	a := math.Abs(*v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f %s", *v, unit)
	case a >= 10:
		return fmt.Sprintf("%.1f %s", *v, unit)
	default:
		return fmt.Sprintf("%.2f %s", *v, unit)
	}
}

func formatRatio(r *float64) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("%.2f", *r)
}

// column is one of the table's value columns.
type column struct {
	header string
	cell   func(Row) string
}

// columns are the table's value columns: holdfast, holdfast-cri (when it was measured),
// kubelet, then the ratios to the kubelet: holdfast/kubelet, holdfast-cri/kubelet.
func (r *Report) columns() []column {
	cri := r.Agent(HoldfastCRI) != nil
	cols := []column{{Holdfast, func(rw Row) string { return formatValue(rw.Holdfast, rw.Unit, "") }}}
	if cri {
		cols = append(cols, column{HoldfastCRI, func(rw Row) string { return formatValue(rw.HoldfastCRI, rw.Unit, "") }})
	}
	cols = append(cols,
		column{Kubelet, func(rw Row) string { return formatValue(rw.Kubelet, rw.Unit, rw.KubeletText) }},
		column{Holdfast + "/" + Kubelet, func(rw Row) string { return formatRatio(rw.Ratio) }})
	if cri {
		cols = append(cols, column{HoldfastCRI + "/" + Kubelet, func(rw Row) string { return formatRatio(rw.RatioCRI) }})
	}
	return cols
}

// Table renders the rows as aligned text: metric | holdfast | holdfast-cri | kubelet |
// holdfast/kubelet | holdfast-cri/kubelet, the holdfast-cri columns only if it was measured.
func (r *Report) Table() string {
	cols := r.columns()
	header := []string{"metric"}
	for _, c := range cols {
		header = append(header, c.header)
	}
	var lines [][]string
	section := ""
	for _, rw := range r.Rows {
		if rw.Section != section {
			section = rw.Section
			lines = append(lines, append([]string{"[" + section + "]"}, make([]string, len(cols))...))
		}
		l := []string{"  " + rw.Metric}
		for _, c := range cols {
			l = append(l, c.cell(rw))
		}
		lines = append(lines, l)
	}
	width := make([]int, len(header))
	for _, l := range append([][]string{header}, lines...) {
		for i, c := range l {
			if i == 0 && strings.HasPrefix(c, "[") {
				continue
			}
			width[i] = max(width[i], len(c))
		}
	}
	var b strings.Builder
	write := func(l []string) {
		for i, c := range l {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", width[i], c)
			} else {
				fmt.Fprintf(&b, " | %*s", width[i], c)
			}
		}
		b.WriteString("\n")
	}
	write(header)
	total := width[0]
	for _, w := range width[1:] {
		total += 3 + w
	}
	b.WriteString(strings.Repeat("-", total) + "\n")
	for _, l := range lines {
		if strings.HasPrefix(l[0], "[") {
			b.WriteString(l[0] + "\n")
			continue
		}
		write(l)
	}
	if pt := r.phasesTable(Holdfast, false); pt != "" {
		b.WriteString("\nWhere holdfast's pod starts went, mean per pod (its start trace):\n" + pt)
	}
	if pt := r.phasesTable(HoldfastCRI, false); pt != "" {
		b.WriteString("\nWhere holdfast-cri's pod starts went (CRI backend), mean per pod (its start trace):\n" + pt)
	}
	b.WriteString(r.flashFiles(false))
	return b.String()
}

// Markdown renders the report for docs/benchmarks.md.
func (r *Report) Markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## Run of %s (%s mode, took %s)\n\n", r.Date.Format("2006-01-02 15:04 MST"), r.Mode, r.Took)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %d GiB, %s, kernel %s; %s; %s; %s. Load average (1, 5, 15 min) %s before, %s after.\n\n",
		m.CPU, m.Cores, m.MemoryGiB, m.OS, m.Kernel, m.Go, m.Containerd, m.Runc, m.LoadBefore, m.LoadAfter)
	var versions []string
	for _, a := range r.Agents {
		versions = append(versions, fmt.Sprintf("%s %s", a.Agent, a.Version))
	}
	fmt.Fprintf(&b, "Agents: %s. Options: %s.\n\n", strings.Join(versions, ", "), formatOptions(r.Options))
	cols := r.columns()
	b.WriteString("| metric |")
	for _, c := range cols {
		b.WriteString(" " + c.header + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(cols)) + "\n")
	section := ""
	for _, rw := range r.Rows {
		if rw.Section != section {
			section = rw.Section
			fmt.Fprintf(&b, "| **%s** |%s\n", section, strings.Repeat(" |", len(cols)))
		}
		fmt.Fprintf(&b, "| %s |", strings.TrimSpace(rw.Metric))
		for _, c := range cols {
			fmt.Fprintf(&b, " %s |", c.cell(rw))
		}
		b.WriteString("\n")
	}
	steadyUplink := func(a *AgentResult) *Uplink {
		if a.Steady == nil {
			return nil
		}
		return a.Steady.Uplink
	}
	if rq := r.requestsMarkdown(steadyUplink); rq != "" {
		b.WriteString("\nRequests to the apiserver in the steady state's uplink window, by verb and resource (the audit log), per minute.\n\n")
		b.WriteString(rq)
	}
	if rq := r.requestsMarkdown(func(a *AgentResult) *Uplink { return a.Churn }); rq != "" {
		b.WriteString("\nRequests to the apiserver while the latency pods churned (created, started, deleted one after the other), per minute.\n\n")
		b.WriteString(rq)
	}
	if bd := r.breakdownMarkdown(); bd != "" {
		b.WriteString("\nNode overhead in the steady state, by process: CPU millicores / PSS MiB / disk writes KiB per minute.\n\n")
		b.WriteString(bd)
	}
	if mt := r.memoryMarkdown(); mt != "" {
		b.WriteString("\nWhere holdfast's memory was at the end of the steady window: resident pages by mapping (/proc/PID/smaps), the Go runtime's accounting (runtime.MemStats, from the heap profile on the local socket; what it mapped or holds, not what is resident).\n\n")
		b.WriteString(mt)
	}
	if pt := r.phasesTable(Holdfast, true); pt != "" {
		b.WriteString("\nWhere holdfast's pod starts went, mean per pod, from its start trace (`holdfast_pod_start_phase_duration_seconds`):\n\n")
		b.WriteString(pt)
	}
	if pt := r.phasesTable(HoldfastCRI, true); pt != "" {
		b.WriteString("\nWhere holdfast-cri's pod starts went (CRI backend), mean per pod, from its start trace:\n\n")
		b.WriteString(pt)
	}
	b.WriteString(r.flashFiles(true))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\n- %s", n)
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
	}
	if r.Wasm != nil {
		b.WriteString("\n" + r.Wasm.outputDetails(fmt.Sprintf("go test -bench %s -benchtime %s ./wasm/, opa bench -t rego and -t wasm", r.Wasm.Pattern, r.Wasm.Benchtime)))
	}
	return b.String()
}

// requestsMarkdown tabulates every agent's requests in the uplink window of, per minute.
func (r *Report) requestsMarkdown(of func(*AgentResult) *Uplink) string {
	var agents []*AgentResult
	keys := map[string]bool{}
	for _, a := range r.Agents {
		if u := of(a); u != nil {
			agents = append(agents, a)
			for k := range u.Requests {
				keys[k] = true
			}
		}
	}
	if len(agents) == 0 {
		return ""
	}
	sorted := slices.Sorted(maps.Keys(keys))
	var b strings.Builder
	b.WriteString("| request |")
	for _, a := range agents {
		fmt.Fprintf(&b, " %s |", a.Agent)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(agents)) + "\n")
	for _, k := range sorted {
		fmt.Fprintf(&b, "| %s |", k)
		for _, a := range agents {
			u := of(a)
			fmt.Fprintf(&b, " %.2f |", float64(u.Requests[k])*60/u.WindowS)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// breakdownMarkdown tabulates Steady.Breakdown for every agent.
func (r *Report) breakdownMarkdown() string {
	kinds := []string{"agent", "containerd", "shims", "helpers"}
	var b strings.Builder
	b.WriteString("| agent | " + strings.Join(kinds, " | ") + " |\n|---|" + strings.Repeat("---:|", len(kinds)) + "\n")
	n := 0
	for _, a := range r.Agents {
		if a.Steady == nil || a.Steady.Breakdown == nil {
			continue
		}
		n++
		fmt.Fprintf(&b, "| %s |", a.Agent)
		for _, k := range kinds {
			if s := a.Steady.Breakdown[k]; s != nil {
				fmt.Fprintf(&b, " %.1f / %.1f / %.0f (%d) |", s.CPUMillicores, s.PSSMiB, s.WriteKiBPerMin, s.Processes)
			} else {
				b.WriteString(" - |")
			}
		}
		b.WriteString("\n")
	}
	if n == 0 {
		return ""
	}
	return b.String() + "\n(n) is the number of processes.\n"
}

func formatOptions(o map[string]any) string {
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, o[k]))
	}
	return strings.Join(parts, " ")
}

// write writes results.md, results.json and table.txt into dir.
func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"results.json": append(js, '\n'),
		"results.md":   []byte(r.Markdown()),
		"table.txt":    []byte(r.Table()),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func describeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	m.MemoryGiB = int(math.Round(float64(procfs.KBField("/proc/meminfo", "MemTotal:")) / (1 << 30)))
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	m.Containerd = firstLine("containerd", "--version")
	m.Runc = firstLine("runc", "--version")
	return m
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return name + " (unknown version)"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
