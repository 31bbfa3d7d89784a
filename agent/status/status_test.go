package status

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/offline"
)

// A status computed from a pod that had not seen a condition another writer set (a readiness
// gate) must not delete it; conditions the agent owns are its to change.
func TestKeepForeignConditions(t *testing.T) {
	sent := v1.PodStatus{Conditions: []v1.PodCondition{
		{Type: v1.PodReady, Status: v1.ConditionTrue},
		{Type: "example.com/lb", Status: v1.ConditionTrue},
	}}
	st := v1.PodStatus{Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse}}}
	got := keepForeignConditions(sent, st)
	if len(got.Conditions) != 2 || got.Conditions[0].Status != v1.ConditionFalse || got.Conditions[1].Type != "example.com/lb" {
		t.Errorf("conditions %+v", got.Conditions)
	}
	if len(st.Conditions) != 1 {
		t.Error("the computed status was modified in place")
	}
}

// A phase another writer set Succeeded or Failed is never written back to Running by a status
// computed before the pod's worker stopped the pod; a mirror pod's phase is the node's own.
func TestTerminalPhaseOfAnotherWriterKept(t *testing.T) {
	sent := v1.PodStatus{Phase: v1.PodFailed, Reason: "Superseded", Message: "by a controller"}
	st := v1.PodStatus{Phase: v1.PodRunning, Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}}
	got := overAPIStatus(sent, st, false)
	if got.Phase != v1.PodFailed || got.Reason != "Superseded" || got.Message != "by a controller" || len(got.Conditions) != 1 {
		t.Errorf("over a Failed phase: %+v", got)
	}
	if got := overAPIStatus(sent, st, true); got.Phase != v1.PodRunning {
		t.Errorf("over a mirror pod's Failed phase: %s, want the static pod's Running", got.Phase)
	}
	done := v1.PodStatus{Phase: v1.PodSucceeded}
	if got := overAPIStatus(sent, done, false); got.Phase != v1.PodSucceeded {
		t.Errorf("the node's own terminal phase replaced: %s", got.Phase)
	}
}

// Right after an apiserver restart the Node authorizer refuses a node until its graph has
// caught up. A status write refused then must be tried again, not dropped as if the pod were
// gone: a steady pod computes no new status that would send it later.
func TestForbiddenStatusWriteIsRetried(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	forbidden := 2
	client.PrependReactor("*", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if forbidden > 0 {
			forbidden--
			return true, nil, apierrors.NewForbidden(v1.Resource("pods"), pod.Name, errors.New("no relationship found between node and this object"))
		}
		return false, nil, nil
	})
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.NewTextHandler(io.Discard, nil)))
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.88.0.7"})
	ctx := context.Background()
	// What holdfast_outbox_depth reports: the status waits until a write is accepted.
	if n := m.Pending(); n != 1 {
		t.Errorf("pending before any write: %d, want 1", n)
	}
	m.syncAll(ctx)
	if n := m.Pending(); n != 1 {
		t.Errorf("pending after a refused write: %d, want 1", n)
	}
	for range 2 {
		m.syncAll(ctx)
	}
	if n := m.Pending(); n != 0 {
		t.Errorf("pending once delivered: %d, want 0", n)
	}
	got, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1.PodRunning || got.Status.PodIP != "10.88.0.7" {
		t.Fatalf("status in the API after the authorizer relented: %+v", got.Status)
	}
}

// With the apiserver out of reach (an offline boot), a round of writes stops at the first
// that gets no answer instead of trying every pending pod, and a write refused by the
// apiserver does not stop the others.
func TestUnreachableApiserverEndsTheRound(t *testing.T) {
	var pods []*v1.Pod
	for _, name := range []string{"a", "b", "c"} {
		pods = append(pods, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}})
	}
	client := fake.NewSimpleClientset(pods[0].DeepCopy(), pods[1].DeepCopy(), pods[2].DeepCopy())
	var calls int
	var answer error
	client.PrependReactor("*", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		if answer != nil {
			return true, nil, answer
		}
		return false, nil, nil
	})
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, p := range pods {
		m.SetPodStatus(p, v1.PodStatus{Phase: v1.PodRunning})
	}
	ctx := context.Background()

	answer = &url.Error{Op: "Get", URL: "https://10.0.0.1:6443/api/v1/namespaces/default/pods/a", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	if !m.syncAll(ctx) {
		t.Error("syncAll did not report the apiserver unreachable")
	}
	if calls != 1 || m.Pending() != 3 {
		t.Errorf("unreachable apiserver: %d requests, %d pending; want 1 request, 3 pending", calls, m.Pending())
	}

	calls, answer = 0, apierrors.NewForbidden(v1.Resource("pods"), "a", errors.New("no relationship found between node and this object"))
	if m.syncAll(ctx) {
		t.Error("a refusal was taken for an unreachable apiserver")
	}
	if calls != 3 || m.Pending() != 3 {
		t.Errorf("refused writes: %d requests, %d pending; want 3 requests (one per pod), 3 pending", calls, m.Pending())
	}

	answer = nil
	if m.syncAll(ctx) || m.Pending() != 0 {
		t.Errorf("apiserver back: %d pending, want 0", m.Pending())
	}
}

