package pods

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/ocispec/*.json from the code as it is")

// goldenCase is one container of one pod, with what the node and the worker contribute
// besides the pod: the OCI spec the containerd backend makes of it is kept in
// testdata/ocispec/<name>.json.
type goldenCase struct {
	name string
	pod  *v1.Pod
	// container: the index in the pod's containers; ephemeral: the pod's ephemeral container
	// of that index instead.
	container int
	ephemeral bool
	node      containerd.NodeSecurity
	// memoryCapacity and noSwap: the node's (resources).
	memoryCapacity int64
	noSwap         bool
	// netns: the pod's network namespace ("" is the host network), with its hostname.
	netns, hostname string
	// mounts: the volumes, /etc files and termination log as the worker gives them.
	mounts []specs.Mount
	// imageUser: the user the image runs as (its config's USER).
	imageUser uint32
	// pidNamespaceOf: the running process of an ephemeral container's target.
	pidNamespaceOf uint32
}

func goldenCases(seccompRoot string) []goldenCase {
	pod := func(name string, spec v1.PodSpec) *v1.Pod {
		return &v1.Pod{ObjectMeta: metaFor(name), Spec: spec}
	}
	res := func(reqCPU, reqMem, limCPU, limMem string) v1.ResourceRequirements {
		r := v1.ResourceRequirements{Requests: v1.ResourceList{}, Limits: v1.ResourceList{}}
		for k, v := range map[v1.ResourceName]string{v1.ResourceCPU: reqCPU, v1.ResourceMemory: reqMem} {
			if v != "" {
				r.Requests[k] = resource.MustParse(v)
			}
		}
		for k, v := range map[v1.ResourceName]string{v1.ResourceCPU: limCPU, v1.ResourceMemory: limMem} {
			if v != "" {
				r.Limits[k] = resource.MustParse(v)
			}
		}
		return r
	}
	volumes := []specs.Mount{
		{Destination: "/data", Type: "bind", Source: "/var/lib/gw/data", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/gw", Type: "bind", Source: "/var/lib/holdfast/pods/uid/volumes/kubernetes.io~configmap/cfg", Options: []string{"rbind", "rprivate", "ro"}},
		{Destination: "/dev/termination-log", Type: "bind", Source: "/var/lib/holdfast/pods/uid/containers/main/0-termination-log", Options: []string{"rbind", "rw"}},
		{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/holdfast/pods/uid/etc-hosts", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/holdfast/pods/uid/resolv.conf", Options: []string{"rbind", "rprivate", "ro"}},
	}
	const netns, gib = "/var/run/netns/holdfast-uid", int64(1 << 30)
	return []goldenCase{
		{
			name: "besteffort-defaults", netns: netns, hostname: "web-0", mounts: volumes, memoryCapacity: gib,
			pod: pod("web-0", v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "web"}}}),
		},
		{
			name: "restricted-guaranteed", netns: netns, hostname: "collector", mounts: volumes[:3], memoryCapacity: gib, imageUser: 1000,
			pod: pod("collector", v1.PodSpec{
				SecurityContext: &v1.PodSecurityContext{RunAsNonRoot: ptr.To(true), FSGroup: ptr.To[int64](2000), SupplementalGroups: []int64{4000, 5000},
					SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}},
				Containers: []v1.Container{{Name: "main", Image: "collector", Resources: res("500m", "128Mi", "500m", "128Mi"),
					SecurityContext: &v1.SecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000),
						ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
						Capabilities: &v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_BIND_SERVICE", "chown"}}}}},
			}),
		},
		{
			name: "burstable-caps-sysctls-localhost-seccomp", netns: netns, hostname: "modbus", mounts: volumes[:2], memoryCapacity: 4 * gib, noSwap: true,
			node: containerd.NodeSecurity{SeccompProfileRoot: seccompRoot, CgroupNamespace: true},
			pod: pod("modbus", v1.PodSpec{
				SecurityContext: &v1.PodSecurityContext{RunAsUser: ptr.To[int64](33), Sysctls: []v1.Sysctl{
					{Name: "net/ipv4/ip_local_port_range", Value: "40000 50000"}, {Name: "kernel.shm_rmid_forced", Value: "1"}}},
				Containers: []v1.Container{
					{Name: "sidecar", Image: "busybox"},
					{Name: "main", Image: "modbus", Resources: res("250m", "64Mi", "1", "256Mi"), WorkingDir: "/srv", Env: []v1.EnvVar{{Name: "A", Value: "1"}},
						SecurityContext: &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_TIME"}, Drop: []v1.Capability{"NET_RAW", "mknod"}},
							SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("gw/deny-clock.json")}}},
				},
			}),
			container: 1,
		},
		{
			name: "cpu-limit-only-runasuser-alone", netns: netns, hostname: "calc", memoryCapacity: gib,
			pod: pod("calc", v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "calc", Resources: res("", "", "2", ""),
				SecurityContext: &v1.SecurityContext{RunAsUser: ptr.To[int64](1000), AllowPrivilegeEscalation: ptr.To(true)}}}}),
		},
		{
			name: "privileged-host-namespaces", hostname: "", memoryCapacity: gib, mounts: volumes[:1],
			node: containerd.NodeSecurity{CgroupNamespace: true, AppArmor: true, SeccompProfileRoot: seccompRoot},
			pod: pod("net-admin", v1.PodSpec{HostNetwork: true, HostPID: true, HostIPC: true,
				Containers: []v1.Container{{Name: "main", Image: "tools", Resources: res("100m", "32Mi", "", "64Mi"),
					SecurityContext: &v1.SecurityContext{Privileged: ptr.To(true),
						Capabilities:   &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
						SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}}}}}),
		},
		{
			name: "host-ipc-with-shm-volume", netns: netns, hostname: "shm", memoryCapacity: gib,
			mounts: []specs.Mount{{Destination: "/dev/shm", Type: "bind", Source: "/var/lib/holdfast/pods/uid/volumes/kubernetes.io~empty-dir/shm", Options: []string{"rbind", "rprivate", "rw"}}},
			pod:    pod("shm", v1.PodSpec{HostIPC: true, Containers: []v1.Container{{Name: "main", Image: "shm"}}}),
		},
		{
			name: "host-network-own-files", hostname: "", memoryCapacity: gib, mounts: volumes[3:],
			pod: pod("dns", v1.PodSpec{HostNetwork: true, Containers: []v1.Container{{Name: "main", Image: "dns", TTY: true}}}),
		},
		{
			name: "runasgroup-alone-image-user", netns: netns, hostname: "g", memoryCapacity: gib, imageUser: 1000,
			pod: pod("g", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{SupplementalGroups: []int64{44}},
				Containers: []v1.Container{{Name: "main", Image: "g", SecurityContext: &v1.SecurityContext{RunAsGroup: ptr.To[int64](3456)}}}}),
		},
		{
			name: "runasnonroot-image-root", netns: netns, hostname: "r", memoryCapacity: gib,
			pod: pod("r", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
				Containers: []v1.Container{{Name: "main", Image: "r"}}}),
		},
		{
			name: "runasnonroot-image-user", netns: netns, hostname: "nr", memoryCapacity: gib, imageUser: 1000,
			pod: pod("nr", v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "nr",
				SecurityContext: &v1.SecurityContext{RunAsNonRoot: ptr.To(true)}}}}),
		},
		{
			name: "apparmor-unconfined-cgroupns", netns: netns, hostname: "aa", memoryCapacity: gib,
			node: containerd.NodeSecurity{AppArmor: true, CgroupNamespace: true},
			pod: pod("aa", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}},
				Containers: []v1.Container{{Name: "main", Image: "aa"}}}),
		},
		{
			name: "seccomp-localhost-outside-root", netns: netns, hostname: "evil", memoryCapacity: gib,
			node: containerd.NodeSecurity{SeccompProfileRoot: seccompRoot},
			pod: pod("evil", v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "evil",
				SecurityContext: &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("../../etc/evil.json")}}}}}),
		},
		{
			name: "seccomp-localhost-missing", netns: netns, hostname: "gone", memoryCapacity: gib,
			node: containerd.NodeSecurity{SeccompProfileRoot: seccompRoot},
			pod: pod("gone", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("gw/none.json")}},
				Containers: []v1.Container{{Name: "main", Image: "gone"}}}),
		},
		{
			name: "seccomp-unconfined-over-pod-default", netns: netns, hostname: "u", memoryCapacity: gib,
			pod: pod("u", v1.PodSpec{SecurityContext: &v1.PodSecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault}},
				Containers: []v1.Container{{Name: "main", Image: "u",
					SecurityContext: &v1.SecurityContext{SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeUnconfined}}}}}),
		},
		{
			name: "ephemeral-target-pid-namespace", netns: netns, hostname: "debug", memoryCapacity: gib, pidNamespaceOf: 4242,
			pod: pod("debug", v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "app"}},
				EphemeralContainers: []v1.EphemeralContainer{{TargetContainerName: "main", EphemeralContainerCommon: v1.EphemeralContainerCommon{
					Name: "debugger", Image: "busybox", TTY: true, Stdin: true,
					SecurityContext: &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}}}}}}),
			ephemeral: true,
		},
	}
}

func metaFor(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "gw", UID: types.UID("uid-" + name)}
}

// TestOCISpecGolden: the OCI spec the containerd backend makes of each golden case, from what
// the pod layer describes, is the one kept in testdata/ocispec. The files were written by the
// code before the runtime contract moved (issue #27), so that the move is proven not to change
// a field. The image's config is a stand-in (imageConfig); the runtime's default spec and every
// option after the image's are the real ones. Host-dependent fields are normalized
// (normalizeSpec). Regenerate with -update-golden only for an intended change of the spec.
func TestOCISpecGolden(t *testing.T) {
	rootfs, err := filepath.Abs("testdata/ocispec/rootfs")
	if err != nil {
		t.Fatal(err)
	}
	seccompRoot, err := filepath.Abs("testdata/ocispec/seccomp")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tc := range goldenCases(seccompRoot) {
		t.Run(tc.name, func(t *testing.T) {
			names[tc.name+".json"] = true
			var c *v1.Container
			if tc.ephemeral {
				c = ephemeralContainers(tc.pod)[tc.container]
			} else {
				c = &tc.pod.Spec.Containers[tc.container]
			}
			got := goldenSpec(t, tc, c, rootfs)
			got = strings.ReplaceAll(got, seccompRoot, "<seccompProfileRoot>")
			path := filepath.Join("testdata/ocispec", tc.name+".json")
			if *updateGolden {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (write it with -update-golden)", err)
			}
			if got != string(want) {
				t.Errorf("the spec of %s differs from %s:\n%s", tc.name, path, lineDiff(string(want), got))
			}
		})
	}
	if !*updateGolden {
		files, _ := filepath.Glob("testdata/ocispec/*.json")
		for _, f := range files {
			if !names[filepath.Base(f)] {
				t.Errorf("%s has no case", f)
			}
		}
	}
}

// goldenSpec is the spec of tc's container as JSON, or the error that refused it and its kind.
func goldenSpec(t *testing.T, tc goldenCase, c *v1.Container, rootfs string) string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "holdfast")
	rec := &containers.Container{ID: "golden"}
	opts := append([]oci.SpecOpts{oci.WithRootFSPath(rootfs), imageConfig(tc.imageUser)}, goldenSpecOpts(tc, c)...)
	s, err := oci.GenerateSpec(ctx, nil, rec, opts...)
	var out any
	if err != nil {
		// The kind decides the waiting reason: CreateContainerConfigError or CreateContainerError.
		kind := "runtime"
		if errors.As(err, new(*errConfig)) || errors.As(err, new(*runtime.ConfigError)) {
			kind = "config"
		}
		out = map[string]string{"error": err.Error(), "kind": kind}
	} else {
		normalizeSpec(t, s)
		out = s
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// imageConfig stands in for oci.WithImageConfig of an image whose config sets these.
func imageConfig(user uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Args = []string{"/app", "--serve"}
		s.Process.Env = append(s.Process.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE=1")
		s.Process.Cwd = "/"
		s.Process.User = specs.User{UID: user, GID: user}
		return nil
	}
}

// normalizeSpec replaces what depends on the host running the test: the rootfs path, the
// host's devices (privileged), and the capability set of the test process where the spec has
// all of it.
func normalizeSpec(t *testing.T, s *oci.Spec) {
	s.Root.Path = "rootfs"
	if s.Linux != nil {
		if len(s.Linux.Devices) > 0 {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "<the host's devices>"}}
		}
	}
	all, err := cap.Current()
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Process.Capabilities; c != nil {
		for _, set := range []*[]string{&c.Bounding, &c.Effective, &c.Permitted, &c.Inheritable, &c.Ambient} {
			if len(*set) > 0 && len(*set) == len(all) && sameSet(*set, all) {
				*set = []string{"<every capability of the runtime>"}
			}
		}
	}
}

// lineDiff shows the lines of want and got that differ, in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want " + wl + "\n  got  " + gl + "\n")
		}
	}
	return b.String()
}

// goldenSpecOpts are the options the containerd backend applies after the image's config for
// tc's container, from what the pod layer describes of it (as worker.containerConfig and
// startContainer fill runtime.ContainerConfig: resources, confinement, the ephemeral
// container's target).
func goldenSpecOpts(tc goldenCase, c *v1.Container) []oci.SpecOpts {
	cfg := runtime.ContainerConfig{
		PodUID: string(tc.pod.UID), PodName: tc.pod.Name, PodNamespace: tc.pod.Namespace, Name: c.Name, Image: c.Image,
		Env:        []string{"KUBERNETES_SERVICE_HOST=10.0.0.1", "POD_NAME=" + tc.pod.Name},
		WorkingDir: c.WorkingDir, NetNSPath: tc.netns, Hostname: tc.hostname, Mounts: slices.Clone(tc.mounts),
		Stdin: c.Stdin, StdinOnce: c.StdinOnce, TTY: c.TTY,
		Resources:              containerResources(tc.pod, c, tc.memoryCapacity, tc.noSwap),
		Security:               containerSecurity(tc.pod, c),
		Pod:                    tc.pod,
		TerminationMessagePath: c.TerminationMessagePath,
		PIDNamespaceOfPid:      tc.pidNamespaceOf,
	}
	return containerd.ContainerSpecOpts(cfg, tc.node)
}
