package containerd

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// UpdateContainerResources implements runtime.Runtime: the running task's cgroup gets res's
// CPU and memory settings through the shim (runc update), its process going on.
func (r *Runtime) UpdateContainerResources(ctx context.Context, id string, res runtime.Resources) error {
	task, err := r.runningTask(ctx, id)
	if err != nil {
		return err
	}
	if err := task.Update(r.ctx(ctx), client.WithResources(LinuxResources(res))); err != nil {
		return fmt.Errorf("update resources of container %s: %w", id, err)
	}
	return nil
}

// ContainerResources implements runtime.Runtime: read from the cgroup files of the task's
// process.
func (r *Runtime) ContainerResources(ctx context.Context, id string) (runtime.Resources, error) {
	task, err := r.runningTask(ctx, id)
	if err != nil {
		return runtime.Resources{}, err
	}
	return appliedResources(task.Pid())
}

// runningTask is the container's task; an error wrapping runtime.ErrNotFound when it has none.
func (r *Runtime) runningTask(ctx context.Context, id string) (client.Task, error) {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("container %s: %w", id, runtime.ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("task of container %s: %w", id, runtime.ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("load task of %s: %w", id, err)
	}
	return task, nil
}

// LinuxResources is the part of res a resize changes, as the OCI spec's resources: CPU
// shares, CFS quota and period, memory limit. A quota of 0 (no CPU limit) is written as -1,
// which lifts a quota the container had; a memory limit of 0 as -1 likewise.
func LinuxResources(res runtime.Resources) *specs.LinuxResources {
	shares := res.CPUShares
	quota, period := res.CPUQuota, uint64(res.CPUPeriod)
	if quota <= 0 {
		quota = -1
		period = 0
	}
	mem := res.MemoryLimit
	if mem <= 0 {
		mem = -1
	}
	out := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Shares: &shares, Quota: &quota},
		Memory: &specs.LinuxMemory{Limit: &mem},
	}
	if period > 0 {
		out.CPU.Period = &period
	}
	return out
}

// appliedResources reads the CPU and memory settings of the cgroups process pid is in.
func appliedResources(pid uint32) (runtime.Resources, error) {
	s, err := cgroups.Host().Settings(int(pid))
	if err != nil {
		return runtime.Resources{}, fmt.Errorf("read cgroup of process %d: %w", pid, err)
	}
	return runtime.Resources{CPUShares: s.CPUShares, CPUQuota: s.CPUQuota, CPUPeriod: s.CPUPeriod, MemoryLimit: s.MemoryLimit}, nil
}
