package integration

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// cgroupValue reads a file of the cgroup at p (a path in the hierarchy) for controller.
func cgroupValue(t *testing.T, h cgroups.Hierarchy, p, controller, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Dir(p, controller), file))
	if err != nil {
		t.Fatalf("read cgroup file: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// wantSettings are a pod cgroup's settings as the kubelet would write them, per hierarchy.
func wantSettings(h cgroups.Hierarchy, shares uint64, quota, memory int64) map[[2]string]string {
	if h.Mode == cgroups.Unified {
		q, m := "max", "max"
		if quota > 0 {
			q = strconv.FormatInt(quota, 10)
		}
		if memory > 0 {
			m = strconv.FormatInt(memory, 10)
		}
		return map[[2]string]string{
			{"cpu", "cpu.weight"}:    strconv.FormatUint(cgroups.SharesToWeight(shares), 10),
			{"cpu", "cpu.max"}:       q + " 100000",
			{"memory", "memory.max"}: m,
		}
	}
	out := map[[2]string]string{{"cpu", "cpu.shares"}: strconv.FormatUint(shares, 10), {"cpu", "cpu.cfs_quota_us"}: strconv.FormatInt(max(quota, -1), 10)}
	if memory > 0 {
		out[[2]string{"memory", "memory.limit_in_bytes"}] = strconv.FormatInt(memory, 10)
	}
	return out
}

// TestPodCgroups: a Guaranteed, a Burstable and a BestEffort pod land in
// kubepods/[<qos>/]pod<uid>/, their containers below, with the kubelet's values read back from
// the cgroup files (pod, QoS levels), and each pod's cgroup goes with the pod.
func TestPodCgroups(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	h := cgroups.Host()
	root := e.agent.Config.CgroupRoot

	guaranteed := sleeperPod("guaranteed", false)
	guaranteed.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("200m"), v1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("200m"), v1.ResourceMemory: resource.MustParse("64Mi")},
	}
	burstable := sleeperPod("burstable", false)
	burstable.Spec.Containers[0].Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("300m"), v1.ResourceMemory: resource.MustParse("96Mi")},
	}
	besteffort := sleeperPod("besteffort", false)
	for _, p := range []*v1.Pod{guaranteed, burstable, besteffort} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, "guaranteed", "burstable", "besteffort")
	kubepods := path.Join(root, "kubepods")
	for _, tt := range []struct {
		name, qosDir  string
		shares        uint64
		quota, memory int64
	}{
		{"guaranteed", "", 204, 20000, 64 << 20},
		{"burstable", "burstable", 102, 30000, 96 << 20},
		{"besteffort", "besteffort", 2, -1, 0},
	} {
		p := running[tt.name]
		podDir := path.Join(kubepods, tt.qosDir, "pod"+string(p.UID))
		id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
		for _, controller := range []string{"cpu", "memory", "pids"} {
			dir, err := h.ProcessDir(e.taskPid(t, id), controller)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(dir) != h.Dir(podDir, controller) {
				t.Errorf("%s: container's %s cgroup %s, want one below %s", tt.name, controller, dir, h.Dir(podDir, controller))
			}
		}
		for f, want := range wantSettings(h, tt.shares, tt.quota, tt.memory) {
			if got := cgroupValue(t, h, podDir, f[0], f[1]); got != want {
				t.Errorf("%s: pod cgroup %s = %s, want %s", tt.name, f[1], got, want)
			}
		}
	}
	// kubepods: the node's PIDs (no pid reserved here), as the kubelet's internal capacity.
	if got, want := cgroupValue(t, h, kubepods, "pids", "pids.max"), strconv.FormatInt(eviction.PIDLimit("/proc"), 10); got != want {
		t.Errorf("kubepods pids.max = %s, want %s", got, want)
	}
	// The QoS levels: burstable the shares of the burstable pods' requests, besteffort 2.
	for f, want := range wantSettings(h, 102, -1, 0) {
		if f[0] == "cpu" && f[1] != "cpu.shares" && f[1] != "cpu.weight" {
			continue
		}
		if got := cgroupValue(t, h, path.Join(kubepods, "burstable"), f[0], f[1]); got != want {
			t.Errorf("burstable level %s = %s, want %s", f[1], got, want)
		}
	}
	shares := "cpu.shares"
	if h.Mode == cgroups.Unified {
		shares = "cpu.weight"
	}
	if got, want := cgroupValue(t, h, path.Join(kubepods, "besteffort"), "cpu", shares), wantSettings(h, 2, -1, 0)[[2]string{"cpu", shares}]; got != want {
		t.Errorf("besteffort level %s = %s, want %s", shares, got, want)
	}

	// A pod's cgroup goes with it, from every hierarchy.
	if err := pods.Delete(ctx, "burstable", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := path.Join(kubepods, "burstable", "pod"+string(running["burstable"].UID))
	testenv.Eventually(t, 60*time.Second, "the deleted pod's cgroup removed", func() error {
		for _, c := range []string{"cpu", "memory", "pids", "freezer", "devices"} {
			if h.Mode == cgroups.Unified && c != "cpu" {
				continue
			}
			if _, err := os.Stat(h.Dir(gone, c)); !os.IsNotExist(err) {
				return fmt.Errorf("%s still there (%v)", h.Dir(gone, c), err)
			}
		}
		return nil
	})
	// And the burstable level no longer counts its request.
	testenv.Eventually(t, 10*time.Second, "burstable level back to 2 shares", func() error {
		want := wantSettings(h, 2, -1, 0)[[2]string{"cpu", shares}]
		if got := cgroupValue(t, h, path.Join(kubepods, "burstable"), "cpu", shares); got != want {
			return fmt.Errorf("%s = %s, want %s", shares, got, want)
		}
		return nil
	})
}

