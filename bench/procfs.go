package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux architecture
// holdfast runs on (the kernel fixes it for user space whatever CONFIG_HZ is).
const clockTicks = 100

// procStat is what the harness reads about one process.
type procStat struct {
	pid, ppid int
	// startTime (ticks after boot) tells a process from a later one that reuses its pid.
	startTime uint64
	// cpuTicks is utime+stime of the process plus cutime+cstime of the children it reaped
	// (CNI plugins, mount helpers): work done for it.
	cpuTicks uint64
	// rss is VmRSS in bytes; pss the proportional set size (shared pages divided among the
	// processes sharing them), which sums correctly over a set of processes.
	rss, pss uint64
	// writeBytes is /proc/PID/io write_bytes: bytes this process caused to be written to
	// storage (page cache pages it dirtied), the figure that wears flash.
	writeBytes uint64
	argv       []string
}

// readStat reads /proc/PID/stat (and with full, status, smaps_rollup and io).
func readStat(pid int, full bool) (procStat, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	s := procStat{pid: pid}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return s, err
	}
	// The command name in parentheses may hold spaces: fields start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 20 {
		return s, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	num := func(n int) uint64 { v, _ := strconv.ParseUint(f[n-3], 10, 64); return v }
	s.ppid = int(num(4))
	s.cpuTicks = num(14) + num(15) + num(16) + num(17)
	s.startTime = num(22)
	if cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		s.argv = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	}
	if !full {
		return s, nil
	}
	s.rss = kbField(filepath.Join(dir, "status"), "VmRSS:")
	s.pss = kbField(filepath.Join(dir, "smaps_rollup"), "Pss:")
	if io, err := os.ReadFile(filepath.Join(dir, "io")); err == nil {
		for _, line := range strings.Split(string(io), "\n") {
			if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
				s.writeBytes, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			}
		}
	}
	return s, nil
}

// kbField returns the value of a "Name:   123 kB" line of a /proc file, in bytes.
func kbField(path, name string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				n, _ := strconv.ParseUint(fields[0], 10, 64)
				return n * 1024
			}
		}
	}
	return 0
}

// allProcs reads the stat of every process (not the full set of files).
func allProcs() []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(pid, false); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// nodeProcs are the processes a node runs on an agent's behalf, found by the containerd
// socket they serve.
type nodeProcs struct {
	containerd int
	shims      []int
	// helpers are per-pod or per-container processes that are not the workload: holdfast's
	// container loggers, the sandbox (pause) processes of the CRI plugin.
	helpers []int
	// workload are the containers' own processes (not counted as overhead).
	workload []int
}

// findNodeProcs finds the containerd daemon listening on address, its shims and their
// children. isHelper tells a helper child from a workload one by its command line.
func findNodeProcs(address string, isHelper func(argv []string) bool) nodeProcs {
	var n nodeProcs
	procs := allProcs()
	shim := map[int]bool{}
	for _, p := range procs {
		if len(p.argv) == 0 {
			continue
		}
		base := filepath.Base(p.argv[0])
		switch {
		case base == "containerd":
			for i, a := range p.argv[:len(p.argv)-1] {
				if a == "--config" && configHasAddress(p.argv[i+1], address) {
					n.containerd = p.pid
				}
			}
		case strings.Contains(base, "containerd-shim"):
			for i, a := range p.argv[:len(p.argv)-1] {
				if (a == "-address" || a == "--address") && p.argv[i+1] == address {
					shim[p.pid] = true
					n.shims = append(n.shims, p.pid)
				}
			}
		}
	}
	for _, p := range procs {
		if !shim[p.ppid] {
			continue
		}
		if isHelper(p.argv) {
			n.helpers = append(n.helpers, p.pid)
		} else {
			n.workload = append(n.workload, p.pid)
		}
	}
	return n
}

// containerdLog returns the log file of the containerd daemon serving address, which
// internal/testenv writes next to the daemon's configuration file.
func containerdLog(address string) string {
	for _, p := range allProcs() {
		if len(p.argv) == 0 || filepath.Base(p.argv[0]) != "containerd" {
			continue
		}
		for i, a := range p.argv[:len(p.argv)-1] {
			if a == "--config" && configHasAddress(p.argv[i+1], address) {
				return filepath.Join(filepath.Dir(p.argv[i+1]), "containerd.log")
			}
		}
	}
	return ""
}

func configHasAddress(path, address string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(strconv.Quote(address)))
}

// overhead lists every pid of n that is not workload.
func (n nodeProcs) overhead() []int {
	var out []int
	if n.containerd != 0 {
		out = append(out, n.containerd)
	}
	out = append(out, n.shims...)
	return append(out, n.helpers...)
}
