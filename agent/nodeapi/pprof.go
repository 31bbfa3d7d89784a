package nodeapi

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The agent's own Go profiles on the local socket, served from runtime/pprof directly rather
// than by net/http/pprof: that package links Go's profile parser (internal/profile, for the
// delta profiles of `?seconds=N` on heap, allocs, block, mutex and goroutine), the execution
// tracer's handler and its HTML index, about 0.25 MiB of the agent's binary (issue 31), and
// registers its handlers on http.DefaultServeMux when imported. What is served is what the
// README and the benchmarks use: every named profile as of now (`debug=N` for text, `gc=1`
// to collect first for heap), and a CPU profile over `seconds=N`.

// goHeapProfileRate is the Go runtime's default heap profile sampling rate (bytes).
const goHeapProfileRate = 512 * 1024

// ConfigureHeapProfiling turns the runtime's heap profiling off unless godebug (the
// process's GODEBUG) sets memprofilerate=N, and reports whether it is on. Sampling costs
// little CPU, but each distinct allocation stack it samples takes a bucket, and the runtime's
// bucket table (1.4 MiB) fills a page at a time wherever the stacks hash to: in the run of
// 2026-12-07 with 30 pods its buckets and table were 1.5 MiB mapped (BuckHashSys), for a
// profile nobody asked for. An operator who wants heap profiles restarts the agent with
// GODEBUG=memprofilerate=524288 (Go's default); /debug/pprof/heap says so meanwhile. Call it
// first thing in main: allocations before it may be sampled.
func ConfigureHeapProfiling(godebug string) bool {
	// Read as the runtime reads it (runtime1.go, parsegodebug): comma-separated key=value, no
	// spaces trimmed; a value that is not a number is ignored, and any number sets the rate
	// (the last one wins; zero or less is off).
	set := false
	for setting := range strings.SplitSeq(godebug, ",") {
		key, value, _ := strings.Cut(setting, "=")
		if _, err := strconv.Atoi(value); key == "memprofilerate" && err == nil {
			set = true
		}
	}
	if !set {
		runtime.MemProfileRate = 0
	}
	return runtime.MemProfileRate > 0
}

// defaultCPUProfileSeconds is the length of a CPU profile without ?seconds=, net/http/pprof's.
const defaultCPUProfileSeconds = 30

// serveProfileIndex serves /debug/pprof/: the list of profiles, or the named one,
// /debug/pprof/NAME.
func serveProfileIndex(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/debug/pprof/")
	if name == "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		profiles := pprof.Profiles()
		sort.Slice(profiles, func(i, j int) bool { return profiles[i].Name() < profiles[j].Name() })
		for _, p := range profiles {
			fmt.Fprintf(w, "%d\t%s\n", p.Count(), p.Name())
		}
		fmt.Fprintln(w, "-\tprofile (CPU, ?seconds=N)")
		return
	}
	p := pprof.Lookup(name)
	if p == nil {
		http.Error(w, fmt.Sprintf("no profile %q (GET /debug/pprof/ lists them)", name), http.StatusNotFound)
		return
	}
	debug, _ := strconv.Atoi(r.FormValue("debug"))
	if r.FormValue("seconds") != "" {
		http.Error(w, "delta profiles (seconds=) are not served: take two profiles and compare them (go tool pprof -base)", http.StatusBadRequest)
		return
	}
	if (name == "heap" || name == "allocs") && debug == 0 && runtime.MemProfileRate <= 0 {
		// The text form (debug=1) is still served: it ends with the runtime's MemStats,
		// which need no sampling.
		http.Error(w, fmt.Sprintf("heap profiling is off in this agent (its default, for the memory it costs): restart holdfast with GODEBUG=memprofilerate=%d to take %s profiles; ?debug=1 still serves the runtime's MemStats", goHeapProfileRate, name), http.StatusConflict)
		return
	}
	if name == "heap" && r.FormValue("gc") != "" {
		runtime.GC()
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if debug != 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s"`, name))
	}
	_ = p.WriteTo(w, debug)
}

// serveCPUProfile serves /debug/pprof/profile: a CPU profile over ?seconds=N (default 30),
// cut short when the client goes away.
func serveCPUProfile(w http.ResponseWriter, r *http.Request) {
	sec := defaultCPUProfileSeconds
	if s := r.FormValue("seconds"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			http.Error(w, fmt.Sprintf("seconds=%q: a positive number of seconds", s), http.StatusBadRequest)
			return
		}
		sec = n
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="profile"`)
	if err := pprof.StartCPUProfile(w); err != nil {
		// Another CPU profile is running: the header is not sent yet.
		w.Header().Del("Content-Disposition")
		http.Error(w, fmt.Sprintf("could not start a CPU profile: %v", err), http.StatusInternalServerError)
		return
	}
	defer pprof.StopCPUProfile()
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(sec)*time.Second)
	defer cancel()
	<-ctx.Done()
}
