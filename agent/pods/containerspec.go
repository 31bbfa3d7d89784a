package pods

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// containerResources turns requests and limits into cgroup settings and the process's OOM
// score from the pod's QoS class, as kubelet does. Every backend applies the same numbers.
func containerResources(pod *v1.Pod, c *v1.Container, memoryCapacity int64, noSwap bool) runtime.Resources {
	cpuLimit, memoryLimit := containerLimits(pod, c)
	res := runtime.Resources{CPUShares: podcgroups.MinShares, NoSwap: noSwap, OOMScoreAdj: oomScoreAdj(pod, c, memoryCapacity)}
	if q, ok := c.Resources.Requests[v1.ResourceCPU]; ok {
		res.CPUShares = podcgroups.MilliCPUToShares(q.MilliValue())
	} else {
		res.CPUShares = podcgroups.MilliCPUToShares(cpuLimit) // request defaults to limit
	}
	if cpuLimit > 0 {
		res.CPUQuota, res.CPUPeriod = podcgroups.MilliCPUToQuota(cpuLimit, podcgroups.QuotaPeriod), podcgroups.QuotaPeriod
	}
	if memoryLimit > 0 {
		res.MemoryLimit = memoryLimit
	}
	return res
}

// containerLimits are the CPU (millicores) and memory (bytes) limits c runs with, 0 for none:
// its own, or where it has none and its pod sets pod-level resources, the pod's (the kubelet's
// getCPULimit and getMemoryLimit), so that what reads a container's limits (the runtime, the
// resize's read-back) sees the bound the pod cgroup puts on it.
func containerLimits(pod *v1.Pod, c *v1.Container) (milliCPU, memory int64) {
	cpu, mem := c.Resources.Limits.Cpu(), c.Resources.Limits.Memory()
	if resourcehelper.IsPodLevelResourcesSet(pod) {
		if cpu.IsZero() {
			cpu = pod.Spec.Resources.Limits.Cpu()
		}
		if mem.IsZero() {
			mem = pod.Spec.Resources.Limits.Memory()
		}
	}
	return cpu.MilliValue(), mem.Value()
}

// oomScoreAdj is kubelet's policy: Guaranteed -997, BestEffort 1000, Burstable in between by
// the share of the node's memory the container requests.
func oomScoreAdj(pod *v1.Pod, c *v1.Container, memoryCapacity int64) int {
	switch podutil.PodQOS(pod) {
	case v1.PodQOSGuaranteed:
		return -997
	case v1.PodQOSBestEffort:
		return 1000
	}
	if memoryCapacity <= 0 {
		return 999
	}
	req := c.Resources.Requests.Memory().Value()
	adj := 1000 - (1000*req)/memoryCapacity
	return int(min(max(adj, 2), 999))
}

func resourceMilli(m int64) *resource.Quantity {
	return resource.NewMilliQuantity(m, resource.DecimalSI)
}
func resourceBytes(b int64) *resource.Quantity { return resource.NewQuantity(b, resource.BinarySI) }
