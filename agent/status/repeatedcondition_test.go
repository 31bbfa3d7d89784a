package status

import (
	"context"
	"log/slog"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
)

// Caller-level consequence of agent/kube/patch refusing a merging list with a duplicate key
// (see agent/kube/patch/repeated_test.go): a readiness-gate owner stored its condition twice
// with a PUT of pods/status (the apiserver keeps duplicates a create or update brings). The
// agent keeps that writer's conditions, so every patch it computes has the duplicate: no
// status of the pod is written again, however many rounds. With strategicpatch the round wrote
// Ready and left the gate's conditions alone.
func TestRepeatedForeignPodConditionStillWritten(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	ctx := context.Background()
	inAPI, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inAPI.Status.Conditions = []v1.PodCondition{
		{Type: v1.PodReady, Status: v1.ConditionFalse},
		{Type: "example.com/gate", Status: v1.ConditionTrue},
		{Type: "example.com/gate", Status: v1.ConditionTrue},
	}
	if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, inAPI, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m := NewManager(kubetest.Wrap(client), nil, "gw", slog.New(slog.DiscardHandler))
	m.SetPodStatus(pod, v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.88.0.7",
		Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}})
	for range 3 {
		m.syncAll(ctx)
	}
	got, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := v1.ConditionStatus("")
	gates := 0
	for _, c := range got.Status.Conditions {
		switch c.Type {
		case v1.PodReady:
			ready = c.Status
		case "example.com/gate":
			gates++
		}
	}
	if got.Status.Phase != v1.PodRunning || ready != v1.ConditionTrue || gates != 2 || m.Pending() != 0 {
		t.Fatalf("after 3 rounds: phase %q, Ready %q, %d gate conditions, %d pending; want Running, True, 2 (the other writer's, as they are), 0",
			got.Status.Phase, ready, gates, m.Pending())
	}
}
