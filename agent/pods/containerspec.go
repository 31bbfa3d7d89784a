package pods

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// Kubelet's cgroup arithmetic: shares from cpu requests, CFS quota from cpu limits.
const (
	minShares     = 2
	sharesPerCPU  = 1024
	milliCPUToCPU = 1000
	quotaPeriod   = 100000 // 100ms in microseconds
	minQuota      = 1000
)

// containerResources turns requests and limits into cgroup settings and the process's OOM
// score from the pod's QoS class, as kubelet does. Every backend applies the same numbers.
func containerResources(pod *v1.Pod, c *v1.Container, memoryCapacity int64, noSwap bool) runtime.Resources {
	req, lim := c.Resources.Requests, c.Resources.Limits
	res := runtime.Resources{CPUShares: minShares, NoSwap: noSwap, OOMScoreAdj: oomScoreAdj(pod, c, memoryCapacity)}
	if q, ok := req[v1.ResourceCPU]; ok {
		res.CPUShares = max(uint64(q.MilliValue())*sharesPerCPU/milliCPUToCPU, minShares)
	} else if q, ok := lim[v1.ResourceCPU]; ok {
		res.CPUShares = max(uint64(q.MilliValue())*sharesPerCPU/milliCPUToCPU, minShares) // request defaults to limit
	}
	if q, ok := lim[v1.ResourceCPU]; ok {
		res.CPUQuota, res.CPUPeriod = max(q.MilliValue()*quotaPeriod/milliCPUToCPU, minQuota), quotaPeriod
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
