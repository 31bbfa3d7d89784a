package integration

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// podLevelPod is a pod as a user writes it with pod-level resources (issue 29 item 3): the
// resources on the pod, none on its containers (busybox running script), the service account
// token mounted, the API's defaults.
func podLevelPod(name string, requests, limits v1.ResourceList, scripts ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{NodeName: node,
		Resources: &v1.ResourceRequirements{Requests: requests, Limits: limits}}}
	for i, s := range scripts {
		p.Spec.Containers = append(p.Spec.Containers, step(fmt.Sprintf("c%d", i), s))
	}
	return p
}

func cpuMemory(cpu, memory string) v1.ResourceList {
	l := v1.ResourceList{}
	if cpu != "" {
		l[v1.ResourceCPU] = resource.MustParse(cpu)
	}
	if memory != "" {
		l[v1.ResourceMemory] = resource.MustParse(memory)
	}
	return l
}

// TestPodLevelResources: a pod with pod-level resources is admitted (it was refused as
// UnsupportedPodSpec), lands in the cgroup of the QoS class its pod-level resources give, and
// its pod cgroup holds the pod-level limits (ResourceConfigForPod); its containers, without
// limits of their own, run with the pod's, as the kubelet gives them. Then the pod cgroup
// bounds the pod as a whole: three containers holding 24Mi each, each well below the 64Mi of
// the pod, are more than it together, and the pod cgroup's OOM kills one.
func TestPodLevelResources(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	publishRootCA(t, e, "default")
	h := cgroups.Host()
	kubepods := path.Join(e.agent.Config.CgroupRoot, "kubepods")

	guaranteed := podLevelPod("plr", cpuMemory("200m", "96Mi"), cpuMemory("200m", "96Mi"), "sleep 1000000", "sleep 1000000")
	if _, err := pods.Create(ctx, guaranteed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := e.waitAPIRunning(t, "plr")["plr"]
	if p.Status.QOSClass != v1.PodQOSGuaranteed {
		t.Fatalf("the API says QoS class %s; want Guaranteed from the pod-level resources", p.Status.QOSClass)
	}
	podDir := path.Join(kubepods, "pod"+string(p.UID))
	for f, want := range wantSettings(h, 204, 20000, 96<<20) {
		if got := cgroupValue(t, h, podDir, f[0], f[1]); got != want {
			t.Errorf("pod cgroup %s = %s, want %s", f[1], got, want)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		id := strings.TrimPrefix(cs.ContainerID, "containerd://")
		if dir := e.containerCgroupDir(t, id, "memory"); path.Dir(dir) != h.Dir(podDir, "memory") {
			t.Errorf("container %s in %s, want below %s", cs.Name, dir, h.Dir(podDir, "memory"))
		}
		if h.Mode != cgroups.Unified {
			if got := e.cgroupFile(t, id, "memory/memory.limit_in_bytes"); got != strconv.Itoa(96<<20) {
				t.Errorf("container %s memory.limit_in_bytes = %s, want the pod's %d", cs.Name, got, 96<<20)
			}
			if got := e.cgroupFile(t, id, "cpu/cpu.cfs_quota_us"); got != "20000" {
				t.Errorf("container %s cpu.cfs_quota_us = %s, want the pod's 20000", cs.Name, got)
			}
		}
	}

	// Together past the pod's limit. Each sh holds its 24Mi in a variable and sleeps.
	const hold = `x=$(head -c 24m /dev/zero | tr '\0' a); echo held; sleep 1000000`
	shared := podLevelPod("plr-shared", nil, cpuMemory("", "64Mi"), hold, hold, hold)
	shared.Spec.RestartPolicy = v1.RestartPolicyNever
	if _, err := pods.Create(ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var uid string
	testenv.Eventually(t, 120*time.Second, "a container of the pod OOM-killed in its pod cgroup", func() error {
		p, err := pods.Get(ctx, "plr-shared", metav1.GetOptions{})
		if err != nil {
			return err
		}
		uid = string(p.UID)
		if p.Status.QOSClass != v1.PodQOSBurstable {
			return fmt.Errorf("QoS class %q, want Burstable", p.Status.QOSClass)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if term := cs.State.Terminated; term != nil && term.ExitCode == 137 && term.Reason == "OOMKilled" {
				return nil
			}
		}
		return fmt.Errorf("no container OOM-killed: %s", podStatusSummary(ctx, e, "plr-shared"))
	})
	podDir = path.Join(kubepods, "burstable", "pod"+uid)
	file := "memory.limit_in_bytes"
	if h.Mode == cgroups.Unified {
		file = "memory.max"
	}
	if got := cgroupValue(t, h, podDir, "memory", file); got != strconv.Itoa(64<<20) {
		t.Errorf("pod cgroup %s = %s, want %d", file, got, 64<<20)
	}
	// The pod's limit was hit, not a container's alone: none holds more than half of it.
	failFile := "memory.failcnt"
	if h.Mode == cgroups.Unified {
		failFile = "memory.events"
	}
	if got := cgroupValue(t, h, podDir, "memory", failFile); got == "0" || h.Mode == cgroups.Unified && strings.Contains(got, "oom_kill 0") {
		t.Errorf("pod cgroup %s = %q: its limit was never hit", failFile, got)
	}
}
