package cri

import (
	"context"
	"errors"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// TestContainerSecurity: the confinement the pod layer resolved (the container's securityContext
// over the pod's: agent/pods TestContainerSecurityResolution), as the kubelet sends it to the
// runtime.
func TestContainerSecurity(t *testing.T) {
	r := &Runtime{cfg: Config{SeccompProfileRoot: "/var/lib/holdfast/seccomp"}}
	cfg := runtime.ContainerConfig{PodName: "p", PodNamespace: "default", PodUID: "u", Name: "app", Security: runtime.Security{
		HostIPC:   true,
		RunAsUser: ptr.To(int64(1001)), RunAsGroup: ptr.To(int64(2000)), SupplementalGroups: []int64{3000, 4000},
		Capabilities:           &runtime.Capabilities{Add: []string{"NET_ADMIN"}, Drop: []string{"ALL"}},
		ReadOnlyRootFilesystem: true,
		NoNewPrivileges:        true,
		Seccomp:                &runtime.Profile{Type: runtime.ProfileLocalhost, Localhost: "audit.json"},
	}}
	got, err := r.containerSecurity(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := &criapi.LinuxContainerSecurityContext{
		NamespaceOptions:   &criapi.NamespaceOption{Network: criapi.NamespaceMode_POD, Pid: criapi.NamespaceMode_CONTAINER, Ipc: criapi.NamespaceMode_NODE},
		RunAsUser:          &criapi.Int64Value{Value: 1001},
		RunAsGroup:         &criapi.Int64Value{Value: 2000},
		SupplementalGroups: []int64{3000, 4000},
		Capabilities:       &criapi.Capability{AddCapabilities: []string{"NET_ADMIN"}, DropCapabilities: []string{"ALL"}},
		ReadonlyRootfs:     true,
		NoNewPrivs:         true,
		MaskedPaths:        defaultMaskedPaths,
		ReadonlyPaths:      defaultReadonlyPaths,
		Seccomp:            &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Localhost, LocalhostRef: "/var/lib/holdfast/seccomp/audit.json"},
	}
	if !reflect.DeepEqual(got.String(), want.String()) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	// runAsNonRoot with an explicit root user is refused before the runtime is asked.
	cfg.Security.RunAsUser, cfg.Security.RunAsNonRoot = ptr.To(int64(0)), true
	var cfgErr *runtime.ConfigError
	if _, err := r.containerSecurity(context.Background(), cfg); !errors.As(err, &cfgErr) {
		t.Errorf("runAsNonRoot with runAsUser 0: %v, want a ConfigError", err)
	}
}

func TestCRIMounts(t *testing.T) {
	got, err := criMounts([]specs.Mount{
		{Destination: "/data", Type: "bind", Source: "/var/lib/holdfast/pods/x/volumes/data", Options: []string{"rbind", "rprivate", "ro"}},
		{Destination: "/shared", Type: "bind", Source: "/mnt/shared", Options: []string{"rbind", "rslave", "rw"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Readonly || got[0].Propagation != criapi.MountPropagation_PROPAGATION_PRIVATE ||
		got[1].Readonly || got[1].Propagation != criapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER || got[1].HostPath != "/mnt/shared" {
		t.Errorf("mounts %v", got)
	}
	if _, err := criMounts([]specs.Mount{{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"}}); err == nil {
		t.Error("a tmpfs mount was accepted")
	}
}

// TestToContainer: the runtime's states as the pod workers read them.
func TestToContainer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		st     *criapi.ContainerStatus
		state  runtime.State
		reason string
	}{
		{"running", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_RUNNING, StartedAt: 1}, runtime.StateRunning, ""},
		{"exited 0", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_EXITED, StartedAt: 1, FinishedAt: 2}, runtime.StateExited, runtime.ReasonCompleted},
		{"exited 1", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_EXITED, ExitCode: 1}, runtime.StateExited, runtime.ReasonError},
		{"oom", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_EXITED, ExitCode: 137, Reason: "OOMKilled"}, runtime.StateExited, runtime.ReasonOOMKilled},
		{"unknown, started: taken as running, never as lost", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_UNKNOWN, StartedAt: 1}, runtime.StateRunning, ""},
		{"created", &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_CREATED}, runtime.StateCreated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.st.Labels = map[string]string{LabelPodUID: "uid", LabelContainerName: "app"}
			tc.st.Annotations = map[string]string{annotationRestartCount: "3", annotationSpecHash: "h"}
			c := toContainer(&containerStatus{st: tc.st})
			if c.State != tc.state || c.Reason != tc.reason || c.Attempt != 3 || c.SpecHash != "h" || c.PodUID != "uid" || c.Name != "app" || !c.Recorded || c.Static {
				t.Errorf("%+v", c)
			}
		})
	}
	// A static pod's container says so itself (runtime.Container.Static).
	st := &criapi.ContainerStatus{State: criapi.ContainerState_CONTAINER_RUNNING, StartedAt: 1,
		Labels: map[string]string{LabelPodUID: "uid", LabelContainerName: "app"}, Annotations: map[string]string{annotationStatic: "true"}}
	if c := toContainer(&containerStatus{st: st}); !c.Static {
		t.Errorf("a static pod's container read as an API pod's: %+v", c)
	}
}

