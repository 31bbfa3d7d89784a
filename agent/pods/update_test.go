package pods

import (
	"log/slog"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/manifest"
)

// A pod update that changes only what the node itself reports of its containers (the status
// but its conditions, and the resource version and managed fields of the write) does not wake
// the pod's worker: it is the echo of the worker's own status patch. Before, every echo synced the pod again, and a failing
// sandbox whose error changed each try (a CRI runtime names a new sandbox ID) was retried in
// a loop bounded by the API round trip: sandbox, netns, CNI ADD and DEL, an event and a PATCH
// per turn. The worker still sees the latest status (the baseline of the next one it
// computes); any other change wakes it.
func TestStatusOnlyUpdateDoesNotWakeTheWorker(t *testing.T) {
	m := NewManager(Config{}, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1", ResourceVersion: "1", Labels: map[string]string{"app": "web"}},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "busybox"}}},
		Status:     v1.PodStatus{Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}},
	}
	w := newWorker(m, pod)
	m.workers[pod.UID] = w // not started: the test reads its signal itself
	woken := func() bool {
		select {
		case <-w.signal:
			return true
		default:
			return false
		}
	}

	echo := pod.DeepCopy()
	echo.ResourceVersion = "2"
	echo.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "holdfast", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}}
	echo.Status = v1.PodStatus{Phase: v1.PodPending, Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "app", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{
			Reason: ReasonCreatePodSandboxError, Message: "sandbox 4f2a: failed"}}}}}
	m.Update(echo)
	if woken() {
		t.Error("a status-only update woke the worker")
	}
	if got := w.latestPod(); got.ResourceVersion != "2" || got.Status.Phase != v1.PodPending {
		t.Errorf("the worker's pod after the status update: rv %s, status %+v; want the latest", got.ResourceVersion, got.Status)
	}

	for _, c := range []struct {
		name   string
		change func(*v1.Pod)
	}{
		{"a label", func(p *v1.Pod) { p.Labels["app"] = "web2" }},
		{"an annotation", func(p *v1.Pod) { p.Annotations = map[string]string{"a": "b"} }},
		{"the image", func(p *v1.Pod) { p.Spec.Containers[0].Image = "busybox:2" }},
		{"a deletion", func(p *v1.Pod) { now := metav1.NewTime(time.Unix(1, 0)); p.DeletionTimestamp = &now }},
		// Status changes the node must act on: a readiness gate another controller set, and
		// Ready=False the node lifecycle controller wrote while the node was away.
		{"a readiness gate's condition", func(p *v1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: "example.com/lb-ready", Status: v1.ConditionTrue})
		}},
		{"the Ready condition", func(p *v1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "NodeNotReady"})
		}},
	} {
		next := w.latestPod().DeepCopy()
		next.ResourceVersion += "0"
		c.change(next)
		m.Update(next)
		if !woken() {
			t.Errorf("an update of %s did not wake the worker", c.name)
		}
	}
}

// Containers found at start that no source claimed yet are torn down by an orphan worker; if
// the pod's source delivers it meanwhile (a manifest read late, a relist), the pod is started
// again once the teardown is done. Before, the orphan worker took the pod and kept its removal
// flag: the pod stayed stopped until its manifest was edited or the agent restarted.
func TestPodDeliveredToAnOrphanWorkerStartsAgain(t *testing.T) {
	m := NewManager(Config{}, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	stub := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "sensor-gw", Namespace: "default"}}
	w := newWorker(m, stub)
	w.removal = &removalOrder{reason: "no source has this pod any more", orphan: true}
	m.workers[stub.UID] = w
	pod := stub.DeepCopy()
	pod.Spec.Containers = []v1.Container{{Name: "reader", Image: "busybox"}}
	m.Update(pod)
	w.mu.Lock()
	readded := w.readded
	w.mu.Unlock()
	if readded != pod {
		t.Fatalf("the pod delivered to an orphan worker is not kept to start again: readded %v", readded)
	}
}

// A static pod's mirror is an orphan only once no worker has the pod: while its worker
// terminates it (manifest removed, a long grace period or a teardown that keeps failing), the
// mirror is the status side's to delete when the pod is down. Counted as gone, it was deleted
// by the sweep and made again by the status side every 30 s.
func TestRunsStaticPodWhileItTerminates(t *testing.T) {
	m := NewManager(Config{}, nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	static := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "s1", Name: "sensor-gw", Namespace: "default",
		Annotations: map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}}}
	api := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "a1", Name: "web", Namespace: "default"}}
	for _, p := range []*v1.Pod{static, api} {
		m.workers[p.UID] = newWorker(m, p) // not started
	}
	if !m.RunsStaticPod("default", "sensor-gw") {
		t.Error("a running static pod is not counted")
	}
	m.workers["s1"].removal = &removalOrder{reason: "manifest removed"} // its manifest was removed: the worker terminates it
	if !m.RunsStaticPod("default", "sensor-gw") {
		t.Error("a terminating static pod is not counted: its mirror would be deleted and made again")
	}
	if m.RunsStaticPod("default", "web") || m.RunsStaticPod("kube-system", "sensor-gw") {
		t.Error("an API pod, or another namespace, counted as a static pod")
	}
	delete(m.workers, "s1") // terminated
	if m.RunsStaticPod("default", "sensor-gw") {
		t.Error("a static pod whose worker is gone still counted")
	}
}
