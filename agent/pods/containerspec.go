package pods

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

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

// resourceSpecOpts applies res to a containerd container's spec.
func resourceSpecOpts(res runtime.Resources) []runtime.SpecOpt {
	opts := []runtime.SpecOpt{oci.WithCPUShares(res.CPUShares)}
	if res.CPUQuota > 0 {
		opts = append(opts, oci.WithCPUCFS(res.CPUQuota, uint64(res.CPUPeriod)))
	}
	if res.MemoryLimit > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(res.MemoryLimit)))
	}
	if res.NoSwap {
		opts = append(opts, withNoSwap)
	}
	return append(opts, withOOMScoreAdj(res.OOMScoreAdj))
}

// withNoSwap is kubelet's swap behavior NoSwap on cgroup v2: memory.swap.max is 0, so the
// container never swaps even where the host has swap. Only on hosts with the swap controller
// (see cgroups.Hierarchy.SwapController): elsewhere runc could not write the file.
func withNoSwap(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	if s.Linux.Resources.Unified == nil {
		s.Linux.Resources.Unified = map[string]string{}
	}
	s.Linux.Resources.Unified["memory.swap.max"] = "0"
	return nil
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

// withOOMScoreAdj sets the score, never below the agent's own: lowering it needs
// CAP_SYS_RESOURCE, which some sandboxes (and some gateway setups) do not grant, and runc
// then fails the start with an unhelpful error.
func withOOMScoreAdj(adj int) runtime.SpecOpt {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if own, ok := runtime.AgentOOMScoreAdj(); ok {
			adj = runtime.ClampOOMScoreAdj(adj, own)
		}
		s.Process.OOMScoreAdj = &adj
		return nil
	}
}

// verifyNonRoot refuses a container that would run as root, after the image's user and the
// securityContext were applied, with kubelet's message.
func verifyNonRoot(pod *v1.Pod, c *v1.Container) runtime.SpecOpt {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process != nil && s.Process.User.UID == 0 {
			return &errConfig{msg: fmt.Sprintf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)",
				pod.Name+"_"+pod.Namespace+"("+string(pod.UID)+")", c.Name)}
		}
		return nil
	}
}
