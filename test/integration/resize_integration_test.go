package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// startResizeEnv starts the environment with a control plane that leaves the judgement of a
// resize beyond the node's allocatable to the node, as control planes before 1.37 did (the
// PodResizeValidator admission plugin refuses it at the apiserver since): the node's
// Infeasible is what a gateway sees from such a control plane.
func startResizeEnv(t *testing.T) *env {
	testenv.RequireIntegration(t)
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{Nodes: []string{node},
		ExtraAPIServerArgs: []string{"--disable-admission-plugins=PodResizeValidator"}})
	e := startEnvOn(t, testenv.RuntimeUnderTest(), false, func(c *config.Config) {
		quickBackoff(c)
		c.Kubeconfig = cp.WriteNodeKubeconfig(node)
	})
	e.cp = cp
	return e
}

// resizePod is a pod whose container asks for cpu (request, limit) and memory (request =
// limit), resized in place for CPU and by a restart for memory.
func resizePod(name, cpuReq, cpuLim, mem string) *v1.Pod {
	p := sleeperPod(name, true)
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpuReq), v1.ResourceMemory: resource.MustParse(mem)},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpuLim), v1.ResourceMemory: resource.MustParse(mem)},
	}
	p.Spec.Containers[0].ResizePolicy = []v1.ContainerResizePolicy{
		{ResourceName: v1.ResourceCPU, RestartPolicy: v1.NotRequired},
		{ResourceName: v1.ResourceMemory, RestartPolicy: v1.RestartContainer},
	}
	return p
}

