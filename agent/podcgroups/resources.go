package podcgroups

import (
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// The kubelet's cgroup arithmetic (pkg/kubelet/cm helpers_linux.go), shared by the pod and
// QoS cgroups here and by each container's own (agent/pods containerResources).
const (
	MinShares     = 2
	MaxShares     = 262144
	SharesPerCPU  = 1024
	MilliCPUToCPU = 1000
	// QuotaPeriod is the CFS period, 100ms in microseconds; MinQuota the kernel's least quota.
	QuotaPeriod = 100000
	MinQuota    = 1000
)

// MilliCPUToShares is the kubelet's cpu.shares of a CPU request in millicores: 2 for none,
// clamped to the kernel's [2, 262144].
func MilliCPUToShares(milliCPU int64) uint64 {
	if milliCPU == 0 {
		return MinShares
	}
	shares := (milliCPU * SharesPerCPU) / MilliCPUToCPU
	return uint64(min(max(shares, MinShares), MaxShares))
}

// SharesToMilliCPU is the kubelet's SharesToMilliCPU: the CPU request in millicores of
// cpu.shares read back, rounded up (the least request with these shares); 0 below MinShares.
func SharesToMilliCPU(shares uint64) int64 {
	if shares < MinShares {
		return 0
	}
	return int64((shares*MilliCPUToCPU + SharesPerCPU - 1) / SharesPerCPU)
}

// MilliCPUToQuota is the kubelet's CFS quota of a CPU limit in millicores over period
// microseconds: 0 for none, at least 1ms.
func MilliCPUToQuota(milliCPU, period int64) int64 {
	if milliCPU == 0 {
		return 0
	}
	return max((milliCPU*period)/MilliCPUToCPU, MinQuota)
}

// SharesMatch reports whether shares read back from a cgroup (got) are want: equal, or read
// back from a cgroup v2 weight as the least shares of that weight (cgroups.WeightToShares).
func SharesMatch(want, got uint64) bool {
	return want == got || got == cgroups.WeightToShares(cgroups.SharesToWeight(want))
}

// QuotaMatch reports whether a CFS quota read back from a cgroup (got) is want over period:
// equal, or want as systemd keeps it, rounded up to a whole percent of a CPU (runc's systemd
// cgroup manager writes that rounding for a container's scope, the systemd driver for a pod's
// slice), so that a 15m limit read back as 20m's quota is not taken for a resize not applied.
func QuotaMatch(want, got, period int64) bool {
	if want == got {
		return true
	}
	return want > 0 && period > 0 && got == systemdQuota(want, uint64(period))
}

// systemdQuota is quota over period as systemd keeps it (systemdResources' rounding).
func systemdQuota(quota int64, period uint64) int64 {
	_, applied := systemdResources(cgroups.Resources{CPUQuota: &quota, CPUPeriod: &period}, true, 0)
	return *applied.CPUQuota
}

// pageSize is what the kernel rounds a cgroup v1 memory limit down to.
var pageSize = int64(os.Getpagesize())

// MemoryMatches reports whether a memory limit read back from a cgroup (got) is want: as
// written, or rounded down to a page, as the kernel keeps it (cgroup v1 and v2 alike). A limit
// users write in decimal units ("100M") is no whole number of pages: compared byte for byte,
// it would never be held, and a container whose resizePolicy restarts it for memory would be
// restarted at every sync.
func MemoryMatches(want, got int64) bool {
	// A limit read back as 0 is none, never a limit below a page rounded down.
	return got == want || want > 0 && got > 0 && got == want/pageSize*pageSize
}

// Holds reports whether a cgroup read back as got holds what want sets: the shares, the CFS
// quota (none for a quota of -1 or 0) and period, and the memory limit (as written, or rounded
// down to a page, as cgroup v1 keeps it). What want leaves unset is not judged.
func Holds(want cgroups.Resources, got cgroups.Settings) bool {
	if want.CPUShares != nil && !SharesMatch(*want.CPUShares, got.CPUShares) {
		return false
	}
	if q := want.CPUQuota; q != nil {
		switch {
		case *q <= 0:
			if got.CPUQuota != 0 {
				return false
			}
		case !QuotaMatch(*q, got.CPUQuota, got.CPUPeriod) || want.CPUPeriod != nil && got.CPUPeriod != int64(*want.CPUPeriod):
			return false
		}
	}
	if m := want.Memory; m != nil && !MemoryMatches(*m, got.MemoryLimit) {
		return false
	}
	return true
}

// Kubepods is the name of the cgroup all pods are under, below the cgroup root.
const Kubepods = "kubepods"

// QOSDir is the path of a QoS class's cgroup below root (the configured cgroupRoot) on the
// cgroupfs driver: Guaranteed pods sit in kubepods itself, the other two classes in a level
// of their own (Layout.QOSDir names them for either driver).
func QOSDir(root string, qos v1.PodQOSClass) string { return Layout{Root: root}.QOSDir(qos) }

// PodDir is the path of a pod's cgroup below root on the cgroupfs driver: its QoS class's
// directory, then pod<uid> (the kubelet's GetPodCgroupNameSuffix).
func PodDir(root string, pod *v1.Pod) string { return Layout{Root: root}.PodDir(pod) }

func podDirName(uid types.UID) string { return "pod" + string(uid) }

// podResourcesOptions: pod-level resources count where the pod sets them, as the kubelet does
// with PodLevelResources on (beta, on by default in 1.37).
var podResourcesOptions = resourcehelper.PodResourcesOptions{}

// ResourceConfigForPod is the kubelet's ResourceConfigForPod (pkg/kubelet/cm
// helpers_linux.go) without huge pages and memory QoS: the pod cgroup's CPU shares from the
// pod's requests; its CFS quota from its limits where every container has a CPU limit (-1
// when enforceCPULimits, the kubelet's cpuCFSQuota, is off); its memory limit where every
// container has one; a BestEffort pod only 2 shares. pidsLimit (podPidsLimit) is set when
// positive.
func ResourceConfigForPod(pod *v1.Pod, enforceCPULimits bool, cpuPeriod uint64, pidsLimit int64) cgroups.Resources {
	reqs := resourcehelper.PodRequests(pod, podResourcesOptions)
	limits := resourcehelper.PodLimits(pod, podResourcesOptions)
	cpuLimitsDeclared, memoryLimitsDeclared := true, true
	for _, containers := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range containers {
			if containers[i].Resources.Limits.Cpu().IsZero() {
				cpuLimitsDeclared = false
			}
			if containers[i].Resources.Limits.Memory().IsZero() {
				memoryLimitsDeclared = false
			}
		}
	}
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		if !pod.Spec.Resources.Limits.Cpu().IsZero() {
			cpuLimitsDeclared = true
		}
		if !pod.Spec.Resources.Limits.Memory().IsZero() {
			memoryLimitsDeclared = true
		}
	}
	var cpuRequests, cpuLimits, memoryLimits int64
	if q, ok := reqs[v1.ResourceCPU]; ok {
		cpuRequests = q.MilliValue()
	}
	if q, ok := limits[v1.ResourceCPU]; ok {
		cpuLimits = q.MilliValue()
	}
	if q, ok := limits[v1.ResourceMemory]; ok {
		memoryLimits = q.Value()
	}
	shares := MilliCPUToShares(cpuRequests)
	quota := MilliCPUToQuota(cpuLimits, int64(cpuPeriod))
	if !enforceCPULimits {
		quota = -1
	}
	var out cgroups.Resources
	switch podutil.ComputePodQOS(pod) {
	case v1.PodQOSGuaranteed:
		out = cgroups.Resources{CPUShares: &shares, CPUQuota: &quota, CPUPeriod: &cpuPeriod, Memory: &memoryLimits}
	case v1.PodQOSBurstable:
		out.CPUShares = &shares
		if cpuLimitsDeclared {
			out.CPUQuota, out.CPUPeriod = &quota, &cpuPeriod
		}
		if memoryLimitsDeclared {
			out.Memory = &memoryLimits
		}
	default:
		minShares := uint64(MinShares)
		out.CPUShares = &minShares
	}
	if pidsLimit > 0 {
		out.PidsLimit = &pidsLimit
	}
	return out
}

