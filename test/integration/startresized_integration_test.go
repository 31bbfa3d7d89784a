package integration

import (
	"context"
	"fmt"
	"path"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestStartingResizedContainer: an app container resized while it does not run yet (the pod
// in its init phase) starts under a pod cgroup that holds its new limits, as the kubelet's
// startingResizedContainer updates the pod cgroup first. Before, the pod cgroup was only
// updated for a running container's resize: the app container's CFS quota (60000) above its
// pod's (20000) made runc fail on cgroup v1 (EINVAL, RunContainerError for good), and on v2 it
// would have run capped at the old limits (found by the review of b4be292).
func TestStartingResizedContainer(t *testing.T) {
	e := startResizeEnv(t)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	res := func(cpu, mem string) v1.ResourceRequirements {
		l := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}
		return v1.ResourceRequirements{Requests: l, Limits: l.DeepCopy()}
	}
	p := sleeperPod("start-resized", true)
	p.Spec.Containers[0].Resources = res("200m", "64Mi")
	p.Spec.Containers[0].ResizePolicy = nil
	init := step("init", "sleep 20")
	init.Resources = res("100m", "32Mi")
	p.Spec.InitContainers = []v1.Container{init}
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "init running", func() error {
		var err error
		if p, err = pods.Get(ctx, "start-resized", metav1.GetOptions{}); err != nil {
			return err
		}
		if len(p.Status.InitContainerStatuses) != 1 || p.Status.InitContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("init %+v", p.Status.InitContainerStatuses)
		}
		return nil
	})
	patch := `{"spec":{"containers":[{"name":"` + p.Spec.Containers[0].Name + `","resources":{"requests":{"cpu":"600m","memory":"256Mi"},"limits":{"cpu":"600m","memory":"256Mi"}}}]}}`
	if _, err := pods.Patch(ctx, "start-resized", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		t.Fatal(err)
	}
	h := cgroups.Host()
	podDir := path.Join(e.agent.Config.CgroupRoot, "kubepods", "pod"+string(p.UID))
	podFile := func(controller, file string) string { return readCgroupFile(t, h.Dir(podDir, controller), file) }
	testenv.Eventually(t, 90*time.Second, "the resized app container running", func() error {
		var err error
		if p, err = pods.Get(ctx, "start-resized", metav1.GetOptions{}); err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil {
			return fmt.Errorf("app container %+v; pod cgroup quota %s, memory %s", cs, podFile("cpu", "cpu.cfs_quota_us"), podFile("memory", "memory.limit_in_bytes"))
		}
		return nil
	})
	cs := p.Status.ContainerStatuses[0]
	if q := e.cgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 60000 {
		t.Errorf("the app container's cpu.cfs_quota_us %d, want 60000", q)
	}
	if q := podFile("cpu", "cpu.cfs_quota_us"); q != "60000" {
		t.Errorf("the pod cgroup's cpu.cfs_quota_us %s under an app container with 60000: the app is capped at the old limit", q)
	}
	if m := podFile("memory", "memory.limit_in_bytes"); m != fmt.Sprint(256<<20) {
		t.Errorf("the pod cgroup's memory.limit_in_bytes %s under an app container allowed 256Mi: it is OOM-killed at the old limit", m)
	}
}