// A pod someone created under a static pod's name is not the node's mirror to replace: the
// status manager never deletes it (before, it force-deleted any pod of that name, whoever
// made it), says why no mirror is made, and makes one once that pod is gone. A mirror of
// another version of the manifest is still replaced.
func TestMirrorNeverReplacesAPodItDidNotMake(t *testing.T) {
	static := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-gw", Namespace: "default", UID: "static-uid", Annotations: map[string]string{
			manifest.ConfigSourceAnnotation: manifest.SourceFile, manifest.ConfigHashAnnotation: "hash-v2"}},
		Spec: v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
	}
	bystander := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-gw", Namespace: "default", UID: "someone-elses"},
		Spec: v1.PodSpec{NodeName: "gw"}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gw", UID: "node-uid"}}
	client := fake.NewSimpleClientset(bystander, node)
	var deleted []string
	client.PrependReactor("delete", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		deleted = append(deleted, action.(k8stesting.DeleteAction).GetName())
		return false, nil, nil
	})
	var logs strings.Builder
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.NewTextHandler(&logs, nil)))
	m.SetPodStatus(static, v1.PodStatus{Phase: v1.PodRunning})
	ctx := context.Background()
	m.syncAll(ctx)
	if len(deleted) != 0 {
		t.Fatalf("deleted %v: a pod the node did not make", deleted)
	}
	if got, err := client.CoreV1().Pods("default").Get(ctx, "web-gw", metav1.GetOptions{}); err != nil || got.UID != "someone-elses" {
		t.Fatalf("the bystander pod: %v, %v", got, err)
	}
	if !strings.Contains(logs.String(), "is not this node's mirror pod") {
		t.Errorf("no reason logged: %s", logs.String())
	}

	// Once it is gone the mirror is made; a mirror of an older manifest is replaced.
	if err := client.CoreV1().Pods("default").Delete(ctx, "web-gw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	old := bystander.DeepCopy()
	old.UID, old.Annotations = "old-mirror", map[string]string{manifest.MirrorAnnotation: "hash-v1"}
	if _, err := client.CoreV1().Pods("default").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted = nil
	m.syncAll(ctx)
	got, err := client.CoreV1().Pods("default").Get(ctx, "web-gw", metav1.GetOptions{})
	if err != nil || got.Annotations[manifest.MirrorAnnotation] != "hash-v2" || len(deleted) != 1 {
		t.Fatalf("after the old mirror: %+v, %v, deleted %v; want it replaced by the mirror of hash-v2", got, err, deleted)
	}
}

