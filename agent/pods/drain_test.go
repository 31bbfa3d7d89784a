package pods_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
)

func drainingPod(uid string, grace int64) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "drain-" + uid, UID: types.UID(uid)},
		Spec: v1.PodSpec{NodeName: "gw", TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{{Name: "app", Image: "busybox", Command: []string{"sh", "-c", "trap '' TERM; sleep 3600"},
				ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}, PeriodSeconds: 1}}}},
	}
}

func deleted(pod *v1.Pod, grace int64) *v1.Pod {
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &grace
	return pod
}

// A pod whose source says it is Failed (PodGC marks a pod of a node that was away Failed,
// then deletes it; another writer set its phase) and that is deleted while its containers
// run keeps that phase while it drains, as the kubelet's generateAPIPodStatus keeps a
// terminal phase of the API or the status manager: a phase never goes back from Failed.
// reportDraining computes the status of a running pod and records Running over it (the status
// manager keeps the API's phase only in the patch of an API pod: the node API's /pods, the
// offline outbox and a static pod's mirror get Running).
func TestDrainKeepsTerminalPhase(t *testing.T) {
	n, failing := drainingNode(t, nil)
	n.rt.SetTermWait(func(time.Duration) time.Duration { return 4 * time.Second })
	pod := drainingPod("failed-drain", 30)
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "ready", func(st v1.PodStatus) bool { return st.Phase == v1.PodRunning && isReady(st) })

	gone := deleted(pod, 30)
	gone.Status = v1.PodStatus{Phase: v1.PodFailed, Reason: "NodeLost", Message: "marked Failed by PodGC"}
	failing.Store(true)
	n.mgr.Update(gone)
	// The container ignores SIGTERM for 4 s: a status reported meanwhile (unready: its
	// readiness fails) is the drain's.
	st := n.waitStatus(t, pod, "unready while it drains", func(st v1.PodStatus) bool { return !isReady(st) })
	if !n.running(t)[pod.UID] {
		t.Fatal("the pod's container stopped before the drain was seen")
	}
	if st.Phase != v1.PodFailed {
		t.Errorf("while it drains, a pod its source says Failed is reported %s (reason %q)", st.Phase, st.Reason)
	}
}

// drainingNode starts a node whose probes pass until failing is set, as a server's readiness
// fails once it drains its connections.
func drainingNode(t *testing.T, admitter pods.Admitter) (n *hollowNode, failing *atomic.Bool) {
	t.Helper()
	failing = new(atomic.Bool)
	n = &hollowNode{rt: hollow.NewRuntime(),
		probes: prober.HandlerFunc(func(context.Context, prober.Target) (prober.Outcome, string, error) {
			if failing.Load() {
				return prober.Failure, "draining", nil
			}
			return prober.Success, "", nil
		})}
	return startReady(t, n, admitter), failing
}

