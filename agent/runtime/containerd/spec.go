package containerd

import (
	"context"
	"fmt"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// resourceSpecOpts applies res to a containerd container's spec.
func resourceSpecOpts(res runtime.Resources) []oci.SpecOpts {
	opts := []oci.SpecOpts{oci.WithCPUShares(res.CPUShares)}
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

// withOOMScoreAdj sets the score, never below the agent's own: lowering it needs
// CAP_SYS_RESOURCE, which some sandboxes (and some gateway setups) do not grant, and runc
// then fails the start with an unhelpful error.
func withOOMScoreAdj(adj int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if own, ok := runtime.AgentOOMScoreAdj(); ok {
			adj = runtime.ClampOOMScoreAdj(adj, own)
		}
		s.Process.OOMScoreAdj = &adj
		return nil
	}
}

// verifyNonRoot refuses a container that would run as root, after the image's user and the
// securityContext were applied, with kubelet's message. pod is "name_namespace(uid)".
func verifyNonRoot(pod, container string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process != nil && s.Process.User.UID == 0 {
			return &runtime.ConfigError{Message: fmt.Sprintf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)",
				pod, container)}
		}
		return nil
	}
}

// withPIDNamespaceOf puts the container in the PID namespace of the process pid (an ephemeral
// container's target container).
func withPIDNamespaceOf(pid uint32) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, c *containers.Container, s *oci.Spec) error {
		return oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: fmt.Sprintf("/proc/%d/ns/pid", pid)})(ctx, client, c, s)
	}
}