// resize patches the pod's container through the pods/resize subresource, as kubectl patch
// --subresource resize does.
func (e *env) resize(t *testing.T, name, resources string) *v1.Pod {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"containers":[{"name":"main","resources":%s}]}}`, resources)
	p, err := e.cp.Admin.CoreV1().Pods("default").Patch(context.Background(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	if err != nil {
		cur, _ := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		t.Fatalf("resize %s: %v (before it: resources %+v, qosClass %s)", name, err, cur.Spec.Containers[0].Resources, cur.Status.QOSClass)
	}
	return p
}

// cgroupOf reads a file of the cgroup of the container the status names, through its task's
// /proc/<pid>/cgroup, as an int.
func (e *env) cgroupOf(t *testing.T, cs v1.ContainerStatus, file string) int64 {
	t.Helper()
	id := cs.ContainerID[strings.Index(cs.ContainerID, "://")+3:]
	n, err := strconv.ParseInt(e.cgroupFile(t, id, file), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// podCgroupOf reads a file ("cpu/cpu.cfs_quota_us") of the pod's cgroup, kubepods/<qos>/pod<uid>:
// the parent of its container cs's. A resize changes it too, or it would cap the container at
// the old limits.
func (e *env) podCgroupOf(t *testing.T, cs v1.ContainerStatus, file string) int64 {
	t.Helper()
	controller, name, _ := strings.Cut(file, "/")
	dir := e.containerCgroupDir(t, cs.ContainerID[strings.Index(cs.ContainerID, "://")+3:], controller)
	pod := filepath.Dir(dir)
	if !strings.HasPrefix(filepath.Base(pod), "pod") {
		t.Fatalf("container %s's cgroup %s is not in a pod cgroup", cs.Name, dir)
	}
	n, err := strconv.ParseInt(readCgroupFile(t, pod, name), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// cgroupInContainer reads a file of the container's own cgroup from inside it, at
// /sys/fs/cgroup/<v1> on cgroup v1 or /sys/fs/cgroup/<v2> on cgroup v2.
func (e *env) cgroupInContainer(t *testing.T, cs v1.ContainerStatus, v1File, v2File string) string {
	t.Helper()
	id := cs.ContainerID[strings.Index(cs.ContainerID, "://")+3:]
	out, err := e.exec(id, "sh", "-c", "cat /sys/fs/cgroup/"+v1File+" 2>/dev/null || cat /sys/fs/cgroup/"+v2File)
	if err != nil {
		t.Fatalf("read the container's cgroup inside it: %v: %s", err, out)
	}
	return strings.TrimSpace(out)
}

func resizeCondition(st v1.PodStatus, t v1.PodConditionType) *v1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

// waitAPIStatus waits until the pod's status in the API satisfies ok, and returns the pod.
func (e *env) waitAPIStatus(t *testing.T, name, what string, within time.Duration, ok func(*v1.Pod) error) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	testenv.Eventually(t, within, name+": "+what, func() error {
		var err error
		if p, err = e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
		}
		return ok(p)
	})
	return p
}

// resized: the pod's one container reports cpu limit, memory limit and cpu request (status
// resources and allocated resources) as given, and no resize condition is left.
func resized(cpuReq, cpuLim, mem string) func(*v1.Pod) error {
	return func(p *v1.Pod) error {
		cs := p.Status.ContainerStatuses[0]
		if cs.Resources == nil {
			return fmt.Errorf("no resources in the status")
		}
		got := fmt.Sprintf("%s/%s/%s allocated %s", cs.Resources.Requests.Cpu(), cs.Resources.Limits.Cpu(), cs.Resources.Limits.Memory(), cs.AllocatedResources.Cpu())
		want := fmt.Sprintf("%s/%s/%s allocated %s", ptr.To(resource.MustParse(cpuReq)), ptr.To(resource.MustParse(cpuLim)), ptr.To(resource.MustParse(mem)), ptr.To(resource.MustParse(cpuReq)))
		if got != want {
			return fmt.Errorf("status resources %s, want %s", got, want)
		}
		for _, c := range []v1.PodConditionType{v1.PodResizePending, v1.PodResizeInProgress} {
			if rc := resizeCondition(p.Status, c); rc != nil {
				return fmt.Errorf("condition %s %s: %s", c, rc.Reason, rc.Message)
			}
		}
		if p.Status.ObservedGeneration != p.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
		}
		return nil
	}
}

// TestInPlaceResize: a running pod resized through the pods/resize subresource, on the backend
// under test. A CPU limit raised (resizePolicy NotRequired) changes the container's cgroup in
// place: the same container, restartCount 0, the quota in its cgroup file the new one, the
// status' resources read back. Memory (RestartContainer) restarts the container with the new
// limit. A resize beyond the node's allocatable is Infeasible and changes nothing. Before,
// holdfast applied no resize and said so in an event; the issue found a restart instead.
func TestInPlaceResize(t *testing.T) {
	e := startResizeEnv(t)
	ctx := context.Background()
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, resizePod("resize", "100m", "200m", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := e.waitAPIStatus(t, "resize", "running with its resources", 90*time.Second, resized("100m", "200m", "64Mi"))
	before := p.Status.ContainerStatuses[0]
	if q := e.cgroupOf(t, before, "cpu/cpu.cfs_quota_us"); q != 20000 {
		t.Fatalf("cpu.cfs_quota_us %d before the resize, want 20000", q)
	}
	if q := e.podCgroupOf(t, before, "cpu/cpu.cfs_quota_us"); q != 20000 {
		t.Fatalf("the pod cgroup's cpu.cfs_quota_us %d before the resize, want 20000", q)
	}

	e.resize(t, "resize", `{"limits":{"cpu":"400m"}}`)
	p = e.waitAPIStatus(t, "resize", "CPU limit raised in place", 60*time.Second, resized("100m", "400m", "64Mi"))
	cs := p.Status.ContainerStatuses[0]
	if cs.ContainerID != before.ContainerID || cs.RestartCount != 0 {
		t.Errorf("after a NotRequired CPU resize: container %s restartCount %d; want %s, 0", cs.ContainerID, cs.RestartCount, before.ContainerID)
	}
	if q := e.cgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("cpu.cfs_quota_us %d after the resize, want 40000", q)
	}
	if q := e.podCgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("the pod cgroup's cpu.cfs_quota_us %d after the resize, want 40000: it caps the container at the old limit", q)
	}
	// What the upstream resize tests read, and programs sizing themselves by their limits (a
	// JVM, GOMAXPROCS): the container's own cgroup at /sys/fs/cgroup inside it, read-only, as
	// containerd's CRI plugin mounts it.
	if got := e.cgroupInContainer(t, cs, "cpu/cpu.cfs_quota_us", "cpu.max"); got != "40000" && got != "40000 100000" {
		t.Errorf("the container reads its CPU limit as %q after the resize, want 40000 (cgroup v1) or \"40000 100000\"", got)
	}
	if _, err := e.exec(cs.ContainerID[strings.Index(cs.ContainerID, "://")+3:], "sh", "-c", "f=/sys/fs/cgroup/cpu.max; [ -e $f ] || f=/sys/fs/cgroup/cpu/cpu.cfs_quota_us; v=$(cat $f); echo \"$v\" > $f"); err == nil {
		t.Errorf("the container could write its own CPU limit: /sys/fs/cgroup is not read-only inside it")
	}

	e.resize(t, "resize", `{"requests":{"memory":"96Mi"},"limits":{"memory":"96Mi"}}`)
	p = e.waitAPIStatus(t, "resize", "memory resized by a restart", 60*time.Second, func(p *v1.Pod) error {
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 1 {
			return fmt.Errorf("restartCount %d", rc)
		}
		return resized("100m", "400m", "96Mi")(p)
	})
	cs = p.Status.ContainerStatuses[0]
	if cs.ContainerID == before.ContainerID {
		t.Errorf("a RestartContainer memory resize kept the container %s", cs.ContainerID)
	}
	if m := e.cgroupOf(t, cs, "memory/memory.limit_in_bytes"); m != 96<<20 {
		t.Errorf("memory.limit_in_bytes %d after the resize, want %d", m, 96<<20)
	}
	if m := e.podCgroupOf(t, cs, "memory/memory.limit_in_bytes"); m != 96<<20 {
		t.Errorf("the pod cgroup's memory.limit_in_bytes %d after the resize, want %d", m, 96<<20)
	}
	if q := e.cgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("the restarted container's cpu.cfs_quota_us %d, want the allocated 40000", q)
	}

	restarted := cs
	e.resize(t, "resize", `{"requests":{"cpu":"500"},"limits":{"cpu":"600"}}`) // Burstable still: a QoS class change is refused
	p = e.waitAPIStatus(t, "resize", "Infeasible", 60*time.Second, func(p *v1.Pod) error {
		c := resizeCondition(p.Status, v1.PodResizePending)
		if c == nil || c.Reason != v1.PodReasonInfeasible || c.ObservedGeneration != p.Generation {
			return fmt.Errorf("PodResizePending %+v at generation %d", c, p.Generation)
		}
		if !strings.HasPrefix(c.Message, "Node didn't have enough capacity: cpu, requested: 500000") {
			return fmt.Errorf("message %q", c.Message)
		}
		return nil
	})
	cs = p.Status.ContainerStatuses[0]
	if cs.ContainerID != restarted.ContainerID || cs.RestartCount != 1 || cs.AllocatedResources.Cpu().String() != "100m" || cs.Resources.Limits.Cpu().String() != "400m" {
		t.Errorf("an infeasible resize changed the container: %s restarts %d, allocated %v, resources %v", cs.ContainerID, cs.RestartCount, cs.AllocatedResources, cs.Resources)
	}
	if q := e.cgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("cpu.cfs_quota_us %d after an infeasible resize, want 40000 still", q)
	}
}

// TestResizeSurvivesOfflineReboot: a resize deferred (the node's CPU allocated to another pod)
// is kept as it was through a reboot with the apiserver out of reach: the agent boots from its
// state alone, and the container starts again with the resources allocated to it, not with
// the spec's desired ones it reads first, the resize still Deferred. Once the apiserver
// answers and the other pod is deleted, the resize is allocated and applied in place.
func TestResizeSurvivesOfflineReboot(t *testing.T) {
	e := startResizeEnv(t)
	ctx := context.Background()
	n := e.waitNodeReady(t)
	allocatable := n.Status.Allocatable.Cpu().MilliValue()
	big := fmt.Sprintf("%dm", allocatable-500)
	pods := e.cp.Admin.CoreV1().Pods("default")
	for _, p := range []*v1.Pod{resizePod("big", big, big, "32Mi"), resizePod("small", "400m", "400m", "32Mi")} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAPIStatus(t, "big", "running", 90*time.Second, resized(big, big, "32Mi"))
	e.waitAPIStatus(t, "small", "running", 90*time.Second, resized("400m", "400m", "32Mi"))

	e.resize(t, "small", `{"requests":{"cpu":"800m"},"limits":{"cpu":"800m"}}`)
	deferred := func(st v1.PodStatus) error {
		c := resizeCondition(st, v1.PodResizePending)
		if c == nil || c.Reason != v1.PodReasonDeferred || !strings.HasPrefix(c.Message, "Node didn't have enough resource: cpu") {
			return fmt.Errorf("PodResizePending %+v", c)
		}
		if a := st.ContainerStatuses[0].AllocatedResources.Cpu().String(); a != "400m" {
			return fmt.Errorf("allocated cpu %s", a)
		}
		return nil
	}
	p := e.waitAPIStatus(t, "small", "Deferred", 60*time.Second, func(p *v1.Pod) error { return deferred(p.Status) })
	if q := e.cgroupOf(t, p.Status.ContainerStatuses[0], "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Fatalf("a deferred resize was applied: cpu.cfs_quota_us %d", q)
	}
	before := p.Status.ContainerStatuses[0]

	e.cp.Stop()
	testenv.Reboot(e.cd, e.agent)
	e.agent.Start()
	var after v1.ContainerStatus
	testenv.Eventually(t, 90*time.Second, "small running again after the offline reboot, its resize still deferred", func() error {
		p, err := e.localPod("small")
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil || p.Status.ContainerStatuses[0].ContainerID == before.ContainerID {
			return fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
		}
		after = p.Status.ContainerStatuses[0]
		return deferred(p.Status)
	})
	if q := e.cgroupOf(t, after, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("after the offline reboot the container runs with cpu.cfs_quota_us %d, want its allocation's 40000", q)
	}

	e.cp.Start()
	if err := pods.Delete(ctx, "big", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	p = e.waitAPIStatus(t, "small", "resized once big is gone", 120*time.Second, resized("800m", "800m", "32Mi"))
	if cs := p.Status.ContainerStatuses[0]; cs.ContainerID != after.ContainerID {
		t.Errorf("the deferred resize restarted the container: %s, was %s", cs.ContainerID, after.ContainerID)
	}
	if q := e.cgroupOf(t, p.Status.ContainerStatuses[0], "cpu/cpu.cfs_quota_us"); q != 80000 {
		t.Errorf("cpu.cfs_quota_us %d once allocated, want 80000", q)
	}
}

// TestResizeRegularInitContainer: a running regular init container (not a sidecar) resized
// through pods/resize, as the upstream "should support resizing a non-sidecar init container"
// does: the apiserver accepts it only from a node that declares
// InPlacePodVerticalScalingInitContainers, and the container's cgroup and the pod's take the
// new CPU and memory limits in place, the same container, restartCount 0, its status reporting
// them. Before, the node did not declare the feature and the apiserver refused the patch.
func TestResizeRegularInitContainer(t *testing.T) {
	e := startResizeEnv(t)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	p := resizePod("resize-init", "100m", "100m", "64Mi")
	p.Spec.InitContainers = []v1.Container{*p.Spec.Containers[0].DeepCopy()}
	p.Spec.InitContainers[0].Name = "init"
	p.Spec.InitContainers[0].ResizePolicy = nil // RestartContainer is refused for a regular init container
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	initStatus := func(cpu, mem string) func() error {
		return func() error {
			var err error
			if p, err = pods.Get(ctx, "resize-init", metav1.GetOptions{}); err != nil {
				return err
			}
			if len(p.Status.InitContainerStatuses) != 1 || p.Status.InitContainerStatuses[0].State.Running == nil {
				return fmt.Errorf("init container statuses %+v", p.Status.InitContainerStatuses)
			}
			cs := p.Status.InitContainerStatuses[0]
			if cs.Resources == nil || cs.Resources.Limits.Cpu().String() != cpu || cs.Resources.Limits.Memory().String() != mem || cs.AllocatedResources.Cpu().String() != cpu {
				return fmt.Errorf("init container resources %+v, allocated %v; want %s, %s", cs.Resources, cs.AllocatedResources, cpu, mem)
			}
			for _, c := range []v1.PodConditionType{v1.PodResizePending, v1.PodResizeInProgress} {
				if rc := resizeCondition(p.Status, c); rc != nil {
					return fmt.Errorf("condition %s %s: %s", c, rc.Reason, rc.Message)
				}
			}
			return nil
		}
	}
	testenv.Eventually(t, 90*time.Second, "the init container runs with 100m", initStatus("100m", "64Mi"))
	before := p.Status.InitContainerStatuses[0]

	patch := `{"spec":{"initContainers":[{"name":"init","resources":{"requests":{"cpu":"400m","memory":"96Mi"},"limits":{"cpu":"400m","memory":"96Mi"}}}]}}`
	if _, err := pods.Patch(ctx, "resize-init", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize"); err != nil {
		t.Fatalf("resize the init container: %v", err)
	}
	testenv.Eventually(t, 60*time.Second, "the init container resized in place", initStatus("400m", "96Mi"))
	cs := p.Status.InitContainerStatuses[0]
	if cs.ContainerID != before.ContainerID || cs.RestartCount != 0 {
		t.Errorf("after the resize: container %s restartCount %d; want %s, 0", cs.ContainerID, cs.RestartCount, before.ContainerID)
	}
	if q := e.cgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("the init container's cpu.cfs_quota_us %d, want 40000", q)
	}
	if m := e.cgroupOf(t, cs, "memory/memory.limit_in_bytes"); m != 96<<20 {
		t.Errorf("the init container's memory.limit_in_bytes %d, want %d", m, 96<<20)
	}
	// The pod's limits are the larger of its init containers' and its app containers' sum.
	if q := e.podCgroupOf(t, cs, "cpu/cpu.cfs_quota_us"); q != 40000 {
		t.Errorf("the pod cgroup's cpu.cfs_quota_us %d, want 40000: it caps the init container at the old limit", q)
	}
	if m := e.podCgroupOf(t, cs, "memory/memory.limit_in_bytes"); m != 96<<20 {
		t.Errorf("the pod cgroup's memory.limit_in_bytes %d, want %d: it caps the init container at the old limit", m, 96<<20)
	}
}

// TestUnalignedMemoryLimitIsHeld: a memory limit that is not a whole number of pages ("100M",
// as users write it) is held by a cgroup rounded down to a page, on cgroup v1 and v2 alike.
// The resize machinery compared it byte for byte with the allocation: every sync saw a resize
// to apply, PodResizeInProgress never ended, and with resizePolicy RestartContainer for
// memory the container was restarted again and again. Watched over a few syncs: the
// container keeps running, its status reports the limit as written, no resize in progress.
func TestUnalignedMemoryLimitIsHeld(t *testing.T) {
	e := startResizeEnv(t)
	ctx := context.Background()
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, resizePod("unaligned", "100m", "200m", "100M"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIStatus(t, "unaligned", "running with its resources", 90*time.Second, resized("100m", "200m", "100M"))
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		p, err := e.cp.Admin.CoreV1().Pods("default").Get(ctx, "unaligned", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rc := resizeCondition(p.Status, v1.PodResizeInProgress); rc != nil {
			t.Fatalf("a pod never resized is in resize: %+v", rc)
		}
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 0 || cs[0].State.Running == nil {
			t.Fatalf("the container restarted or stopped: %+v", cs)
		}
		if err := resized("100m", "200m", "100M")(p); err != nil {
			t.Fatal(err)
		}
	}
}