// QOSResources are the QoS levels' settings for the pods on the node, as the kubelet's QoS
// manager sets them (qos_container_manager_linux.go setCPUCgroupConfig): besteffort always
// 2 shares, burstable the shares of the burstable pods' CPU requests added up.
func QOSResources(pods []*v1.Pod) (burstable, besteffort cgroups.Resources) {
	var milliCPU int64
	for _, pod := range pods {
		if podutil.ComputePodQOS(pod) != v1.PodQOSBurstable {
			continue
		}
		if q, ok := resourcehelper.PodRequests(pod, podResourcesOptions)[v1.ResourceCPU]; ok {
			milliCPU += q.MilliValue()
		}
	}
	b, be := MilliCPUToShares(milliCPU), uint64(MinShares)
	return cgroups.Resources{CPUShares: &b}, cgroups.Resources{CPUShares: &be}
}

// NodeAllocatableResources are kubepods' settings for the node allocatable it is given
// (pkg/kubelet/cm node_container_manager_linux.go getCgroupConfig): memory, the shares of
// its CPUs, and its pids ("pid") where it names them.
func NodeAllocatableResources(allocatable v1.ResourceList) cgroups.Resources {
	var out cgroups.Resources
	if q, ok := allocatable[v1.ResourceMemory]; ok {
		v := q.Value()
		out.Memory = &v
	}
	if q, ok := allocatable[v1.ResourceCPU]; ok {
		v := MilliCPUToShares(q.MilliValue())
		out.CPUShares = &v
	}
	if q, ok := allocatable["pid"]; ok {
		v := q.Value()
		out.PidsLimit = &v
	}
	return out
}