// Statuses left in the outbox for a pod the store no longer has a record of (deleted from the
// API while the node was away, its record removed by the full list that proved it) are
// dropped at the next start: the Node authorizer refuses them (403) for as long as they are
// tried, which was every 10 s for good. A pod with a record keeps its pending status.
func TestOutboxOfAPodGoneIsDropped(t *testing.T) {
	store := offline.NewMemStore(nil)
	kept := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept", UID: "kept-uid"}}
	if err := store.PutPod(offline.SourceAPI, kept); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*v1.Pod{kept, {ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone", UID: "gone-uid"}}} {
		if _, err := store.AppendStatus(offline.StatusUpdate{UID: p.UID, Namespace: p.Namespace, Name: p.Name,
			Status: v1.PodStatus{Phase: v1.PodRunning}, Timestamp: time.Unix(1, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	m := NewManager(kubetest.Wrap(fake.NewSimpleClientset()), store, "gw", slog.New(slog.DiscardHandler))
	if n := m.RestoreOutbox(); n != 1 {
		t.Errorf("restored %d pods' statuses, want 1", n)
	}
	pending, _, err := store.PendingStatuses()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || pending[0].UID != "kept-uid" {
		t.Errorf("outbox after the restore: %+v, want the kept pod's alone", pending)
	}
	if m.Pending() != 1 {
		t.Errorf("statuses waiting for delivery: %d, want 1", m.Pending())
	}
}

// A pod whose record is sealed with a state key that is not loaded (the disk in another
// gateway, a replaced TPM) is not restored: its last status, Running and ready, is neither
// shown nor sent for a pod that does not run, and stays in the outbox for the key's return.
// Before, the gateway VM's scenario 8 showed the pod Running on the stolen disk.
func TestOutboxOfAPodSealedWithAnotherKeyNotRestored(t *testing.T) {
	keyA, _ := offline.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	keyB, _ := offline.NewKey([]byte("fedcba9876543210fedcba9876543210"))
	store := offline.NewMemStore(nil)
	store.SetKey(keyA)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sealed", UID: "sealed-uid"}}
	if err := store.PutPod(offline.SourceAPI, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := store.AppendStatus(offline.StatusUpdate{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Status: v1.PodStatus{Phase: v1.PodRunning}, Timestamp: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	store.SetKey(keyB)
	m := NewManager(kubetest.Wrap(fake.NewSimpleClientset()), store, "gw", slog.New(slog.DiscardHandler))
	if n := m.RestoreOutbox(); n != 0 || len(m.Pods()) != 0 || m.Pending() != 0 {
		t.Errorf("restored %d statuses, shows %d pods, %d pending; want none", n, len(m.Pods()), m.Pending())
	}
	if pending, _, err := store.PendingStatuses(); err != nil || len(pending) != 1 {
		t.Errorf("outbox: %+v, %v; want the status kept", pending, err)
	}
}

// While the node was unreachable, the node lifecycle controller marked its pods Ready=False.
// When the node is back, the status it computes has not changed (the pod ran ready all along),
// so a patch computed from the last status the node sent carries nothing, and the API kept
// Ready=False. The status the informer delivers is the base of the next patch instead: the
// node writes Ready=True back at once.
func TestStatusChangedByAnotherWriterIsCorrected(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.DiscardHandler))
	ready := []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, Conditions: ready})
	ctx := context.Background()
	m.syncAll(ctx)

	// The node lifecycle controller, while the node was away.
	inAPI, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inAPI.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "NodeNotReady"}}
	if inAPI, err = client.CoreV1().Pods("default").UpdateStatus(ctx, inAPI, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The informer delivers it; the node's own status is unchanged.
	m.Observed(inAPI)
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, Conditions: ready})
	m.syncAll(ctx)
	got, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Status != v1.ConditionTrue {
		t.Errorf("Ready in the API after the node is back: %+v, want True", got.Status.Conditions)
	}

	// Its own status echoed back costs no write.
	writes := len(client.Actions())
	m.Observed(got)
	m.syncAll(ctx)
	if n := len(client.Actions()) - writes; n != 0 {
		t.Errorf("the echo of the node's own patch cost %d requests", n)
	}
}

// The node back after an outage: its status changed meanwhile (in the outbox), and the first
// patch goes out before the informer's relist shows that the node lifecycle controller set
// Ready=False. The patch, computed from the old base, carries no Ready; the answer does
// (False). The answer is the new base and the pod stays dirty: the next round writes Ready
// back. Before, the answer was taken as delivered and Ready stayed False until the pod's status
// next changed. One extra round at most: a writer that keeps changing it gets no loop.
func TestAnswerLackingTheNodesStatusIsPatchedAgain(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.DiscardHandler))
	ready := []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
	ctx := context.Background()
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, Conditions: ready})
	m.syncAll(ctx)

	inAPI, _ := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	inAPI.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionFalse, Reason: "NodeNotReady"}}
	if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, inAPI, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A status change of the outage, sent before the informer shows the API's.
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, Conditions: ready, PodIP: "10.88.0.9"})
	m.syncAll(ctx)
	if m.Pending() != 1 {
		t.Errorf("pending after an answer that lacks Ready=True: %d, want 1", m.Pending())
	}
	m.syncAll(ctx)
	got, _ := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Status != v1.ConditionTrue || got.Status.PodIP != "10.88.0.9" {
		t.Errorf("status in the API: %+v", got.Status)
	}
	if m.Pending() != 0 {
		t.Errorf("pending once written: %d", m.Pending())
	}
}

// The informer's echo of a patch often comes before the patch's answer is taken: the echo is
// then the base (Observed during the write) and the pod stays dirty for one more round, whose
// status differs from the echo by nothing but what JSON keeps of its times (the node's have
// nanoseconds, the apiserver's seconds). That round writes nothing. Before, it sent a patch
// that changed nothing: 1.67 status writes per readiness change in make bench, against the
// kubelet's 1.00.
func TestEchoBeforeTheAnswerCostsNoSecondWrite(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.DiscardHandler))
	ctx := context.Background()
	at := metav1.NewTime(time.Date(2026, 12, 6, 3, 35, 47, 886_000_000, time.UTC))
	ready := []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: at}}
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, Conditions: ready})
	m.syncAll(ctx)

	// The echo, as the informer gets it (times to the second), taken during a write.
	echo, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(echo)
	echo = &v1.Pod{}
	if err := json.Unmarshal(raw, echo); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.pods[pod.UID].sent = &v1.PodStatus{Phase: v1.PodPending} // the answer not taken yet
	m.mu.Unlock()
	m.Observed(echo)
	writes := len(client.Actions())
	m.syncAll(ctx)
	if n := len(client.Actions()) - writes; n != 0 {
		t.Errorf("a round whose status the echo already has cost %d requests", n)
	}
	if m.Pending() != 0 {
		t.Errorf("pending after that round: %d", m.Pending())
	}
}
