package eviction

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/holdfast-dev/holdfast/internal/procfs"
	"golang.org/x/sys/unix"
)

// Observation is one signal's value: what is available of what capacity (bytes, inodes or
// PIDs). Capacity 0: not observed.
type Observation struct {
	Available, Capacity int64
}

// Observations are the signals observed at one instant.
type Observations map[Signal]Observation

// Observer measures the node's signals.
type Observer interface {
	Observe(ctx context.Context) (Observations, error)
}

// HostObserver measures this host: memory from /proc/meminfo, nodefs and imagefs with statfs,
// PIDs from sysinfo against pid_max and threads-max.
type HostObserver struct {
	// NodeFS is a path on the node file system (the agent's state directory, where pod
	// volumes live).
	NodeFS string
	// ImageFS returns a path on the image file system (containerd's snapshotter); nil or an
	// error: imagefs signals are not observed.
	ImageFS func(ctx context.Context) (string, error)
	// Proc is the proc file system; defaults to /proc.
	Proc string
}

// Observe implements Observer. A signal that cannot be measured is left out (its thresholds
// are then not met); only a node file system or memory that cannot be read is an error.
func (h HostObserver) Observe(ctx context.Context) (Observations, error) {
	proc := h.Proc
	if proc == "" {
		proc = "/proc"
	}
	obs := Observations{}
	mem, err := procfs.ReadMeminfo(proc + "/meminfo")
	if err != nil {
		return nil, err
	}
	obs[SignalMemoryAvailable] = Observation{Available: mem["MemAvailable"], Capacity: mem["MemTotal"]}
	if err := statFS(obs, h.NodeFS, SignalNodeFsAvailable, SignalNodeFsInodesFree); err != nil {
		return nil, err
	}
	if h.ImageFS != nil {
		if path, err := h.ImageFS(ctx); err == nil {
			_ = statFS(obs, path, SignalImageFsAvailable, SignalImageFsInodesFree)
		}
	}
	if o, ok := observePIDs(proc); ok {
		obs[SignalPIDAvailable] = o
	}
	return obs, nil
}

func statFS(obs Observations, path string, bytesSignal, inodesSignal Signal) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	obs[bytesSignal] = Observation{Available: int64(st.Bavail) * bs, Capacity: int64(st.Blocks) * bs}
	if st.Files > 0 { // file systems without an inode count (btrfs) report 0
		obs[inodesSignal] = Observation{Available: int64(st.Ffree), Capacity: int64(st.Files)}
	}
	return nil
}

// PIDLimit is the node's PID capacity, as the kubelet's pidlimit reads it: the lower of
// pid_max and threads-max under proc (/proc); 0 when neither can be read.
func PIDLimit(proc string) int64 {
	limit := readInt(proc + "/sys/kernel/pid_max")
	if tm := readInt(proc + "/sys/kernel/threads-max"); tm > 0 && (limit <= 0 || tm < limit) {
		limit = tm
	}
	return limit
}

// observePIDs is kubelet's pid.available: the node's PID limit (the lower of pid_max and
// threads-max) less the tasks that exist.
func observePIDs(proc string) (Observation, bool) {
	limit := PIDLimit(proc)
	var si unix.Sysinfo_t
	if limit <= 0 || unix.Sysinfo(&si) != nil {
		return Observation{}, false
	}
	return Observation{Available: limit - int64(si.Procs), Capacity: limit}, true
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}
