package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux architecture
// holdfast runs on (the kernel fixes it for user space whatever CONFIG_HZ is).
const ClockTicks = 100

// Process is what the benchmarks and the fleet harness read about one process.
type Process struct {
	PID, PPID int
	// StartTime (ticks after boot) tells a process from a later one that reuses its pid.
	StartTime uint64
	// CPUTicks is utime+stime of the process plus cutime+cstime of the children it reaped
	// (CNI plugins, mount helpers): work done for it.
	CPUTicks uint64
	// RSS is VmRSS in bytes; PSS the proportional set size (shared pages divided among the
	// processes sharing them), which sums correctly over a set of processes.
	RSS, PSS uint64
	// RSSFile and RSSAnon split RSS (full only): pages of files (the executable's, the
	// libraries', mapped files') and anonymous pages (the heap, stacks).
	RSSFile, RSSAnon uint64
	// WriteBytes is /proc/PID/io write_bytes: bytes this process caused to be written to
	// storage (page cache pages it dirtied), the figure that wears flash.
	WriteBytes uint64
	Argv       []string
}

// ReadProcess reads /proc/PID/stat (and with full, status, smaps_rollup and io).
func ReadProcess(pid int, full bool) (Process, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	s := Process{PID: pid}
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
	s.PPID = int(num(4))
	s.CPUTicks = num(14) + num(15) + num(16) + num(17)
	s.StartTime = num(22)
	if cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		s.Argv = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	}
	if !full {
		return s, nil
	}
	s.RSS = KBField(filepath.Join(dir, "status"), "VmRSS:")
	s.PSS = KBField(filepath.Join(dir, "smaps_rollup"), "Pss:")
	s.RSSFile = KBField(filepath.Join(dir, "status"), "RssFile:")
	s.RSSAnon = KBField(filepath.Join(dir, "status"), "RssAnon:")
	if io, err := os.ReadFile(filepath.Join(dir, "io")); err == nil {
		for _, line := range strings.Split(string(io), "\n") {
			if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
				s.WriteBytes, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			}
		}
	}
	return s, nil
}

// KBField returns the value of a "Name:   123 kB" line of a /proc file, in bytes.
func KBField(path, name string) uint64 {
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

// AllProcesses reads the stat of every process (not the full set of files).
func AllProcesses() []Process {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := ReadProcess(pid, false); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// CPUSeconds is the process's CPU time so far (CPUTicks in seconds).
func (p Process) CPUSeconds() float64 { return float64(p.CPUTicks) / ClockTicks }

// RSS is a process's resident set (VmRSS) in bytes; 0 when it cannot be read. It reads one
// file, where ReadProcess with full reads four.
func RSS(pid int) uint64 {
	return KBField(filepath.Join("/proc", strconv.Itoa(pid), "status"), "VmRSS:")
}