func TestVerboseInfo(t *testing.T) {
	info := map[string]string{"info": `{"pid": 4242, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]}}}`}
	if got := pidFromInfo(info); got != 4242 {
		t.Errorf("pid %d", got)
	}
	if got := netnsFromInfo(info); got != "/var/run/netns/cni-1" {
		t.Errorf("netns %q", got)
	}
	host := map[string]string{"info": `{"pid": 7, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}`}
	if got := netnsFromInfo(host); got != "" {
		t.Errorf("host network: netns %q", got)
	}
	if pidFromInfo(nil) != 0 || netnsFromInfo(map[string]string{"info": "{"}) != "" {
		t.Error("no or bad info read as something")
	}
}

// TestUsageOf: the runtime's container stats as the node API and eviction read them; what the
// runtime leaves out is 0, not a panic.
func TestUsageOf(t *testing.T) {
	u := usageOf(&criapi.ContainerStats{
		Cpu: &criapi.CpuUsage{UsageCoreNanoSeconds: &criapi.UInt64Value{Value: 1500}},
		Memory: &criapi.MemoryUsage{WorkingSetBytes: &criapi.UInt64Value{Value: 100}, UsageBytes: &criapi.UInt64Value{Value: 300},
			RssBytes: &criapi.UInt64Value{Value: 80}, PageFaults: &criapi.UInt64Value{Value: 7}, MajorPageFaults: &criapi.UInt64Value{Value: 1}},
	})
	want := cgroups.Usage{MemoryWorkingSet: 100, MemoryUsage: 300, MemoryRSS: 80, PageFaults: 7, MajorPageFaults: 1, CPUUsageNanos: 1500}
	if u != want {
		t.Errorf("usageOf: %+v, want %+v", u, want)
	}
	if u := usageOf(&criapi.ContainerStats{}); u != (cgroups.Usage{}) {
		t.Errorf("usageOf of empty stats: %+v", u)
	}
	if u := usageOf(nil); u != (cgroups.Usage{}) {
		t.Errorf("usageOf(nil): %+v", u)
	}
}

// TestSandboxPrivileged: the sandbox is privileged when a container of the pod is, as the
// kubelet makes it; the runtime refuses a privileged container in a sandbox that is not.
func TestSandboxPrivileged(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec v1.PodSpec
		want bool
	}{
		{"none", v1.PodSpec{Containers: []v1.Container{{Name: "app"}}}, false},
		{"privileged false", v1.PodSpec{Containers: []v1.Container{{Name: "app", SecurityContext: &v1.SecurityContext{Privileged: ptr.To(false)}}}}, false},
		{"a container", v1.PodSpec{Containers: []v1.Container{{Name: "a"}, {Name: "b", SecurityContext: &v1.SecurityContext{Privileged: ptr.To(true)}}}}, true},
		{"an init container", v1.PodSpec{InitContainers: []v1.Container{{Name: "init", SecurityContext: &v1.SecurityContext{Privileged: ptr.To(true)}}},
			Containers: []v1.Container{{Name: "app"}}}, true},
	} {
		if got := sandboxSecurity(&v1.Pod{Spec: tc.spec}).Privileged; got != tc.want {
			t.Errorf("%s: sandbox privileged %v, want %v", tc.name, got, tc.want)
		}
	}
}
