package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// guaranteedPod is a sleeper whose requests equal its limits.
func guaranteedPod(name string) *v1.Pod {
	p := sleeperPod(name, true)
	rl := v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("64Mi")}
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl, Limits: rl}
	return p
}

// hogPod is a BestEffort pod whose container writes size MiB into an emptyDir volume (medium
// Memory: it holds memory; disk: it fills the node file system), says "filled" and sleeps.
func hogPod(name string, medium v1.StorageMedium, mib int) *v1.Pod {
	p := sleeperPod(name, true)
	p.Spec.Volumes = []v1.Volume{{Name: "fill", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: medium}}}}
	p.Spec.Containers[0] = step(name, fmt.Sprintf("dd if=/dev/zero of=/fill/data bs=1M count=%d 2>&1; echo filled; exec sleep 3600", mib))
	p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "fill", MountPath: "/fill"}}
	return p
}

// memAvailable is the kernel's MemAvailable, what holdfast observes as memory.available.
func memAvailable(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// waitNodeCondition waits until the node's condition is True.
func (e *env) waitNodeCondition(t *testing.T, c v1.NodeConditionType) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, "node condition "+string(c), func() error {
		n, err := e.cp.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == c && cond.Status == v1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", n.Status.Conditions)
	})
}

// requireEvictedEvent checks the Evicted event on the pod carries the pod's message.
func (e *env) requireEvictedEvent(t *testing.T, p *v1.Pod) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "Evicted event of "+p.Name, func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",reason=Evicted"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == v1.EventTypeWarning && ev.Message == p.Status.Message {
				return nil
			}
		}
		return fmt.Errorf("events %+v", evs.Items)
	})
}

