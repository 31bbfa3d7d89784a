package fleet

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on every Linux architecture).
const clockTicks = 100

// cpuSeconds is the CPU time a process used so far, user and system.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name in parentheses may hold spaces: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseUint(f[12], 10, 64) // field 15
	return float64(utime+stime) / clockTicks, nil
}

// rssBytes is a process's resident set (VmRSS); 0 when it cannot be read.
func rssBytes(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, _ := strconv.ParseUint(f[0], 10, 64)
				return n * 1024
			}
		}
	}
	return 0
}