// TestNodeAllocatableOOM (issue 29 item 6): on a node whose allocatable memory is set small,
// a pod with no limit of its own that allocates past it is OOM-killed inside kubepods, while
// the agent runs on, its Lease renews and another pod carries on.
func TestNodeAllocatableOOM(t *testing.T) {
	memTotal := hostMemTotal(t)
	const kubepodsMemory = 160 << 20
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.KubeReserved = map[string]string{"memory": strconv.FormatInt(memTotal-kubepodsMemory, 10)}
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	h := cgroups.Host()
	kubepods := path.Join(e.agent.Config.CgroupRoot, "kubepods")
	file, want := "memory.limit_in_bytes", strconv.Itoa(kubepodsMemory)
	if h.Mode == cgroups.Unified {
		file = "memory.max"
	}
	steady := sleeperPod("steady", false)
	hog := sleeperPod("hog", false)
	hog.Spec.RestartPolicy = v1.RestartPolicyNever
	hog.Spec.Containers[0] = step("main", "head -c 400m /dev/zero | tail")
	if _, err := pods.Create(ctx, steady, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "steady")
	if got := cgroupValue(t, h, kubepods, "memory", file); got != want {
		t.Fatalf("kubepods %s = %s, want the allocatable %s", file, got, want)
	}
	leases := e.cp.Admin.CoordinationV1().Leases("kube-node-lease")
	before, err := leases.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the hog OOM-killed", func() error {
		p, err := pods.Get(ctx, "hog", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || p.Status.Phase != v1.PodFailed {
			return fmt.Errorf("phase %s terminated %+v", p.Status.Phase, term)
		}
		if term.ExitCode != 137 || term.Reason != "OOMKilled" {
			return fmt.Errorf("exit code %d, reason %s; want 137, OOMKilled", term.ExitCode, term.Reason)
		}
		return nil
	})
	// The kill was kubepods' OOM: its memory limit was hit, not the host's.
	failFile := "memory.failcnt"
	if h.Mode == cgroups.Unified {
		failFile = "memory.events"
	}
	if got := cgroupValue(t, h, kubepods, "memory", failFile); got == "0" || (h.Mode == cgroups.Unified && !strings.Contains(got, "oom_kill ") || strings.Contains(got, "oom_kill 0")) {
		t.Errorf("kubepods %s = %q: its limit was never hit", failFile, got)
	}
	// The agent, its Lease and the other pod carried on.
	testenv.Eventually(t, 30*time.Second, "the Lease renewed after the OOM kill", func() error {
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !l.Spec.RenewTime.After(before.Spec.RenewTime.Time) {
			return fmt.Errorf("renewTime %s not after %s", l.Spec.RenewTime, before.Spec.RenewTime)
		}
		return nil
	})
	p, err := pods.Get(ctx, "steady", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("steady pod: phase %s, container %+v", p.Status.Phase, p.Status.ContainerStatuses[0])
	}
	if _, err := e.localPod("steady"); err != nil {
		t.Errorf("the agent does not answer on its socket: %v", err)
	}
}

func hostMemTotal(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// TestPodCgroupsAdoption: a pod started by an agent without pod cgroups (before the upgrade,
// cgroupsPerQOS false) keeps running, the same container, when the agent comes back with
// them: nothing restarts or kills it for being outside kubepods, and its next container (a
// restart of its own) is made in its pod cgroup.
func TestPodCgroupsAdoption(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.CgroupsPerQOS, c.EnforceNodeAllocatable = ptr.To(false), []string{"none"}
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	h := cgroups.Host()
	old := sleeperPod("old", false)
	old.Spec.Containers[0] = step("main", "exec sleep 1000000")
	if _, err := pods.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.waitAPIRunning(t, "old")["old"]
	oldID := strings.TrimPrefix(before.Status.ContainerStatuses[0].ContainerID, "containerd://")
	pid := e.taskPid(t, oldID)

	e.agent.Kill()
	e.agent.Config.CgroupsPerQOS, e.agent.Config.EnforceNodeAllocatable = ptr.To(true), nil
	e.agent.Start()
	podDir := path.Join(e.agent.Config.CgroupRoot, "kubepods", "besteffort", "pod"+string(before.UID))
	testenv.Eventually(t, 60*time.Second, "the upgraded agent made the pod's cgroup", func() error {
		if !h.Exists(podDir) {
			return fmt.Errorf("%s not made", podDir)
		}
		return nil
	})
	// Settled: a few syncs later the old container still runs, untouched.
	time.Sleep(5 * time.Second)
	p, err := pods.Get(ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.ContainerID != before.Status.ContainerStatuses[0].ContainerID || cs.RestartCount != 0 || cs.State.Running == nil {
		t.Fatalf("the pre-upgrade container was not left running: %+v", cs)
	}
	if got := e.taskPid(t, oldID); got != pid {
		t.Fatalf("its process changed: %d, was %d", got, pid)
	}

	// Its next container, after its own exit, lands in the pod cgroup.
	if err := syscallKill(pid); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the restarted container in the pod cgroup", func() error {
		p, err := pods.Get(ctx, "old", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cs := p.Status.ContainerStatuses[0]
		if cs.RestartCount < 1 || cs.State.Running == nil {
			return fmt.Errorf("restartCount %d, state %+v", cs.RestartCount, cs.State)
		}
		dir, err := h.ProcessDir(e.taskPid(t, strings.TrimPrefix(cs.ContainerID, "containerd://")), "memory")
		if err != nil {
			return err
		}
		if filepath.Dir(dir) != h.Dir(podDir, "memory") {
			return fmt.Errorf("restarted container in %s, want below %s", dir, h.Dir(podDir, "memory"))
		}
		return nil
	})
}

func syscallKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