func isReady(st v1.PodStatus) bool {
	for _, c := range st.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// The final status of a deleted pod reports the termination message of a container that
// exited before the deletion, as the status before it did (and as the kubelet, which reads
// the message of every exited container it lists). terminate computes the final status
// without the messages read, and lists without recording the exits first (92ab780 says every
// listing goes through observe): the message "bye", reported while the pod ran, is erased.
func TestFinalStatusKeepsTerminationMessage(t *testing.T) {
	n := startHollowNode(t)
	grace := int64(1)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "msg", UID: "msg"},
		Spec: v1.PodSpec{NodeName: "gw", RestartPolicy: v1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{
				{Name: "app", Image: "busybox", Command: []string{"sleep", "3600"}, TerminationMessagePath: "/dev/termination-log"},
				{Name: "other", Image: "busybox", Command: []string{"sleep", "3600"}},
			}},
	}
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "running", func(st v1.PodStatus) bool {
		return st.Phase == v1.PodRunning && len(st.ContainerStatuses) == 2 && st.ContainerStatuses[0].State.Running != nil
	})
	path := filepath.Join(n.stateDir, "pods", string(pod.UID), "containers", "app", "0.termination-log")
	if err := os.WriteFile(path, []byte("bye"), 0o666); err != nil {
		t.Fatal(err)
	}
	cs, _ := n.rt.ListPod(context.Background(), string(pod.UID))
	for _, c := range cs {
		if c.Name == "app" && c.State == runtime.StateRunning {
			if err := n.rt.StopContainer(context.Background(), c.ID, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	n.waitStatus(t, pod, "app's message", func(st v1.PodStatus) bool {
		return len(st.ContainerStatuses) == 2 && st.ContainerStatuses[0].State.Terminated != nil && st.ContainerStatuses[0].State.Terminated.Message == "bye"
	})
	n.mgr.Update(deleted(pod, 1))
	st := n.waitStatus(t, pod, "final", func(st v1.PodStatus) bool { return st.Phase == v1.PodFailed || st.Phase == v1.PodSucceeded })
	if got := st.ContainerStatuses[0].State.Terminated; got == nil || got.Message != "bye" {
		t.Errorf("final status: app terminated %+v, want message %q as reported before the deletion", got, "bye")
	}
}

// A shorter grace period arriving while the pod drains (the drain loop takes the worker's
// signal) still cuts the termination short.
func TestDrainShorterGracePeriod(t *testing.T) {
	testDrainShorter(t, true)
}

func TestNoProberShorterGracePeriod(t *testing.T) {
	testDrainShorter(t, false)
}

func testDrainShorter(t *testing.T, probes bool) {
	var n *hollowNode
	if probes {
		n, _ = drainingNode(t, nil)
	} else {
		n = startHollowNode(t)
	}
	pod := drainingPod("shorter", 30)
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "ready", func(st v1.PodStatus) bool { return st.Phase == v1.PodRunning && isReady(st) })
	n.mgr.Update(deleted(pod, 30))
	time.Sleep(500 * time.Millisecond)
	began := time.Now()
	n.mgr.Update(deleted(pod, 1))
	eventually(t, 5*time.Second, "the pod stopped with the shorter grace period", func() bool { return !n.running(t)[pod.UID] })
	t.Logf("stopped %v after the shorter grace period", time.Since(began))
}

// An agent restart in the middle of a drain: the new run drains again, reports the pod's
// readiness meanwhile, and ends the termination.
func TestDrainAcrossAgentRestart(t *testing.T) {
	n, failing := drainingNode(t, nil)
	n.rt.SetTermWait(func(time.Duration) time.Duration { return 3 * time.Second })
	pod := drainingPod("restart", 30)
	n.mgr.Update(pod)
	st := n.waitStatus(t, pod, "ready", func(st v1.PodStatus) bool { return st.Phase == v1.PodRunning && isReady(st) })
	gone := deleted(pod, 30)
	n.mgr.Update(gone)
	time.Sleep(300 * time.Millisecond)
	n.stop()
	failing.Store(true)
	gone = gone.DeepCopy()
	gone.Status = st
	n.start(t, nil)
	n.mgr.Update(gone)
	n.waitStatus(t, pod, "unready while it drains after the restart", func(st v1.PodStatus) bool { return !isReady(st) && st.Phase == v1.PodRunning })
	eventually(t, 8*time.Second, "terminated", func() bool { cs, _ := n.rt.ListPod(context.Background(), string(pod.UID)); return len(cs) == 0 })
}

// The statuses reported while a pod drains keep what its running containers' statuses said
// of their resources (allocatedResources, resources), as the kubelet's do: reportDraining
// computes them without the allocation's and the cgroup's, and they vanish for the drain.
func TestDrainKeepsContainerResources(t *testing.T) {
	n, failing := drainingNode(t, nodeOf{cpu: 2000, mem: 1 << 30})
	n.rt.SetTermWait(func(time.Duration) time.Duration { return 3 * time.Second })
	pod := resizablePod("drain-res", 100, 128<<20)
	pod.Spec.Containers[0].Command = []string{"sh", "-c", "trap '' TERM; sleep 3600"}
	pod.Spec.Containers[0].ReadinessProbe = drainingPod("x", 1).Spec.Containers[0].ReadinessProbe
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "running with its resources", func(st v1.PodStatus) bool { return settled(100, 128<<20)(st) && isReady(st) })
	failing.Store(true)
	n.mgr.Update(deleted(pod, 30))
	st := n.waitStatus(t, pod, "unready while it drains", func(st v1.PodStatus) bool { return !isReady(st) })
	if cs := st.ContainerStatuses[0]; cs.Resources == nil || cs.AllocatedResources == nil {
		t.Errorf("while it drains: running %v, resources %v, allocatedResources %v; want them as before the deletion", cs.State.Running != nil, cs.Resources, cs.AllocatedResources)
	}
}

// The e2e "reduce GracePeriodSeconds during runtime": a pod with a preStop sleep longer than
// the grace period its deletion gives (the spec's is longer still) is stopped when that grace
// period ends, the sleep cut short; the whole run of 2026-12-07 saw it run the sleep out.
func TestDeletionGraceCutsPreStopSleep(t *testing.T) {
	n := startHollowNode(t)
	grace := int64(60)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "prestop-sleep", UID: "prestop-sleep"},
		Spec: v1.PodSpec{NodeName: "gw", TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{{Name: "app", Image: "busybox", Command: []string{"sleep", "3600"},
				Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 20}}}}}},
	}
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "running", func(st v1.PodStatus) bool { return st.Phase == v1.PodRunning && isReady(st) })
	began := time.Now()
	n.mgr.Update(deleted(pod, 2))
	eventually(t, 10*time.Second, "the pod stopped when the deletion's grace period of 2s ended", func() bool { return !n.running(t)[pod.UID] })
	t.Logf("stopped %v after the deletion", time.Since(began))
}
