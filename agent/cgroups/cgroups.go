// Package cgroups reads the control groups the runtime puts containers in, on either
// hierarchy: cgroup v1 (one tree per controller, this package's Legacy and Hybrid modes) and
// cgroup v2 (one unified tree, what Debian 12 with systemd runs). It owns the knowledge of
// which file holds what on each, so that callers ask for a limit, not for a file name.
package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Mode is how the host mounts its cgroups.
type Mode int

const (
	// Legacy: cgroup v1 only, one hierarchy per controller under the root.
	Legacy Mode = iota
	// Hybrid: cgroup v1 controllers, plus an empty cgroup v2 tree at <root>/unified that
	// systemd uses to track processes. Limits live in the v1 trees.
	Hybrid
	// Unified: cgroup v2 alone, at the root.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Legacy:
		return "v1"
	case Hybrid:
		return "v1 (hybrid)"
	case Unified:
		return "v2"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Hierarchy is a host's cgroup file systems.
type Hierarchy struct {
	// Root is where the cgroup file systems are mounted: /sys/fs/cgroup.
	Root string
	// Proc is the proc file system: /proc.
	Proc string
	Mode Mode
}

// Host returns this host's hierarchy, its mode detected as runc and containerd detect it.
func Host() Hierarchy {
	return Hierarchy{Root: "/sys/fs/cgroup", Proc: "/proc", Mode: DetectMode("/sys/fs/cgroup")}
}

// MountOptions are the options of the file system mounted at the hierarchy's root, its
// superblock's as /proc/self/mountinfo lists them (cgroup2's nsdelegate and
// memory_recursiveprot among them); none when nothing is mounted there.
func (h Hierarchy) MountOptions() ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(h.Root))
	if err != nil {
		return nil, fmt.Errorf("read the mount options of %s: %w", h.Root, err)
	}
	if len(mounts) == 0 {
		return nil, nil
	}
	return strings.Split(mounts[len(mounts)-1].VFSOptions, ","), nil
}

// DetectMode tells the hierarchy mounted at root by the file system types: a cgroup2 root is
// Unified, a cgroup2 <root>/unified is Hybrid, anything else Legacy.
func DetectMode(root string) Mode {
	var st unix.Statfs_t
	if unix.Statfs(root, &st) == nil && int64(st.Type) == unix.CGROUP2_SUPER_MAGIC {
		return Unified
	}
	if unix.Statfs(filepath.Join(root, "unified"), &st) == nil && int64(st.Type) == unix.CGROUP2_SUPER_MAGIC {
		return Hybrid
	}
	return Legacy
}

// ProcessDir is the directory of the cgroup process pid is in for controller ("cpu",
// "memory", ...). On a unified hierarchy every controller shares one directory.
func (h Hierarchy) ProcessDir(pid int, controller string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if h.Mode == Unified {
			if parts[0] == "0" && parts[1] == "" {
				return filepath.Join(h.Root, parts[2]), nil
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return filepath.Join(h.Root, controller, parts[2]), nil
			}
		}
	}
	return "", fmt.Errorf("process %d is in no %s cgroup (%s hierarchy)", pid, controller, h.Mode)
}

// SwapController says containers can be kept from swapping with memory.swap.max, as kubelet
// checks it: on cgroup v2 only, where the agent's own cgroup has the file (the root cgroup
// never has it; an agent in the root cannot tell, and says no).
func (h Hierarchy) SwapController() bool { return h.swapController(os.Getpid()) }

func (h Hierarchy) swapController(pid int) bool {
	if h.Mode != Unified {
		return false
	}
	dir, err := h.ProcessDir(pid, "memory")
	if err != nil || dir == h.Root {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, "memory.swap.max"))
	return err == nil
}

// Unlimited is what Limits reports for a limit that is not set.
const Unlimited = -1

// Limits are the resource limits of a process's cgroups.
type Limits struct {
	// CPUQuota and CPUPeriod are the CFS bandwidth limit in microseconds; CPUQuota is
	// Unlimited when there is none.
	CPUQuota  int64
	CPUPeriod int64
	// CPUShares (v1) or CPUWeight (v2) is the relative CPU weight; the other one is 0. runc
	// writes the weight of the shares asked for, see SharesToWeight.
	CPUShares uint64
	CPUWeight uint64
	// MemoryMax is the memory limit in bytes; Unlimited when there is none (v2 "max"; v1
	// reports the kernel's page counter maximum).
	MemoryMax int64
}

// Limits reads the limits of the cgroups process pid is in.
func (h Hierarchy) Limits(pid int) (Limits, error) {
	cpuDir, err := h.ProcessDir(pid, "cpu")
	if err != nil {
		return Limits{}, err
	}
	memDir, err := h.ProcessDir(pid, "memory")
	if err != nil {
		return Limits{}, err
	}
	return h.limitsIn(cpuDir, memDir)
}

