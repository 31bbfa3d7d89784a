package pods

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// specFor builds the spec containerd would get for the first container of pod: the runtime's
// default spec, then what the containerd backend makes of the pod layer's description (its own
// network namespace, no resources). The rootfs is an empty directory (no /etc/passwd).
func specFor(t *testing.T, pod *v1.Pod, node containerd.NodeSecurity) (*oci.Spec, error) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	c := &containers.Container{ID: "c"}
	s, err := oci.GenerateSpec(ctx, nil, c, oci.WithRootFSPath(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ctr := &pod.Spec.Containers[0]
	cfg := runtime.ContainerConfig{Name: ctr.Name, NetNSPath: "/var/run/netns/test", Security: containerSecurity(pod, ctr),
		Resources: containerResources(pod, ctr, 1<<30, false)}
	err = oci.ApplyOpts(ctx, nil, c, s, containerd.ContainerSpecOpts(cfg, node)...)
	return s, err
}

func securityPod(sc *v1.SecurityContext) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", SecurityContext: sc}}}}
}

func TestCapabilitiesFollowTheCRIRule(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	def, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defaults := def.Process.Capabilities.Bounding
	without := func(caps []string, drop string) []string {
		return slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == drop })
	}
	for _, tc := range []struct {
		name string
		caps *v1.Capabilities
		want []string
	}{
		{"unset keeps the default set", nil, defaults},
		{"drop ALL then add", &v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_BIND_SERVICE", "chown"}},
			[]string{"CAP_NET_BIND_SERVICE", "CAP_CHOWN"}},
		{"drop ALL", &v1.Capabilities{Drop: []v1.Capability{"all"}}, nil},
		{"drop one", &v1.Capabilities{Drop: []v1.Capability{"NET_RAW"}}, without(defaults, "CAP_NET_RAW")},
		{"add then drop the same: dropped", &v1.Capabilities{Add: []v1.Capability{"SYS_TIME"}, Drop: []v1.Capability{"SYS_TIME"}}, defaults},
		{"add one", &v1.Capabilities{Add: []v1.Capability{"CAP_SYS_TIME"}}, append(slices.Clone(defaults), "CAP_SYS_TIME")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := specFor(t, securityPod(&v1.SecurityContext{Capabilities: tc.caps}), containerd.NodeSecurity{})
			if err != nil {
				t.Fatal(err)
			}
			c := s.Process.Capabilities
			for set, got := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
				if !sameSet(got, tc.want) {
					t.Errorf("%s %v, want %v", set, got, tc.want)
				}
			}
			if len(c.Ambient) > 0 {
				t.Errorf("ambient %v, want none", c.Ambient)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

func TestRunAsGroupAlone(t *testing.T) {
	s, err := specFor(t, securityPod(&v1.SecurityContext{RunAsGroup: ptr.To[int64](3456)}), containerd.NodeSecurity{})
	if err != nil {
		t.Fatal(err)
	}
	if u := s.Process.User; u.UID != 0 || u.GID != 3456 || !slices.Equal(u.AdditionalGids, []uint32{3456}) {
		t.Errorf("user %+v, want uid 0 (the image's) with gid 3456", u)
	}
}

// no_new_privs is set only when allowPrivilegeEscalation is false, as kubelet sets it
// (AddNoNewPrivileges): containerd's default spec sets it always, which would stop a setuid
// binary of a pod that did not ask for that.
func TestNoNewPrivilegesOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		sc   *v1.SecurityContext
		want bool
	}{
		{"no securityContext", nil, false},
		{"allowPrivilegeEscalation unset", &v1.SecurityContext{RunAsUser: ptr.To[int64](1000)}, false},
		{"allowPrivilegeEscalation true", &v1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}, false},
		{"allowPrivilegeEscalation false", &v1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := specFor(t, securityPod(tc.sc), containerd.NodeSecurity{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Process.NoNewPrivileges != tc.want {
				t.Errorf("noNewPrivileges %v, want %v", s.Process.NoNewPrivileges, tc.want)
			}
		})
	}
}

func hasNamespace(s *oci.Spec, t specs.LinuxNamespaceType) bool {
	return slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == t })
}

