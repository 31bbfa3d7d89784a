package node

import (
	"encoding/json"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// Caller-level consequence of agent/kube/patch refusing a merging list with a duplicate key
// (see agent/kube/patch/repeated_test.go): another writer's condition type stored twice on the
// Node (a create or update keeps duplicates) makes every node status patch fail from then on,
// since withOwnedStatus keeps others' conditions as they are. With strategicpatch the patch
// was computed and applied: Ready written, the other writer's conditions left alone.
func TestRepeatedForeignNodeConditionStillWritten(t *testing.T) {
	old := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: "example.com/KernelDeadlock", Status: v1.ConditionFalse},
			{Type: "example.com/KernelDeadlock", Status: v1.ConditionFalse},
			{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: "KubeletNotReady"},
		}},
	}
	ours := v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}}}
	patch, err := statusPatch(old, ours, map[v1.NodeConditionType]bool{v1.NodeReady: true})
	if err != nil {
		t.Fatalf("no node status patch: %v", err)
	}
	oldJSON, _ := json.Marshal(old)
	newJSON, err := strategicpatch.StrategicMergePatch(oldJSON, patch, v1.Node{})
	if err != nil {
		t.Fatalf("apply %s: %v", patch, err)
	}
	var got v1.Node
	if err := json.Unmarshal(newJSON, &got); err != nil {
		t.Fatal(err)
	}
	n, ready := 0, v1.ConditionStatus("")
	for _, c := range got.Status.Conditions {
		if c.Type == "example.com/KernelDeadlock" {
			n++
		}
		if c.Type == v1.NodeReady {
			ready = c.Status
		}
	}
	if n != 2 || ready != v1.ConditionTrue {
		t.Errorf("after the patch %s: %d KernelDeadlock, Ready %q; want 2 and True", patch, n, ready)
	}
}
