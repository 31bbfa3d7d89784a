package podcgroups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// Config is the node's cgroup configuration, in the kubelet's KubeletConfiguration terms.
type Config struct {
	Hierarchy cgroups.Hierarchy
	// Driver makes the cgroups (the kubelet's cgroupDriver): nil is the cgroupfs driver on
	// Hierarchy; a *Systemd makes them transient slices, named as the kubelet names them.
	Driver Driver
	// Root is the kubelet's cgroupRoot: kubepods is made below it. Defaults to "/".
	Root string
	// EnforceCPULimits is the kubelet's cpuCFSQuota: a pod's CPU limits become a CFS quota.
	EnforceCPULimits bool
	// CPUPeriod is the CFS period in microseconds; defaults to 100ms.
	CPUPeriod uint64
	// PodPidsLimit is the most tasks one pod may run (podPidsLimit); 0 or -1: none.
	PodPidsLimit int64
	// Kubepods is what kubepods is capped at: the node allocatable when enforceNodeAllocatable
	// names "pods", the capacity otherwise (as the kubelet sets it either way).
	Kubepods v1.ResourceList
	Log      *slog.Logger
}

// Manager makes and removes the pod and QoS cgroups. Its methods are safe to call from
// every pod worker at once.
type Manager struct {
	cfg    Config
	h      Driver
	layout Layout

	mu sync.Mutex // serializes writes to the QoS levels; protects pods
	// pods are the pods with a cgroup made by this agent since it started, for the burstable
	// level's shares (the kubelet's active pods).
	pods map[types.UID]*v1.Pod
}

