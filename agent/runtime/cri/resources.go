package cri

import (
	"context"
	"fmt"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// UpdateContainerResources implements runtime.Runtime with the CRI call of that name: the
// runtime updates the running container's cgroup (and its record of the container's
// resources), its process going on.
func (r *Runtime) UpdateContainerResources(ctx context.Context, id string, res runtime.Resources) error {
	// The CRI call also takes a container that does not run (its record changes, for its next
	// start): the contract is a running container's cgroup, and holdfast never restarts an
	// exited container but as a new attempt, made from the allocation.
	if _, err := r.runningPid(ctx, id); err != nil {
		return err
	}
	_, err := r.rs.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: criResources(res)})
	if notFoundMessage(err) {
		return fmt.Errorf("update resources of container %s: %w: %w", id, runtime.ErrNotFound, err)
	}
	if err != nil {
		return fmt.Errorf("update resources of container %s: %w", id, err)
	}
	return nil
}

// ContainerResources implements runtime.Runtime: read from the cgroup files of the
// container's process (the runtime's own status of its resources is what it was asked, and
// runtimes before the CRI's ContainerStatus.resources report none).
func (r *Runtime) ContainerResources(ctx context.Context, id string) (runtime.Resources, error) {
	pid, err := r.runningPid(ctx, id)
	if err != nil {
		return runtime.Resources{}, err
	}
	s, err := cgroups.Host().Settings(int(pid))
	if err != nil {
		return runtime.Resources{}, fmt.Errorf("read cgroup of container %s: %w", id, err)
	}
	return runtime.Resources{CPUShares: s.CPUShares, CPUQuota: s.CPUQuota, CPUPeriod: s.CPUPeriod, MemoryLimit: s.MemoryLimit}, nil
}

// runningPid is the process of running container id; an error wrapping runtime.ErrNotFound
// when it does not run.
func (r *Runtime) runningPid(ctx context.Context, id string) (uint32, error) {
	cs, err := r.status(ctx, id, criapi.ContainerState_CONTAINER_RUNNING)
	if notFoundMessage(err) {
		return 0, fmt.Errorf("%w: %w", runtime.ErrNotFound, err)
	}
	if err != nil {
		return 0, err
	}
	if cs.st.State != criapi.ContainerState_CONTAINER_RUNNING || cs.pid == 0 {
		return 0, fmt.Errorf("container %s does not run: %w", id, runtime.ErrNotFound)
	}
	return cs.pid, nil
}