// Covering is what a pod cgroup holding got is set to before its containers are resized to
// want's: per resource the larger of the two (none where either has none), so that it holds
// its containers both as they are and as they will be. The kubelet orders each resource on
// its own (the pod cgroup raised before its containers, lowered after them); one order for
// CPU and memory both, a resize raising one and lowering the other had a container's CFS
// quota above its pod's, which cgroup v1 refuses, or the pod's memory limit below its
// containers'. The pod cgroup is set to want exactly once its containers are. The quota is
// compared as a share of its period; the pids limit is want's (a resize does not change it).
func Covering(want cgroups.Resources, got cgroups.Settings) cgroups.Resources {
	out := want
	if want.CPUShares != nil {
		out.CPUShares = ptr.To(max(*want.CPUShares, got.CPUShares))
	}
	if want.CPUQuota != nil {
		switch q := *want.CPUQuota; {
		case q <= 0 || got.CPUQuota <= 0:
			out.CPUQuota = ptr.To(int64(-1))
		default:
			period := int64(QuotaPeriod)
			if want.CPUPeriod != nil && *want.CPUPeriod > 0 {
				period = int64(*want.CPUPeriod)
			}
			held := got.CPUQuota
			if got.CPUPeriod > 0 && got.CPUPeriod != period {
				// Rounded up: the covering quota must not fall short of what is held.
				held = (got.CPUQuota*period + got.CPUPeriod - 1) / got.CPUPeriod
			}
			out.CPUQuota = ptr.To(max(q, held))
		}
	}
	if want.Memory != nil {
		switch m := *want.Memory; {
		case m <= 0 || got.MemoryLimit <= 0:
			out.Memory = ptr.To(int64(-1))
		default:
			out.Memory = ptr.To(max(m, got.MemoryLimit))
		}
	}
	return out
}