// TestEvictionMemoryPressure: a BestEffort pod holding memory in a real containerd is
// evicted when memory.available drops below the hard threshold: it ends Failed with reason
// Evicted and kubelet's message, with an Evicted event; the node reports MemoryPressure and
// refuses new BestEffort pods; the Guaranteed pod beside it runs on untouched.
//
// The machine is shared and its free memory moves with other work (builds, VMs: a run with
// 1Gi margins saw it move by more than 1Gi), so the threshold is set from what is available
// once the hog holds its memory: half the hog above it. The hog's 6Gi put the node 3Gi below
// the threshold, and evicting it puts the node 3Gi above.
func TestEvictionMemoryPressure(t *testing.T) {
	const hogMiB = 6 << 10
	e := startEnv(t, true, func(c *config.Config) {
		c.EvictionMonitoringPeriod = config.D(time.Second)
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	for _, p := range []*v1.Pod{guaranteedPod("steady"), hogPod("hog", v1.StorageMediumMemory, hogMiB)} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, "steady", "hog")
	testenv.Eventually(t, 2*time.Minute, "the hog holds its memory", func() error {
		if out := e.podLog(t, running["hog"], "hog"); !strings.Contains(out, "filled") {
			return fmt.Errorf("log %q", out)
		}
		return nil
	})
	if strings.Contains(e.podLog(t, running["hog"], "hog"), "No space") {
		t.Fatalf("the hog could not fill its memory volume: %s", e.podLog(t, running["hog"], "hog"))
	}

	threshold := memAvailable(t) + hogMiB<<20/2
	e.agent.Stop()
	e.agent.Config.EvictionHard["memory.available"] = strconv.FormatInt(threshold, 10)
	e.agent.Start()

	hog := e.waitFailed(t, "hog", "Evicted", 2*time.Minute)
	wantPrefix := fmt.Sprintf("The node was low on resource: memory. Threshold quantity: %d, available: ", threshold)
	if !strings.HasPrefix(hog.Status.Message, wantPrefix) || !strings.Contains(hog.Status.Message, ". Container hog was using ") ||
		!strings.HasSuffix(hog.Status.Message, ", request is 0, has larger consumption of memory. ") {
		t.Errorf("message %q\nwant kubelet's: %q...Container hog was using ..., request is 0, has larger consumption of memory. ", hog.Status.Message, wantPrefix)
	}
	e.requireEvictedEvent(t, hog)
	if cs := hog.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil {
		t.Errorf("the hog's container is not reported terminated: %+v", cs)
	}
	e.waitNodeCondition(t, v1.NodeMemoryPressure)

	// Under MemoryPressure a new BestEffort pod is refused as kubelet refuses it.
	if _, err := pods.Create(ctx, sleeperPod("late", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	late := e.waitFailed(t, "late", "Evicted", 90*time.Second)
	if late.Status.Message != "Pod was rejected: The node had condition: [MemoryPressure]. " {
		t.Errorf("late: message %q", late.Status.Message)
	}
	e.requireUntouched(t, "steady")
}

// TestEvictionDiskPressure: with the agent's state directory (the node file system, where
// pod volumes live) on a small file system, a BestEffort pod filling its emptyDir is evicted
// once nodefs.available drops below 10%, while the Guaranteed pod beside it runs on; the node
// reports DiskPressure and refuses every new pod. Before that, allocatable leaves out
// systemReserved, kubeReserved and the hard thresholds, and a pod that fits the capacity but
// not allocatable is refused with OutOfmemory or OutOfcpu.
func TestEvictionDiskPressure(t *testing.T) {
	var memTotal int64
	e := startEnv(t, true, func(c *config.Config) {
		if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", c.StateDir, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
			t.Fatalf("mount a small node file system: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(c.StateDir, unix.MNT_DETACH) })
		c.EvictionMonitoringPeriod = config.D(time.Second)
		c.EvictionHard["nodefs.available"] = "10%" // the kubelet's default, which testenv lowers
		// Allocatable memory: 1Gi (the capacity less 100Mi of memory.available and the rest
		// reserved); cpu: 500m.
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			t.Fatal(err)
		}
		memTotal = int64(si.Totalram) * int64(si.Unit)
		c.SystemReserved = map[string]string{"cpu": fmt.Sprintf("%dm", goruntime.NumCPU()*1000-500), "memory": "256Mi"}
		c.KubeReserved = map[string]string{"memory": strconv.FormatInt(memTotal-(1<<30)-(256<<20)-(100<<20), 10)}
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	testenv.Eventually(t, 90*time.Second, "node allocatable", func() error {
		n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		capMem := n.Status.Capacity[v1.ResourceMemory]
		mem, cpu := n.Status.Allocatable[v1.ResourceMemory], n.Status.Allocatable[v1.ResourceCPU]
		if want := capMem.Value() - (memTotal - (1 << 30)); mem.Value() != want || cpu.MilliValue() != 500 {
			return fmt.Errorf("allocatable memory %d (want %d), cpu %dm (want 500m)", mem.Value(), want, cpu.MilliValue())
		}
		return nil
	})
	tooMuchMemory, tooMuchCPU := guaranteedPod("too-much-memory"), guaranteedPod("too-much-cpu")
	tooMuchMemory.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = resource.MustParse("2Gi")
	tooMuchMemory.Spec.Containers[0].Resources.Limits[v1.ResourceMemory] = resource.MustParse("2Gi")
	tooMuchCPU.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("1")
	tooMuchCPU.Spec.Containers[0].Resources.Limits[v1.ResourceCPU] = resource.MustParse("1")
	for _, p := range []*v1.Pod{tooMuchMemory, tooMuchCPU} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if p := e.waitFailed(t, "too-much-memory", "OutOfmemory", 90*time.Second); !strings.Contains(p.Status.Message, "requested: 2147483648") {
		t.Errorf("too-much-memory: %q", p.Status.Message)
	}
	if p := e.waitFailed(t, "too-much-cpu", "OutOfcpu", 90*time.Second); !strings.Contains(p.Status.Message, "requested: 1000, used: 0, capacity: 500") {
		t.Errorf("too-much-cpu: %q", p.Status.Message)
	}

	for _, p := range []*v1.Pod{guaranteedPod("steady"), hogPod("filler", "", 60)} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	filler := e.waitFailed(t, "filler", "Evicted", 3*time.Minute)
	if want := "The node was low on resource: ephemeral-storage. Threshold quantity: "; !strings.HasPrefix(filler.Status.Message, want) {
		t.Errorf("message %q, want kubelet's %q...", filler.Status.Message, want)
	}
	e.requireEvictedEvent(t, filler)
	e.waitNodeCondition(t, v1.NodeDiskPressure)

	// Under DiskPressure every new pod is refused, Guaranteed or not.
	if _, err := pods.Create(ctx, guaranteedPod("late"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	late := e.waitFailed(t, "late", "Evicted", 90*time.Second)
	if late.Status.Message != "Pod was rejected: The node had condition: [DiskPressure]. " {
		t.Errorf("late: message %q", late.Status.Message)
	}
	e.waitAPIRunning(t, "steady")
	e.requireUntouched(t, "steady")
	var st unix.Statfs_t
	if err := unix.Statfs(e.agent.Config.StateDir, &st); err == nil && st.Bavail*uint64(st.Bsize) < 10<<20 {
		t.Errorf("the filler's volume was not released: %d bytes free on the node file system", st.Bavail*uint64(st.Bsize))
	}
}
