package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Memory is where a holdfast agent's memory was at the end of the steady window (issue 31's
// "smaps/heap breakdown"): its resident pages by mapping, from /proc/PID/smaps, and the Go
// runtime's own accounting of what it mapped, from the runtime.MemStats the heap profile's text
// form ends with (the agent's local socket, /debug/pprof/heap?debug=1). The heap profile itself
// is kept in the results directory, and its largest in-use allocation sites are listed.
type Memory struct {
	// Resident pages by mapping, MiB (smaps' Rss).
	ExecutableMiB float64 `json:"executableMiB"`
	StateDBMiB    float64 `json:"stateDbMiB"`
	OtherFilesMiB float64 `json:"otherFilesMiB"`
	AnonymousMiB  float64 `json:"anonymousMiB"`
	// The Go runtime's accounting, MiB. These are what it mapped or holds, not what is
	// resident: HeapIdleRetained is heap memory free but not yet returned to the kernel.
	HeapLiveMiB         float64 `json:"heapLiveMiB"` // HeapAlloc: objects reachable or not yet collected
	HeapInuseMiB        float64 `json:"heapInuseMiB"`
	HeapIdleRetainedMiB float64 `json:"heapIdleRetainedMiB"` // HeapIdle - HeapReleased
	NextGCMiB           float64 `json:"nextGcMiB"`
	StacksMiB           float64 `json:"stacksMiB"`       // StackInuse
	GCMetadataMiB       float64 `json:"gcMetadataMiB"`   // GCSys
	ProfilingMiB        float64 `json:"profilingMiB"`    // BuckHashSys: the profiler's bucket table and buckets
	OtherRuntimeMiB     float64 `json:"otherRuntimeMiB"` // MSpanSys + MCacheSys + OtherSys
	Goroutines          int     `json:"goroutines"`
	HeapProfile         string  `json:"heapProfile"`        // file name in the results directory
	MemProfileRate      int     `json:"memProfileRate"`     // the agent's GODEBUG=memprofilerate; 0: heap profiling off, its default
	TopInuse            []Site  `json:"topInuse,omitempty"` // largest in-use sites (go tool pprof -top), sampled
}

// Site is one line of `go tool pprof -top`: a function and the in-use heap allocated there.
type Site struct {
	Function string  `json:"function"`
	FlatKiB  float64 `json:"flatKiB"`
	CumKiB   float64 `json:"cumKiB"`
}

// memory reads pid's smaps and its runtime's MemStats and heap profile through its local API
// socket; the profile is written to outDir (if set) as AGENT-heap.pb.gz when the agent runs
// with heap profiling on (rate, its GODEBUG=memprofilerate; off by default, and then the
// MemStats alone are read). exe is the agent's executable (its mapping is the executable's
// pages).
func memory(ctx context.Context, agent string, pid int, exe, socket, outDir string, rate int) (*Memory, error) {
	m := &Memory{MemProfileRate: rate}
	if err := m.readSmaps(pid, exe); err != nil {
		return nil, err
	}
	get := func(path string) ([]byte, error) { return testenv.LocalGet(ctx, socket, path) }
	// The binary profile first: the text form's own allocations would be in it otherwise.
	if outDir != "" && rate != 0 {
		prof, err := get("/debug/pprof/heap")
		if err != nil {
			return nil, err
		}
		m.HeapProfile = agent + "-heap.pb.gz"
		path := filepath.Join(outDir, m.HeapProfile)
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, prof, 0o644); err != nil {
			return nil, err
		}
		out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=20", path).Output()
		if err != nil {
			return nil, fmt.Errorf("go tool pprof -top %s: %w", path, err)
		}
		m.TopInuse = parsePprofTop(string(out))
	}
	text, err := get("/debug/pprof/heap?debug=1")
	if err != nil {
		return nil, err
	}
	if err := m.parseMemStats(string(text)); err != nil {
		return nil, err
	}
	gr, err := get("/debug/pprof/goroutine?debug=1")
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Sscanf(string(gr), "goroutine profile: total %d", &m.Goroutines); err != nil {
		return nil, fmt.Errorf("goroutine profile: %w", err)
	}
	return m, nil
}

