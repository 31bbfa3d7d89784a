package pods

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// containerResources turns requests and limits into cgroup settings and the process's OOM
// score from the pod's QoS class, as kubelet does. Every backend applies the same numbers.
func containerResources(pod *v1.Pod, c *v1.Container, memoryCapacity int64, noSwap bool) runtime.Resources {
	req, lim := c.Resources.Requests, c.Resources.Limits
	res := runtime.Resources{CPUShares: podcgroups.MinShares, NoSwap: noSwap, OOMScoreAdj: oomScoreAdj(pod, c, memoryCapacity)}
	if q, ok := req[v1.ResourceCPU]; ok {
		res.CPUShares = podcgroups.MilliCPUToShares(q.MilliValue())
	} else if q, ok := lim[v1.ResourceCPU]; ok {
		res.CPUShares = podcgroups.MilliCPUToShares(q.MilliValue()) // request defaults to limit
	}
	if q, ok := lim[v1.ResourceCPU]; ok && q.MilliValue() > 0 {
		res.CPUQuota, res.CPUPeriod = podcgroups.MilliCPUToQuota(q.MilliValue(), podcgroups.QuotaPeriod), podcgroups.QuotaPeriod
	}
	if q, ok := lim[v1.ResourceMemory]; ok && q.Value() > 0 {
		res.MemoryLimit = q.Value()
	}
	return res
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