// limitsIn reads the limits of the cgroup whose cpu and memory directories are given.
func (h Hierarchy) limitsIn(cpuDir, memDir string) (Limits, error) {
	var l Limits
	if h.Mode == Unified {
		// cpu.max: "QUOTA PERIOD", QUOTA "max" when unlimited.
		f, err := readFields(filepath.Join(cpuDir, "cpu.max"), 2)
		if err != nil {
			return l, err
		}
		if l.CPUQuota, err = parseMax(f[0]); err != nil {
			return l, err
		}
		if l.CPUPeriod, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return l, fmt.Errorf("cpu.max period %q: %w", f[1], err)
		}
		if l.CPUWeight, err = readUint(filepath.Join(cpuDir, "cpu.weight")); err != nil {
			return l, err
		}
		f, err = readFields(filepath.Join(memDir, "memory.max"), 1)
		if err != nil {
			return l, err
		}
		l.MemoryMax, err = parseMax(f[0])
		return l, err
	}
	f, err := readFields(filepath.Join(cpuDir, "cpu.cfs_quota_us"), 1)
	if err != nil {
		return l, err
	}
	if l.CPUQuota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
		return l, fmt.Errorf("cpu.cfs_quota_us %q: %w", f[0], err)
	}
	if l.CPUQuota < 0 {
		l.CPUQuota = Unlimited
	}
	period, err := readUint(filepath.Join(cpuDir, "cpu.cfs_period_us"))
	if err != nil {
		return l, err
	}
	l.CPUPeriod = int64(period)
	if l.CPUShares, err = readUint(filepath.Join(cpuDir, "cpu.shares")); err != nil {
		return l, err
	}
	mem, err := readUint(filepath.Join(memDir, "memory.limit_in_bytes"))
	if err != nil {
		return l, err
	}
	l.MemoryMax = int64(min(mem, 1<<63-1))
	return l, nil
}

// SharesToWeight is runc's conversion of cgroup v1 cpu.shares [2, 262144] to cgroup v2
// cpu.weight [1, 10000]: what a container asking for shares gets on a v2 host, and what the
// kubelet writes for a pod or QoS cgroup (pkg/kubelet/cm getCPUWeight).
func SharesToWeight(shares uint64) uint64 {
	if shares == 0 {
		return 0
	}
	if shares >= 262144 {
		return 10000
	}
	return 1 + ((shares-2)*9999)/262142
}

// WeightToShares is the least cgroup v1 cpu.shares whose weight (SharesToWeight) is weight:
// what a container's shares read back as on a v2 host, where the cgroup holds only the weight.
func WeightToShares(weight uint64) uint64 {
	if weight == 0 {
		return 0
	}
	return 2 + ((weight-1)*262142+9998)/9999
}

// Shares is the cgroup's CPU weight as cpu.shares: cgroup v1's own value, or on v2 the least
// shares its cpu.weight stands for (WeightToShares).
func (l Limits) Shares() uint64 {
	if l.CPUWeight != 0 {
		return WeightToShares(l.CPUWeight)
	}
	return l.CPUShares
}

// Settings are the CPU and memory settings a container's cgroup holds, in the units a
// container is described with (agent/runtime's Resources): 0 where there is no limit.
type Settings struct {
	CPUShares           uint64
	CPUQuota, CPUPeriod int64
	MemoryLimit         int64
}

// Settings reads what the cgroups of process pid hold: a running container's applied
// resources, read back rather than remembered.
func (h Hierarchy) Settings(pid int) (Settings, error) {
	l, err := h.Limits(pid)
	if err != nil {
		return Settings{}, err
	}
	return l.settings(), nil
}

// SettingsAt reads what the cgroup at path (in the hierarchy, as Dir takes it) holds: a pod
// cgroup's settings, read back.
func (h Hierarchy) SettingsAt(path string) (Settings, error) {
	l, err := h.limitsIn(h.Dir(path, "cpu"), h.Dir(path, "memory"))
	if err != nil {
		return Settings{}, err
	}
	return l.settings(), nil
}

func (l Limits) settings() Settings {
	s := Settings{CPUShares: l.Shares()}
	if l.CPUQuota != Unlimited {
		s.CPUQuota, s.CPUPeriod = l.CPUQuota, l.CPUPeriod
	}
	if l.MemoryMax != Unlimited && l.MemoryMax < unlimitedV1 {
		s.MemoryLimit = l.MemoryMax
	}
	return s
}

// unlimitedV1 is below the least memory.limit_in_bytes cgroup v1 reports for no limit (the
// page counter's maximum rounded down to a page: 9223372036854771712 with 4 KiB pages).
const unlimitedV1 = int64(1) << 62

