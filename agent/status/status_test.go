package status

import (
	"testing"

	v1 "k8s.io/api/core/v1"
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
