package eviction

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// ContainerLister lists a pod's containers; *runtime.Runtime implements it.
type ContainerLister interface {
	ListPod(ctx context.Context, podUID string) ([]runtime.Container, error)
}

// ContainerUsage measures a running container's CPU, memory and tasks: CgroupUsage reads its
// cgroups through its pid (the containerd backend); the CRI backend asks the runtime
// (ContainerStats), which knows them whatever its isolation.
type ContainerUsage interface {
	Usage(ctx context.Context, c runtime.Container) (cgroups.Usage, error)
}

// CgroupUsage reads a container's usage from the cgroups its main process is in.
type CgroupUsage struct{ Cgroups cgroups.Hierarchy }

// errNoPid: the runtime gave no pid for a running container (it was listed as it exited).
var errNoPid = errors.New("container has no pid")

// Usage implements ContainerUsage.
func (u CgroupUsage) Usage(_ context.Context, c runtime.Container) (cgroups.Usage, error) {
	if c.Pid == 0 {
		return cgroups.Usage{}, errNoPid
	}
	return u.Cgroups.Usage(int(c.Pid))
}

// HostStats measures pods on this host: memory and tasks from their running containers'
// usage, disk from the pod's directory (volumes) and its log directory, counting only what
// lies on the node file system.
type HostStats struct {
	Runtime ContainerLister
	Usage   ContainerUsage
	// PodsDir holds one directory per pod UID (the agent's <stateDir>/pods).
	PodsDir string
	// PodLogDir holds NAMESPACE_NAME_UID per pod; empty: logs are not counted.
	PodLogDir string
}

// Stats implements StatsProvider. Only what the signal needs is measured: walking a pod's
// volumes is for disk signals only.
func (h HostStats) Stats(ctx context.Context, pods []*v1.Pod, signal Signal) StatsFunc {
	out := map[types.UID]PodStats{}
	for _, pod := range pods {
		var s PodStats
		var ok bool
		if signal.Disk() {
			s, ok = h.diskStats(pod)
		} else {
			s, ok = h.usageStats(ctx, pod)
		}
		if ok {
			out[pod.UID] = s
		}
	}
	return func(pod *v1.Pod) (PodStats, bool) {
		s, ok := out[pod.UID]
		return s, ok
	}
}

func (h HostStats) usageStats(ctx context.Context, pod *v1.Pod) (PodStats, bool) {
	cs, err := h.Runtime.ListPod(ctx, string(pod.UID))
	if err != nil {
		return PodStats{}, false
	}
	s := PodStats{Containers: map[string]int64{}}
	for _, c := range cs {
		if c.State != runtime.StateRunning {
			continue
		}
		u, err := h.Usage.Usage(ctx, c)
		if err != nil {
			continue // exited in between
		}
		s.Memory += u.MemoryWorkingSet
		s.PIDs += u.PIDs
		s.Containers[c.Name] += u.MemoryWorkingSet
	}
	return s, true
}

func (h HostStats) diskStats(pod *v1.Pod) (PodStats, bool) {
	var s PodStats
	dev, ok := device(h.PodsDir)
	if !ok { // no pod has a directory yet: the node file system is its parent's
		if dev, ok = device(filepath.Dir(h.PodsDir)); !ok {
			return s, false
		}
	}
	dirs := []string{filepath.Join(h.PodsDir, string(pod.UID))}
	if h.PodLogDir != "" {
		dirs = append(dirs, filepath.Join(h.PodLogDir, logs.PodDirName(pod.Namespace, pod.Name, string(pod.UID))))
	}
	for _, dir := range dirs {
		bytes, inodes := du(dir, dev)
		s.Disk += bytes
		s.Inodes += inodes
	}
	return s, true
}

// du is the space (allocated blocks) and inodes used under dir on device dev: mounts of other
// file systems below it (tmpfs volumes) are not counted. Symbolic links are not followed.
func du(dir string, dev uint64) (bytes, inodes int64) {
	_ = fsutil.WalkDirNoAtime(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile, or unreadable: count what can be
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if uint64(st.Dev) != dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		bytes += st.Blocks * 512
		inodes++
		return nil
	})
	return bytes, inodes
}

func device(path string) (uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, false
	}
	return uint64(st.Dev), true
}