// NewManager returns a Manager; Start makes the top of the hierarchy.
func NewManager(cfg Config) *Manager {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.CPUPeriod == 0 {
		cfg.CPUPeriod = QuotaPeriod
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Driver == nil {
		cfg.Driver = cfg.Hierarchy
	}
	_, systemd := cfg.Driver.(*Systemd)
	return &Manager{cfg: cfg, h: cfg.Driver, layout: Layout{Root: cfg.Root, Systemd: systemd}, pods: map[types.UID]*v1.Pod{}}
}

// Start makes kubepods with its node allocatable limits and the two QoS levels below it, or
// brings existing ones back to what they should be (an agent restart, a changed config): the
// kubelet's createNodeAllocatableCgroups, enforceNodeAllocatableCgroups and QoS manager Start.
// A memory limit below what kubepods already uses fails here, and says so.
func (m *Manager) Start() error {
	top := m.layout.Kubepods()
	if err := m.h.Ensure(top, NodeAllocatableResources(m.cfg.Kubepods)); err != nil {
		return fmt.Errorf("enforce node allocatable on %s: %w", top, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.updateQOSLocked()
}

// updateQOSLocked writes the QoS levels' settings for the pods known; m.mu held.
func (m *Manager) updateQOSLocked() error {
	pods := make([]*v1.Pod, 0, len(m.pods))
	for _, p := range m.pods {
		pods = append(pods, p)
	}
	burstable, besteffort := QOSResources(pods)
	return errors.Join(
		m.h.Ensure(m.layout.QOSDir(v1.PodQOSBurstable), burstable),
		m.h.Ensure(m.layout.QOSDir(v1.PodQOSBestEffort), besteffort),
	)
}

// PodDir is the pod's cgroup, the parent of its containers': the backend-neutral cgroup
// parent the runtime is given (runtime.ContainerConfig.CgroupParent).
func (m *Manager) PodDir(pod *v1.Pod) string { return m.layout.PodDir(pod) }

// Close releases what the driver holds (the systemd driver's D-Bus connection); the
// cgroups stay. The agent closes it when it stops.
func (m *Manager) Close() {
	if c, ok := m.h.(interface{ Close() }); ok {
		c.Close()
	}
}

// Layout is how the manager names the cgroups.
func (m *Manager) Layout() Layout { return m.layout }

// EnsurePod makes the pod's cgroup with its limits before its first container, after
// counting the pod in its QoS level (the kubelet updates the QoS cgroups before it makes a
// pod's); a cgroup already there is left as it is (the kubelet's EnsureExists). It returns the
// cgroup's path.
func (m *Manager) EnsurePod(pod *v1.Pod) (string, error) {
	dir := m.PodDir(pod)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, known := m.pods[pod.UID]; !known {
		m.pods[pod.UID] = pod
		if err := m.updateQOSLocked(); err != nil {
			return "", fmt.Errorf("update QoS cgroups for pod %s: %w", pod.UID, err)
		}
	}
	if m.h.Exists(dir) {
		return dir, nil
	}
	if err := m.h.Ensure(dir, m.podResources(pod)); err != nil {
		return "", fmt.Errorf("make pod cgroup: %w", err)
	}
	return dir, nil
}

// UpdatePod writes pod's limits, as its resources now say, into its existing cgroup: what an
// in-place resize applies at the pod level before (larger) or after (smaller) its containers.
func (m *Manager) UpdatePod(pod *v1.Pod) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir := m.PodDir(pod)
	if err := m.h.Update(dir, m.podResources(pod)); err != nil {
		return fmt.Errorf("update pod cgroup: %w", err)
	}
	if _, known := m.pods[pod.UID]; known {
		m.pods[pod.UID] = pod
		return m.updateQOSLocked()
	}
	return nil
}

// CoverPod sets pod's cgroup to hold its containers both as they run and as pod, allocated,
// will have them (Covering): before they are resized, after which UpdatePod sets it exactly.
func (m *Manager) CoverPod(pod *v1.Pod) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir := m.PodDir(pod)
	got, err := m.h.SettingsAt(dir)
	if err != nil {
		return fmt.Errorf("read pod cgroup: %w", err)
	}
	if err := m.h.Update(dir, Covering(m.podResources(pod), got)); err != nil {
		return fmt.Errorf("update pod cgroup: %w", err)
	}
	return nil
}

// ReadPod reads back what pod's cgroup holds (for its status, and to tell whether a
// pod-level resize is applied).
func (m *Manager) ReadPod(pod *v1.Pod) (cgroups.Settings, error) {
	s, err := m.h.SettingsAt(m.PodDir(pod))
	if err != nil {
		return s, fmt.Errorf("read pod cgroup: %w", err)
	}
	return s, nil
}

// PodHolds reports whether a pod cgroup read back as got (ReadPod) holds the limits pod, as
// allocated, gives it (ResourceConfigForPod): false while a resize of the pod is not applied.
func (m *Manager) PodHolds(pod *v1.Pod, got cgroups.Settings) bool {
	return Holds(m.applied(m.podResources(pod)), got)
}

// PodMemory is the pod cgroup's memory limit as pod, allocated, sets it (ResourceConfigForPod)
// and as the cgroup holds it now (0 for none), and the memory charged to it: what the pod uses
// as a whole, as the kubelet reads it (cAdvisor's pod cgroup), its running containers' and
// what they leave there (an init container's memory-backed emptyDir, page cache) alike.
func (m *Manager) PodMemory(pod *v1.Pod) (desired, current, used int64, err error) {
	if r := m.applied(m.podResources(pod)); r.Memory != nil && *r.Memory > 0 {
		desired = *r.Memory
	}
	got, err := m.ReadPod(pod)
	if err != nil {
		return desired, 0, 0, err
	}
	used, err = m.h.MemoryUsageAt(m.PodDir(pod))
	if err != nil {
		return desired, got.MemoryLimit, 0, fmt.Errorf("read pod cgroup's memory usage: %w", err)
	}
	return desired, got.MemoryLimit, used, nil
}

func (m *Manager) podResources(pod *v1.Pod) cgroups.Resources {
	return ResourceConfigForPod(pod, m.cfg.EnforceCPULimits, m.cfg.CPUPeriod, m.cfg.PodPidsLimit)
}

// applied is r as the driver leaves it in the cgroup: the systemd driver rounds a CPU quota
// to systemd's steps (Systemd.Applied).
func (m *Manager) applied(r cgroups.Resources) cgroups.Resources {
	if a, ok := m.h.(interface {
		Applied(cgroups.Resources) cgroups.Resources
	}); ok {
		return a.Applied(r)
	}
	return r
}

// RemovePod removes the pod's cgroup once its containers are gone (the runtime removes each
// container's own) and takes it out of its QoS level's count. A cgroup that still holds a
// process is left and the error says so; nothing is killed.
func (m *Manager) RemovePod(uid types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.removeLocked(uid)
}

func (m *Manager) removeLocked(uid types.UID) error {
	var errs []error
	for _, qos := range []v1.PodQOSClass{v1.PodQOSGuaranteed, v1.PodQOSBurstable, v1.PodQOSBestEffort} {
		errs = append(errs, m.h.Remove(m.layout.podDir(qos, uid)))
	}
	if _, known := m.pods[uid]; known {
		delete(m.pods, uid)
		errs = append(errs, m.updateQOSLocked())
	}
	return errors.Join(errs...)
}

// CleanupPeriod is how often Run looks for orphaned pod cgroups (the kubelet's housekeeping
// runs every 2s; a pod cgroup left behind only costs a directory).
const CleanupPeriod = 30 * time.Second

// Run calls Cleanup every period until ctx ends: a pod cgroup whose removal failed when its
// pod ended (a process still exiting) goes at a later round.
func (m *Manager) Run(ctx context.Context, period time.Duration, active func(types.UID) bool) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if removed := m.Cleanup(active); len(removed) > 0 {
				m.cfg.Log.Info("removed orphaned pod cgroups", "pods", removed)
			}
		}
	}
}

// Cleanup removes the cgroups of pods that are not active (the kubelet's cleanup of orphaned
// pod cgroups, after an agent restart or a removal cut short): active says whether a pod UID
// still has a worker or a container. A cgroup that holds a process stays (RemovePod never
// kills); its error is logged and the next Cleanup tries again. It returns the UIDs removed.
func (m *Manager) Cleanup(active func(types.UID) bool) []types.UID {
	var removed []types.UID
	for _, qos := range []v1.PodQOSClass{v1.PodQOSGuaranteed, v1.PodQOSBurstable, v1.PodQOSBestEffort} {
		names, err := m.h.Children(m.layout.QOSDir(qos))
		if err != nil {
			continue
		}
		for _, name := range names {
			uid, ok := m.layout.PodUID(name)
			if !ok {
				continue // burstable, besteffort
			}
			m.mu.Lock()
			// Under the lock, with EnsurePod's record: a pod whose cgroup is being made now is
			// never taken for an orphan.
			_, ensured := m.pods[types.UID(uid)]
			if ensured || active(types.UID(uid)) {
				m.mu.Unlock()
				continue
			}
			err := m.removeLocked(types.UID(uid))
			m.mu.Unlock()
			if err != nil {
				m.cfg.Log.Warn("orphaned pod cgroup still in use; kept", "uid", uid, "err", err)
				continue
			}
			removed = append(removed, types.UID(uid))
		}
	}
	return removed
}