// readSmaps sums the Rss of pid's mappings by kind.
func (m *Memory) readSmaps(pid int, exe string) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	exeReal, _ := filepath.EvalSymlinks(exe)
	var target *float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: address perms offset dev inode [path].
			path := ""
			if len(fields) >= 6 {
				path = strings.Join(fields[5:], " ")
			}
			switch {
			case path == "" || strings.HasPrefix(path, "["):
				target = &m.AnonymousMiB
			case path == exe || path == exeReal:
				target = &m.ExecutableMiB
			case strings.HasSuffix(path, "/state.db"):
				target = &m.StateDBMiB
			default:
				target = &m.OtherFilesMiB
			}
			continue
		}
		if len(fields) == 3 && fields[0] == "Rss:" && target != nil {
			kb, err := strconv.ParseFloat(fields[1], 64)
			if err != nil {
				return fmt.Errorf("smaps: %q: %w", line, err)
			}
			*target += kb / 1024
		}
	}
	return sc.Err()
}

// parseMemStats reads the "# runtime.MemStats" block of a heap profile's text form.
func (m *Memory) parseMemStats(text string) error {
	stats := map[string]float64{}
	_, block, ok := strings.Cut(text, "# runtime.MemStats\n")
	if !ok {
		return fmt.Errorf("heap profile: no runtime.MemStats block")
	}
	for line := range strings.Lines(block) {
		key, val, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "# "), " = ")
		if !ok {
			continue
		}
		if key == "Stack" || key == "MSpan" || key == "MCache" {
			// "inuse / sys"
			inuse, sys, _ := strings.Cut(val, " / ")
			a, err1 := strconv.ParseFloat(inuse, 64)
			b, err2 := strconv.ParseFloat(sys, 64)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("heap profile: %q", line)
			}
			stats[key+"Inuse"], stats[key+"Sys"] = a, b
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			stats[key] = v
		}
	}
	for _, k := range []string{"HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "NextGC", "StackInuse", "GCSys", "BuckHashSys", "MSpanSys", "MCacheSys", "OtherSys"} {
		if _, ok := stats[k]; !ok {
			return fmt.Errorf("heap profile: runtime.MemStats has no %s", k)
		}
	}
	mib := func(v float64) float64 { return v / (1 << 20) }
	m.HeapLiveMiB = mib(stats["HeapAlloc"])
	m.HeapInuseMiB = mib(stats["HeapInuse"])
	m.HeapIdleRetainedMiB = mib(stats["HeapIdle"] - stats["HeapReleased"])
	m.NextGCMiB = mib(stats["NextGC"])
	m.StacksMiB = mib(stats["StackInuse"])
	m.GCMetadataMiB = mib(stats["GCSys"])
	m.ProfilingMiB = mib(stats["BuckHashSys"])
	m.OtherRuntimeMiB = mib(stats["MSpanSys"] + stats["MCacheSys"] + stats["OtherSys"])
	return nil
}

// parsePprofTop reads the rows of `go tool pprof -top`: "flat flat% sum% cum cum% function".
func parsePprofTop(out string) []Site {
	var sites []Site
	inRows := false
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "flat" && f[1] == "flat%" { // the header names no function column
			inRows = true
			continue
		}
		if !inRows || len(f) < 6 {
			continue
		}
		flat, ok1 := parseKiB(f[0])
		cum, ok2 := parseKiB(f[3])
		if !ok1 || !ok2 {
			continue
		}
		sites = append(sites, Site{Function: strings.Join(f[5:], " "), FlatKiB: flat, CumKiB: cum})
	}
	return sites
}

