package containerd

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	client "github.com/containerd/containerd/v2/client"
)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// oomKilledInCgroup tells whether the kernel's OOM killer killed a process of the container's
// cgroup, from the cgroup itself, which exists until the task is deleted. It covers what the
// shim's OOM event misses: on cgroup v2 the shim watches memory.events only once the task has
// started, so a process killed within its first moments (seen on the gateway VM: dd over its
// limit, killed before holdfast had recorded the start) gives an exit and no OOM event.
func oomKilledInCgroup(ctx context.Context, c client.Container) bool {
	spec, err := c.Spec(ctx)
	if err != nil || spec.Linux == nil {
		return false
	}
	return oomKillCount(cgroupRoot, spec.Linux.CgroupsPath) > 0
}

// oomKillCount returns the oom_kill count of the cgroup at path (cgroupfs layout, as
// containerd's default "/NAMESPACE/ID", or systemd's "slice:prefix:name", whose scope is
// looked up below its slice) under root: memory.events on the unified hierarchy (cgroup v2),
// memory.oom_control in the memory controller's (v1). 0 when neither is readable.
func oomKillCount(root, path string) int {
	if strings.Contains(path, ":") {
		path = systemdCgroupPath(path)
	}
	if path == "" {
		return 0
	}
	for _, f := range []string{
		filepath.Join(root, path, "memory.events"),
		filepath.Join(root, "memory", path, "memory.oom_control"),
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
	}
	return 0
}