func TestHostNamespaces(t *testing.T) {
	p := securityPod(nil)
	s, err := specFor(t, p, containerd.NodeSecurity{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasNamespace(s, specs.PIDNamespace) || !hasNamespace(s, specs.IPCNamespace) || hasNamespace(s, specs.CgroupNamespace) {
		t.Fatalf("default pod namespaces %v: want its own pid and ipc, no cgroup namespace on v1", s.Linux.Namespaces)
	}
	p.Spec.HostPID, p.Spec.HostIPC = true, true
	if s, err = specFor(t, p, containerd.NodeSecurity{}); err != nil {
		t.Fatal(err)
	}
	if hasNamespace(s, specs.PIDNamespace) || hasNamespace(s, specs.IPCNamespace) {
		t.Errorf("hostPID and hostIPC pod namespaces %v: want the host's pid and ipc", s.Linux.Namespaces)
	}
	var shm []specs.Mount
	for _, m := range s.Mounts {
		if m.Destination == "/dev/shm" {
			shm = append(shm, m)
		}
	}
	if len(shm) != 1 || shm[0].Source != "/dev/shm" || shm[0].Type != "bind" {
		t.Errorf("hostIPC /dev/shm mounts %+v, want the host's /dev/shm alone", shm)
	}

	if s, err = specFor(t, securityPod(nil), containerd.NodeSecurity{CgroupNamespace: true}); err != nil || !hasNamespace(s, specs.CgroupNamespace) {
		t.Errorf("cgroup v2 host: namespaces %v (%v), want a cgroup namespace", s.Linux.Namespaces, err)
	}
	if s, err = specFor(t, securityPod(&v1.SecurityContext{Privileged: ptr.To(true)}), containerd.NodeSecurity{CgroupNamespace: true}); err != nil || hasNamespace(s, specs.CgroupNamespace) {
		t.Errorf("privileged on a cgroup v2 host: namespaces %v (%v), want the host's cgroup namespace", s.Linux.Namespaces, err)
	}
}

func TestSysctlsAndSeccomp(t *testing.T) {
	p := securityPod(&v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("gw/deny.json")}})
	p.Spec.SecurityContext = &v1.PodSecurityContext{Sysctls: []v1.Sysctl{{Name: "net/ipv4/ip_local_port_range", Value: "40000 50000"}, {Name: "kernel.shm_rmid_forced", Value: "1"}}}
	root := t.TempDir()
	if _, err := specFor(t, p, containerd.NodeSecurity{SeccompProfileRoot: root}); err == nil || !strings.Contains(err.Error(), filepath.Join(root, "gw/deny.json")) {
		t.Fatalf("missing Localhost profile: err %v, want one naming the file", err)
	}
	if err := os.MkdirAll(filepath.Join(root, "gw"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "gw/deny.json"), []byte(`{"defaultAction": "SCMP_ACT_ERRNO"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := specFor(t, p, containerd.NodeSecurity{SeccompProfileRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp %+v, want the Localhost profile", s.Linux.Seccomp)
	}
	if s.Linux.Sysctl["net.ipv4.ip_local_port_range"] != "40000 50000" || s.Linux.Sysctl["kernel.shm_rmid_forced"] != "1" {
		t.Errorf("sysctls %v", s.Linux.Sysctl)
	}

	p.Spec.Containers[0].SecurityContext.SeccompProfile.LocalhostProfile = ptr.To("../../etc/evil.json")
	if _, err := specFor(t, p, containerd.NodeSecurity{SeccompProfileRoot: root}); err == nil {
		t.Error("a Localhost profile outside seccompProfileRoot was loaded")
	}

	// Privileged: no filter, whatever the profile (as the CRI plugin).
	p.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
	if s, err = specFor(t, p, containerd.NodeSecurity{SeccompProfileRoot: root}); err != nil || s.Linux.Seccomp != nil {
		t.Errorf("privileged: seccomp %+v (%v), want none", s.Linux.Seccomp, err)
	}
}

func TestAppArmorProfileSelection(t *testing.T) {
	p := securityPod(nil)
	p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "main": "localhost/gw-collector"}
	p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}}
	if got := appArmorProfile(p, &p.Spec.Containers[0]); got == nil || got.Type != v1.AppArmorProfileTypeLocalhost || *got.LocalhostProfile != "gw-collector" {
		t.Errorf("annotation before the pod's profile: got %+v", got)
	}
	p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}}
	if got := appArmorProfile(p, &p.Spec.Containers[0]); got.Type != v1.AppArmorProfileTypeRuntimeDefault {
		t.Errorf("container's field first: got %+v", got)
	}
	if sec := containerSecurity(p, &p.Spec.Containers[0]); sec.AppArmor == nil || sec.AppArmor.Type != runtime.ProfileRuntimeDefault {
		t.Errorf("the container's profile in its confinement: %+v", sec.AppArmor)
	}
	if sec := containerSecurity(securityPod(nil), &securityPod(nil).Spec.Containers[0]); sec.AppArmor != nil {
		t.Errorf("no profile asked for: %+v, want none (each backend's default)", sec.AppArmor)
	}
}
