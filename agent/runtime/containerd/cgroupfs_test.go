package containerd

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// A container that mounts cgroup2 in the host's cgroup namespace mounts the host's own cgroup2
// superblock: options its mount leaves out are cleared host-wide, systemd's nsdelegate and
// memory_recursiveprot among them (MemoryLow/MemoryMin protections stop applying recursively,
// cgroup namespaces stop being delegation boundaries). So such a container's mount repeats
// them, as containerd's CRI plugin does; one in a cgroup namespace of its own has a
// superblock view of its own and needs nothing.
func TestCgroupfsMountKeepsTheHostsSuperblockOptions(t *testing.T) {
	host := []string{"rw", "nosuid", "nodev", "noexec", "relatime", "nsdelegate", "memory_recursiveprot"}
	cases := []struct {
		name       string
		privileged bool
		node       NodeSecurity
		want       []string
	}{
		{"privileged on cgroup v2 (the host's cgroup namespace)", true,
			NodeSecurity{CgroupNamespace: true, CgroupMountOptions: host},
			[]string{"nosuid", "noexec", "nodev", "relatime", "rw", "nsdelegate", "memory_recursiveprot"}},
		{"unprivileged on cgroup v2 (a cgroup namespace of its own)", false,
			NodeSecurity{CgroupNamespace: true, CgroupMountOptions: host},
			[]string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{"no cgroup namespaces configured", false,
			NodeSecurity{CgroupMountOptions: host},
			[]string{"nosuid", "noexec", "nodev", "relatime", "ro", "nsdelegate", "memory_recursiveprot"}},
		{"cgroup v1 (a tmpfs at /sys/fs/cgroup)", true,
			NodeSecurity{CgroupMountOptions: []string{"ro", "nosuid", "nodev", "noexec", "mode=755"}},
			[]string{"nosuid", "noexec", "nodev", "relatime", "rw"}},
	}
	for _, tc := range cases {
		cfg := runtime.ContainerConfig{PodUID: "u", PodName: "p", PodNamespace: "default", Name: "c",
			Security: runtime.Security{Privileged: tc.privileged}}
		s, err := oci.GenerateSpec(namespaces.WithNamespace(context.Background(), "holdfast"), nil, &containers.Container{ID: "c"}, ContainerSpecOpts(cfg, tc.node)...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		i := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == cgroupRoot })
		if i < 0 {
			t.Fatalf("%s: no mount at %s", tc.name, cgroupRoot)
		}
		if got := s.Mounts[i].Options; !slices.Equal(got, tc.want) {
			t.Errorf("%s: cgroup mount options %v, want %v", tc.name, got, tc.want)
		}
	}
}
