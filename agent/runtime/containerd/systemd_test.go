package containerd

import (
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// TestCgroupsPath: a pod cgroup that is a systemd slice gives runc's "slice:prefix:id" and the
// systemd driver; any other parent a path below it, as containerd's CRI plugin decides.
func TestCgroupsPath(t *testing.T) {
	for _, tt := range []struct {
		parent, id string
		want       string
		systemd    bool
		dir        string // the systemd form's cgroup in the hierarchy
	}{
		{"/kubepods/burstable/pod12-ab", "c1", "/kubepods/burstable/pod12-ab/c1", false, ""},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice", "c1",
			"kubepods-burstable-pod12_ab.slice:holdfast:c1", true,
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice/holdfast-c1.scope"},
		{"/kubepods.slice/kubepods-pod9.slice", "x_y-1", "kubepods-pod9.slice:holdfast:x_y-1", true,
			"/kubepods.slice/kubepods-pod9.slice/holdfast-x_y-1.scope"},
	} {
		got, systemd := cgroupsPath(tt.parent, tt.id)
		if got != tt.want || systemd != tt.systemd {
			t.Errorf("cgroupsPath(%q, %q) = %q, %v; want %q, %v", tt.parent, tt.id, got, systemd, tt.want, tt.systemd)
		}
		if systemd {
			if dir := systemdCgroupPath(got); dir != tt.dir {
				t.Errorf("systemdCgroupPath(%q) = %q, want %q", got, dir, tt.dir)
			}
		}
	}
	for _, bad := range []string{"/kubepods/pod1/c1", "a:b", "-x.slice:p:n:extra", "a--b.slice:p:n"} {
		if dir := systemdCgroupPath(bad); dir != "" {
			t.Errorf("systemdCgroupPath(%q) = %q, want none", bad, dir)
		}
	}
}

// TestSpecCgroupsPathSystemd: the OCI spec of a container whose pod cgroup is a slice names
// runc's systemd form.
func TestSpecCgroupsPathSystemd(t *testing.T) {
	cfg := runtime.ContainerConfig{PodUID: "12-ab", Name: "main", Attempt: 0,
		CgroupParent: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_ab.slice"}
	var s oci.Spec
	s.Linux = &specs.Linux{}
	s.Process = &specs.Process{}
	for _, o := range ContainerSpecOpts(cfg, NodeSecurity{}) {
		_ = o(t.Context(), nil, nil, &s) // options reading the image or the host may fail here; the cgroup one does not
	}
	want := "kubepods-besteffort-pod12_ab.slice:holdfast:" + runtime.ContainerID(cfg.PodUID, cfg.Name, cfg.Attempt)
	if s.Linux.CgroupsPath != want {
		t.Errorf("cgroupsPath %q, want %q", s.Linux.CgroupsPath, want)
	}
}
