package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// podLog returns what a container of a pod printed (attempt 0).
func (e *env) podLog(t *testing.T, p *v1.Pod, container string) string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(e.agent.Config.PodLogDir, p.Namespace+"_"+p.Name+"_"+string(p.UID), container, "0.log"))
	return string(b)
}

// cgroupFile reads a cgroup v1 file of a running container, found through its process.
func (e *env) cgroupFile(t *testing.T, containerID, file string) string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "holdfast")
	c, err := e.cd.Client.LoadContainer(ctx, containerID)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	controller, name, _ := strings.Cut(file, "/")
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", task.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(cg), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] == controller {
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, parts[2], name))
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no %s cgroup in %s", controller, cg)
	return ""
}

// TestResourcesAndSecurityContext: limits become cgroup settings the container sees, an OOM
// kill is reported as OOMKilled, the QoS class is the API's, and the securityContext fields
// take effect, runAsNonRoot refusing an image that runs as root with a clear reason.
func TestResourcesAndSecurityContext(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	limited := sleeperPod("limited", true)
	limited.Spec.Containers[0] = step("main", "id -u; id -g; touch /probe-write 2>/dev/null && echo rootfs-writable || echo rootfs-readonly; grep CapEff /proc/self/status; exec sleep 3600")
	limited.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	uid, gid, ro, no := int64(1234), int64(2345), true, false
	limited.Spec.Containers[0].SecurityContext = &v1.SecurityContext{
		RunAsUser: &uid, RunAsGroup: &gid, ReadOnlyRootFilesystem: &ro, AllowPrivilegeEscalation: &no,
		Capabilities:   &v1.Capabilities{Drop: []v1.Capability{"ALL"}},
		SeccompProfile: &v1.SeccompProfile{Type: v1.SeccompProfileTypeRuntimeDefault},
	}

	hog := sleeperPod("hog", true)
	hog.Spec.RestartPolicy = v1.RestartPolicyNever
	hog.Spec.Containers[0] = step("main", "head -c 200m /dev/zero | tail")
	hog.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("24Mi")}

	rootless := sleeperPod("rootless", true)
	yes := true
	rootless.Spec.SecurityContext = &v1.PodSecurityContext{RunAsNonRoot: &yes}

	for _, p := range []*v1.Pod{limited, hog, rootless} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, "limited")["limited"]
	if running.Status.QOSClass != v1.PodQOSBurstable {
		t.Errorf("qosClass %s, want Burstable", running.Status.QOSClass)
	}
	testenv.Eventually(t, 30*time.Second, "limits and identity seen inside the container", func() error {
		out := e.podLog(t, running, "main")
		for _, want := range []string{"1234", "2345", "rootfs-readonly", "CapEff:\t0000000000000000"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("output %q lacks %q", out, want)
			}
		}
		return nil
	})

	// The cgroup the runtime put the container in carries the limits.
	id := strings.TrimPrefix(running.Status.ContainerStatuses[0].ContainerID, "containerd://")
	for file, want := range map[string]string{
		"cpu/cpu.cfs_quota_us":         "50000",
		"cpu/cpu.shares":               "256",
		"memory/memory.limit_in_bytes": fmt.Sprint(64 << 20),
	} {
		if got := e.cgroupFile(t, id, file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}

	testenv.Eventually(t, 60*time.Second, "memory hog OOMKilled", func() error {
		p, err := pods.Get(ctx, "hog", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.Reason != "OOMKilled" || p.Status.Phase != v1.PodFailed {
			return fmt.Errorf("phase %s terminated %+v", p.Status.Phase, term)
		}
		return nil
	})

	testenv.Eventually(t, 60*time.Second, "runAsNonRoot refuses the root image", func() error {
		p, err := pods.Get(ctx, "rootless", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if w == nil || w.Reason != "CreateContainerConfigError" || !strings.Contains(w.Message, "runAsNonRoot and image will run as root") {
			return fmt.Errorf("waiting %+v", w)
		}
		return nil
	})
}
