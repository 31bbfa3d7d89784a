// Package eviction is holdfast's node-pressure eviction, as kubelet's eviction manager
// (pkg/kubelet/eviction): it observes the node's signals (memory.available, nodefs.*,
// imagefs.*, pid.available), compares them with the configured thresholds (kubelet's
// evictionHard, evictionSoft and evictionSoftGracePeriod), drives the node's MemoryPressure,
// DiskPressure and PIDPressure conditions from the same thresholds (held for
// evictionPressureTransitionPeriod once met), and, while a threshold is met, first reclaims
// node-level resources (dead containers, unused images) for disk signals, then evicts one pod
// per monitoring interval, ranked as kubelet ranks them. An evicted pod is killed and ends
// Failed with reason Evicted and kubelet's message. Static and critical pods are never
// evicted. Its Admit refuses new pods under pressure as kubelet's eviction admit handler does.
//
// The thresholds are the one source of truth for pressure: the node controller reports the
// conditions Manager.Conditions computes, and allocatable subtracts HardReservation.
//
// Where holdfast measures differently from kubelet (which reads cAdvisor):
//   - memory.available is the kernel's MemAvailable, not capacity minus the root cgroup's
//     working set;
//   - a pod's memory is the working set (usage minus inactive file pages) of its containers'
//     cgroups; its disk usage is its disk emptyDir volumes and its logs (its containers'
//     writable layers live in containerd's snapshotter and are not counted); its inodes the
//     files of the same; its processes the pids of its containers' cgroups;
//   - there is no minimum reclaim (evictionMinimumReclaim).
package eviction
