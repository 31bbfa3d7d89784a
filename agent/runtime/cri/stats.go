package cri

import (
	"context"
	"fmt"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Usage measures a running container as the runtime reports it (ContainerStats), which it
// knows whatever its isolation, where reading cgroups through a pid would assume runc's. The
// CRI's container stats have no task count: that one is read from the container's pids
// cgroup when the runtime gave its pid, and is 0 otherwise.
func (r *Runtime) Usage(ctx context.Context, c runtime.Container) (cgroups.Usage, error) {
	resp, err := r.rs.ContainerStats(ctx, &criapi.ContainerStatsRequest{ContainerId: c.ID})
	if err != nil {
		return cgroups.Usage{}, fmt.Errorf("container %s stats: %w", c.ID, err)
	}
	u := usageOf(resp.GetStats())
	if c.Pid != 0 {
		u.PIDs = r.cgroups.Tasks(int(c.Pid))
	}
	return u, nil
}

// usageOf converts the CRI's container stats; a figure the runtime left out stays 0.
func usageOf(s *criapi.ContainerStats) cgroups.Usage {
	mem := s.GetMemory()
	return cgroups.Usage{
		MemoryWorkingSet: int64(mem.GetWorkingSetBytes().GetValue()),
		MemoryUsage:      int64(mem.GetUsageBytes().GetValue()),
		MemoryRSS:        int64(mem.GetRssBytes().GetValue()),
		PageFaults:       int64(mem.GetPageFaults().GetValue()),
		MajorPageFaults:  int64(mem.GetMajorPageFaults().GetValue()),
		CPUUsageNanos:    s.GetCpu().GetUsageCoreNanoSeconds().GetValue(),
	}
}
