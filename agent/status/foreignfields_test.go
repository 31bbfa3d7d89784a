package status

import (
	"encoding/json"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/randfill"
)

// Every field of a pod's status is either the node agent's to compute or another writer's to
// keep. A Kubernetes upgrade that adds a field fails here until it is put in one of the two
// lists, so that no new field is deleted by the node's patches without anyone deciding it.
var (
	nodeOwnedStatusFields = []string{
		"ObservedGeneration", "Phase", "Conditions", "Message", "Reason", "HostIP", "HostIPs",
		"PodIP", "PodIPs", "StartTime", "InitContainerStatuses", "ContainerStatuses", "QOSClass",
		"EphemeralContainerStatuses", "Resize", "AllocatedResources", "Resources", "VolumeHealth",
	}
	foreignStatusFieldNames = []string{
		"NominatedNodeName", "ResourceClaimStatuses", "ExtendedResourceClaimStatus",
		"NodeAllocatableResourceClaimStatuses",
	}
)

func TestEveryPodStatusFieldHasAnOwner(t *testing.T) {
	listed := map[string]int{}
	for _, f := range nodeOwnedStatusFields {
		listed[f]++
	}
	for _, f := range foreignStatusFieldNames {
		listed[f]++
	}
	typ := reflect.TypeOf(v1.PodStatus{})
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		switch listed[name] {
		case 0:
			t.Errorf("PodStatus.%s is in neither list: decide whether the node computes it or keeps another writer's", name)
		case 2:
			t.Errorf("PodStatus.%s is in both lists", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("%s is listed but PodStatus has no such field", name)
	}
}

// The scheduler's nominatedNodeName and the resource claim controller's statuses are not the
// node's: a status the node computed (which never has them) must leave them as the apiserver
// holds them, whatever else changed. The statuses the apiserver holds are generated; the patch
// is applied as the apiserver applies it.
func TestPatchKeepsFieldsOtherWritersOwn(t *testing.T) {
	fill := randfill.NewWithSeed(29).NilChance(0.2).NumElements(1, 3).Funcs(
		// The lists that merge by key, each key once, as the apiserver holds them.
		func(l *[]v1.PodResourceClaimStatus, r randfill.Continue) {
			*l = nil
			for _, name := range distinct(r, "gpu", "fpga", "nic") {
				n := "claim-" + name
				*l = append(*l, v1.PodResourceClaimStatus{Name: name, ResourceClaimName: &n})
			}
		},
		func(l *[]v1.NodeAllocatableResourceClaimStatus, r randfill.Continue) {
			*l = nil
			for _, name := range distinct(r, "claim-1", "claim-2") {
				var c v1.NodeAllocatableResourceClaimStatus
				r.FillNoCustom(&c)
				c.ResourceClaimName = name
				*l = append(*l, c)
			}
		},
		func(tm *metav1.Time, r randfill.Continue) { *tm = metav1.Unix(1_700_000_000+r.Int63n(100), 0) },
	)
	for i := range 300 {
		var sent v1.PodStatus
		fill.Fill(&sent.NominatedNodeName)
		fill.Fill(&sent.ResourceClaimStatuses)
		fill.Fill(&sent.ExtendedResourceClaimStatus)
		fill.Fill(&sent.NodeAllocatableResourceClaimStatuses)
		sent.Phase = v1.PodPending
		computed := v1.PodStatus{
			Phase:      v1.PodRunning,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
			PodIP:      "10.1.0.7",
			QOSClass:   v1.PodQOSBestEffort,
		}
		st := overAPIStatus(sent, computed, i%2 == 0)
		p, err := statusPatch(sent, st)
		if err != nil {
			t.Fatal(err)
		}
		after := applyStatusPatch(t, sent, p)
		// Compared as the apiserver stores them (JSON), not as Go values: a quantity read back
		// is the same quantity in another internal form.
		want, got := mustJSON(t, foreignFields(sent)), mustJSON(t, foreignFields(after))
		if want != got {
			t.Fatalf("status %d: the node's patch changed another writer's fields\npatch %s\nbefore %+v\nafter  %+v", i, p, want, got)
		}
		if after.Phase != v1.PodRunning || after.PodIP != "10.1.0.7" {
			t.Fatalf("status %d: the node's own fields not written: %s", i, p)
		}
	}
}

// foreignFields is sent reduced to the fields other writers own.
func foreignFields(st v1.PodStatus) v1.PodStatus {
	var out v1.PodStatus
	src, dst := reflect.ValueOf(st), reflect.ValueOf(&out).Elem()
	for _, name := range foreignStatusFieldNames {
		dst.FieldByName(name).Set(src.FieldByName(name))
	}
	return out
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func applyStatusPatch(t *testing.T, sent v1.PodStatus, p []byte) v1.PodStatus {
	t.Helper()
	orig, err := json.Marshal(v1.Pod{Status: sent})
	if err != nil {
		t.Fatal(err)
	}
	out, err := strategicpatch.StrategicMergePatch(orig, p, v1.Pod{})
	if err != nil {
		t.Fatalf("apply %s: %v", p, err)
	}
	var pod v1.Pod
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatal(err)
	}
	return pod.Status
}

// distinct is 1 to all of keys, each once, in a random order.
func distinct(r randfill.Continue, keys ...string) []string {
	out := make([]string, 0, len(keys))
	for _, i := range r.Perm(len(keys))[:1+r.Intn(len(keys))] {
		out = append(out, keys[i])
	}
	return out
}
