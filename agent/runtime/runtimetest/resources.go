package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// checkResize asserts UpdateContainerResources and ContainerResources of running container
// id: a CPU limit raised and a memory limit lowered, then the other way round, each applied
// to the cgroup of the same process (read here from the files its /proc/<pid>/cgroup names,
// not through the backend) and read back as applied; the container runs on, the same
// attempt; a container that does not run is ErrNotFound for both.
func checkResize(t *testing.T, ctx context.Context, rt Runtime, c runtime.Container, stopped string) {
	t.Helper()
	steps := []runtime.Resources{
		{CPUShares: 512, CPUQuota: 50000, CPUPeriod: 100000, MemoryLimit: 64 << 20},
		{CPUShares: 204, CPUQuota: 150000, CPUPeriod: 100000, MemoryLimit: 48 << 20},
		{CPUShares: 1024, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 96 << 20},
	}
	for i, want := range steps {
		if err := rt.UpdateContainerResources(ctx, c.ID, want); err != nil {
			t.Fatalf("update %d (%+v): %v", i, want, err)
		}
		got, err := rt.ContainerResources(ctx, c.ID)
		if err != nil || got.CPUQuota != want.CPUQuota || got.CPUPeriod != want.CPUPeriod || got.MemoryLimit != want.MemoryLimit ||
			!sameShares(got.CPUShares, want.CPUShares) {
			t.Errorf("after update %d: ContainerResources %+v, %v; want %+v", i, got, err, want)
		}
		quota, mem, err := cgroupFiles(c.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if quota != want.CPUQuota || mem != want.MemoryLimit {
			t.Errorf("after update %d: the cgroup of process %d holds quota %d, memory limit %d; want %d, %d", i, c.Pid, quota, mem, want.CPUQuota, want.MemoryLimit)
		}
	}
	if rt, err := rt.ListPod(ctx, c.PodUID); err == nil {
		for _, now := range rt {
			if now.ID == c.ID && (now.State != runtime.StateRunning || now.Pid != c.Pid) {
				t.Errorf("after the updates: %+v; want it running, the same process %d", now, c.Pid)
			}
		}
	}
	if err := rt.UpdateContainerResources(ctx, stopped, steps[0]); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("update of a container that does not run: %v, want ErrNotFound", err)
	}
	if _, err := rt.ContainerResources(ctx, stopped); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("resources of a container that does not run: %v, want ErrNotFound", err)
	}
}

// sameShares: equal, or the same cgroup v2 weight (runc's conversion, which the v2 cgroup
// keeps instead of the shares).
func sameShares(a, b uint64) bool {
	w := func(s uint64) uint64 { return 1 + ((s-2)*9999)/262142 }
	return a == b || w(a) == w(b)
}

// cgroupFiles reads the CFS quota and memory limit of process pid from the files of its
// cgroups, v1 or v2 (-1 quota, 0 memory: none).
func cgroupFiles(pid uint32) (quota, memory int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, 0, err
	}
	dirs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			dirs["unified"] = filepath.Join("/sys/fs/cgroup", parts[2])
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl == "cpu" || ctl == "memory" {
				dirs[ctl] = filepath.Join("/sys/fs/cgroup", ctl, parts[2])
			}
		}
	}
	read := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		return strings.TrimSpace(string(b)), err
	}
	if cpu, ok := dirs["cpu"]; ok {
		q, err := read(filepath.Join(cpu, "cpu.cfs_quota_us"))
		if err != nil {
			return 0, 0, err
		}
		m, err := read(filepath.Join(dirs["memory"], "memory.limit_in_bytes"))
		if err != nil {
			return 0, 0, err
		}
		quota, _ = strconv.ParseInt(q, 10, 64)
		memory, _ = strconv.ParseInt(m, 10, 64)
		return quota, memory, nil
	}
	max, err := read(filepath.Join(dirs["unified"], "cpu.max"))
	if err != nil {
		return 0, 0, err
	}
	m, err := read(filepath.Join(dirs["unified"], "memory.max"))
	if err != nil {
		return 0, 0, err
	}
	quota = -1
	if f := strings.Fields(max); len(f) == 2 && f[0] != "max" {
		quota, _ = strconv.ParseInt(f[0], 10, 64)
	}
	if m != "max" {
		memory, _ = strconv.ParseInt(m, 10, 64)
	}
	return quota, memory, nil
}