func readFields(path string, n int) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b))
	if len(f) < n {
		return nil, fmt.Errorf("%s: %q has fewer than %d fields", path, b, n)
	}
	return f, nil
}

func readUint(path string) (uint64, error) {
	f, err := readFields(path, 1)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// parseMax reads a v2 limit: a number, or "max" for none.
func parseMax(s string) (int64, error) {
	if s == "max" {
		return Unlimited, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.Join(fmt.Errorf("cgroup limit %q", s), err)
	}
	return v, nil
}

// Usage is what the cgroups of a process use.
type Usage struct {
	// MemoryWorkingSet is the memory in use less the inactive file cache, in bytes: what
	// kubelet (through cAdvisor) calls the working set, and ranks evictions by.
	MemoryWorkingSet int64
	// MemoryUsage is all the memory charged to the cgroup, page cache included; MemoryRSS its
	// anonymous memory.
	MemoryUsage, MemoryRSS int64
	// PageFaults and MajorPageFaults count the cgroup's page faults since it was made.
	PageFaults, MajorPageFaults int64
	// CPUUsageNanos is the CPU time the cgroup has used since it was made.
	CPUUsageNanos uint64
	// PIDs is the number of tasks in the pids cgroup; 0 when the controller is not there.
	PIDs int64
}

// MemoryUsageAt is the memory charged to the cgroup at path (in the hierarchy, as Dir takes
// it), page cache and memory-backed files included: memory.usage_in_bytes (v1, hierarchical),
// memory.current (v2).
func (h Hierarchy) MemoryUsageAt(path string) (int64, error) {
	file := "memory.usage_in_bytes"
	if h.Mode == Unified {
		file = "memory.current"
	}
	n, err := readUint(filepath.Join(h.Dir(path, "memory"), file))
	return int64(n), err
}

// Usage reads the usage of the cgroups process pid is in. Memory is required; CPU and tasks
// are left at 0 when their controller is not there.
func (h Hierarchy) Usage(pid int) (Usage, error) {
	var u Usage
	memDir, err := h.ProcessDir(pid, "memory")
	if err != nil {
		return u, err
	}
	// memory.stat's keys: v1 gives the hierarchical totals with a "total_" prefix.
	usageFile, prefix, rssKey := "memory.usage_in_bytes", "total_", "rss"
	if h.Mode == Unified {
		usageFile, prefix, rssKey = "memory.current", "", "anon"
	}
	used, err := readUint(filepath.Join(memDir, usageFile))
	if err != nil {
		return u, err
	}
	stat, err := readStat(filepath.Join(memDir, "memory.stat"))
	if err != nil {
		return u, err
	}
	inactive, ok := stat[prefix+"inactive_file"]
	if !ok {
		return u, fmt.Errorf("%s has no %s", filepath.Join(memDir, "memory.stat"), prefix+"inactive_file")
	}
	u.MemoryUsage = int64(used)
	if inactive < used {
		u.MemoryWorkingSet = int64(used - inactive)
	}
	u.MemoryRSS = int64(stat[prefix+rssKey])
	u.PageFaults, u.MajorPageFaults = int64(stat[prefix+"pgfault"]), int64(stat[prefix+"pgmajfault"])
	u.CPUUsageNanos = h.cpuUsage(pid)
	u.PIDs = h.Tasks(pid)
	return u, nil
}

// Tasks is the number of tasks in the pids cgroup process pid is in; 0 when the controller
// is not there or pid is gone.
func (h Hierarchy) Tasks(pid int) int64 {
	pidsDir, err := h.ProcessDir(pid, "pids")
	if err != nil {
		return 0
	}
	n, err := readUint(filepath.Join(pidsDir, "pids.current"))
	if err != nil {
		return 0
	}
	return int64(n)
}

// cpuUsage is the CPU time of pid's cgroup in nanoseconds: cpu.stat's usage_usec on v2,
// cpuacct.usage on v1; 0 when neither can be read.
func (h Hierarchy) cpuUsage(pid int) uint64 {
	if h.Mode == Unified {
		dir, err := h.ProcessDir(pid, "cpu")
		if err != nil {
			return 0
		}
		stat, err := readStat(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			return 0
		}
		return stat["usage_usec"] * 1000
	}
	dir, err := h.ProcessDir(pid, "cpuacct")
	if err != nil {
		return 0
	}
	n, _ := readUint(filepath.Join(dir, "cpuacct.usage"))
	return n
}

// readStat reads a "key value" per line file (memory.stat, cpu.stat).
func readStat(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n // a key this reader does not know the form of is not an error
		}
	}
	return out, nil
}
