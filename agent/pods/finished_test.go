package pods_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/hollow"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// hollowNode runs a pods manager on the hollow runtime, its statuses kept in memory.
type hollowNode struct {
	rt     *hollow.Runtime
	mgr    *pods.Manager
	status *status.Manager
}

func startHollowNode(t *testing.T) *hollowNode {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	store := offline.NewMemStore(nil)
	n := &hollowNode{rt: hollow.NewRuntime(), status: status.NewManager(nil, store, "gw", log)}
	n.mgr = pods.NewManager(pods.Config{
		StateDir: filepath.Join(dir, "state"), PodLogDir: filepath.Join(dir, "logs"), RelistPeriod: 50 * time.Millisecond, NodeName: "gw",
		Volumes:        volumes.NewManager(filepath.Join(dir, "state", "pods"), nil, nil, log, volumes.Options{PlainDirs: true}),
		HostResolvConf: filepath.Join(dir, "resolv.conf"), HostsFile: filepath.Join(dir, "hosts"),
	}, n.rt, hollow.NewNetwork("gw"), n.status, nil, log)
	n.mgr.SetAdmission(nil, store)
	n.mgr.SetSourcesReady(func() bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- n.mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return n
}

// waitStatus waits until the pod's status satisfies ok.
func (n *hollowNode) waitStatus(t *testing.T, pod *v1.Pod, what string, ok func(v1.PodStatus) bool) v1.PodStatus {
	t.Helper()
	var st v1.PodStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var found bool
		if st, found = n.status.Get(pod.UID); found && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: status %+v", what, st)
		}
	}
}

func jobPod(uid string, command ...string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "job-" + uid, UID: types.UID(uid)},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyNever, NodeName: "gw",
			Containers: []v1.Container{{Name: "work", Image: "busybox", Command: command}}},
	}
}

// A pod whose status in its source says it finished (a Job's pod that Succeeded, reported
// before an agent restart or a reboot that lost its containers, or an offline boot from its
// record) is never started again, and its status stays what it was: as the kubelet. Before,
// the worker found no container and ran the Job's work a second time.
func TestPodFinishedInItsSourceNotStartedAgain(t *testing.T) {
	n := startHollowNode(t)
	pod := jobPod("done", "sleep", "3600")
	pod.Status = v1.PodStatus{Phase: v1.PodSucceeded, Reason: "", Message: "ran before"}
	n.mgr.Update(pod)
	st := n.waitStatus(t, pod, "the finished pod's status", func(v1.PodStatus) bool { return true })
	time.Sleep(300 * time.Millisecond) // some relists and syncs
	if cs, _ := n.rt.List(context.Background()); len(cs) != 0 {
		t.Errorf("a pod that finished before was run again: %d containers", len(cs))
	}
	if st, _ = n.status.Get(pod.UID); st.Phase != v1.PodSucceeded || st.Message != "ran before" {
		t.Errorf("status = %s %q, want Succeeded as its source had it", st.Phase, st.Message)
	}
}

// A pod that finished on its own (Succeeded) is past its activeDeadlineSeconds' reach: when the
// deadline passes it stays Succeeded. Before, the worker kept counting and reported it Failed,
// DeadlineExceeded, once the deadline was past.
func TestDeadlineDoesNotFailAFinishedPod(t *testing.T) {
	n := startHollowNode(t)
	pod := jobPod("quick", "true")
	deadline := int64(1)
	pod.Spec.ActiveDeadlineSeconds = &deadline
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "the pod succeeding", func(st v1.PodStatus) bool { return st.Phase == v1.PodSucceeded })
	time.Sleep(1500 * time.Millisecond) // past the deadline
	relabelled := pod.DeepCopy()
	relabelled.Labels = map[string]string{"seen": "after the deadline"}
	n.mgr.Update(relabelled) // a sync after the deadline
	time.Sleep(300 * time.Millisecond)
	if st, _ := n.status.Get(pod.UID); st.Phase != v1.PodSucceeded {
		t.Errorf("after its deadline a pod that had succeeded is %s (%s): %s", st.Phase, st.Reason, st.Message)
	}
}