// parseKiB reads pprof's sizes: "536.37kB", "1.50MB", "512B", "0".
func parseKiB(s string) (float64, bool) {
	mult := 1.0 / 1024
	switch {
	case strings.HasSuffix(s, "kB"):
		s, mult = strings.TrimSuffix(s, "kB"), 1
	case strings.HasSuffix(s, "MB"):
		s, mult = strings.TrimSuffix(s, "MB"), 1024
	case strings.HasSuffix(s, "GB"):
		s, mult = strings.TrimSuffix(s, "GB"), 1024*1024
	case strings.HasSuffix(s, "B"):
		s = strings.TrimSuffix(s, "B")
	}
	v, err := strconv.ParseFloat(s, 64)
	return v * mult, err == nil
}

// memoryMarkdown renders the holdfast agents' Memory side by side.
func (r *Report) memoryMarkdown() string {
	var agents []*AgentResult
	for _, a := range r.Agents {
		if a.Steady != nil && a.Steady.Memory != nil {
			agents = append(agents, a)
		}
	}
	if len(agents) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| at the end of the steady window |")
	for _, a := range agents {
		b.WriteString(" " + a.Agent + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(agents)) + "\n")
	line := func(label string, f func(*Memory) string) {
		fmt.Fprintf(&b, "| %s |", label)
		for _, a := range agents {
			fmt.Fprintf(&b, " %s |", f(a.Steady.Memory))
		}
		b.WriteString("\n")
	}
	mib := func(f func(*Memory) float64) func(*Memory) string {
		return func(m *Memory) string { return fmt.Sprintf("%.1f MiB", f(m)) }
	}
	line("resident: the executable's pages", mib(func(m *Memory) float64 { return m.ExecutableMiB }))
	line("resident: the state database's mapping", mib(func(m *Memory) float64 { return m.StateDBMiB }))
	line("resident: other files", mib(func(m *Memory) float64 { return m.OtherFilesMiB }))
	line("resident: anonymous", mib(func(m *Memory) float64 { return m.AnonymousMiB }))
	line("Go: heap objects (HeapAlloc: live and not yet collected)", mib(func(m *Memory) float64 { return m.HeapLiveMiB }))
	line("Go: heap spans in use (HeapInuse)", mib(func(m *Memory) float64 { return m.HeapInuseMiB }))
	line("Go: heap free, not returned (HeapIdle - HeapReleased)", mib(func(m *Memory) float64 { return m.HeapIdleRetainedMiB }))
	line("Go: next GC at (NextGC)", mib(func(m *Memory) float64 { return m.NextGCMiB }))
	line("Go: goroutine stacks (StackInuse)", mib(func(m *Memory) float64 { return m.StacksMiB }))
	line("Go: GC metadata, mapped (GCSys)", mib(func(m *Memory) float64 { return m.GCMetadataMiB }))
	line("Go: profiler buckets, mapped (BuckHashSys)", mib(func(m *Memory) float64 { return m.ProfilingMiB }))
	line("Go: other runtime, mapped (MSpanSys + MCacheSys + OtherSys)", mib(func(m *Memory) float64 { return m.OtherRuntimeMiB }))
	line("goroutines", func(m *Memory) string { return strconv.Itoa(m.Goroutines) })
	line("heap profile kept (results directory)", func(m *Memory) string {
		if m.MemProfileRate == 0 {
			return "none: heap profiling off (the agent's default; -bench.memprofilerate turns it on)"
		}
		return m.HeapProfile
	})
	for _, a := range agents {
		m := a.Steady.Memory
		if len(m.TopInuse) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s's largest in-use heap sites (`go tool pprof -top -sample_index=inuse_space %s`; sampled one per %d allocated bytes on average):\n\n", a.Agent, m.HeapProfile, m.MemProfileRate)
		b.WriteString("| function | flat | cum |\n|---|---:|---:|\n")
		for _, s := range m.TopInuse {
			if s.FlatKiB == 0 {
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %.0f KiB | %.0f KiB |\n", s.Function, s.FlatKiB, s.CumKiB)
		}
	}
	return b.String()
}
