package node

import (
	"encoding/json"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// TestStatusPatchKeepsOthersFields: holdfast's status patch replaces what holdfast owns and
// leaves an extended resource, another controller's condition, labels and annotations alone;
// an address that changed replaces the old one instead of joining it; a holdfast condition no
// longer reported is removed.
func TestStatusPatchKeepsOthersFields(t *testing.T) {
	q := resource.MustParse
	old := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", Labels: map[string]string{"site": "a"}, Annotations: map[string]string{"note": "x"}},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: q("1"), "example.com/dongle": q("2")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: q("1"), "example.com/dongle": q("2")},
			Conditions: []v1.NodeCondition{
				{Type: "NetworkUnavailable", Status: v1.ConditionFalse, Reason: "RouteCreated"},
				{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: "KubeletNotReady"},
				{Type: ConditionStateRecovered, Status: v1.ConditionTrue},
			},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}, {Type: v1.NodeHostName, Address: "gw"}},
		},
	}
	ours := v1.NodeStatus{
		Capacity:         v1.ResourceList{v1.ResourceCPU: q("2"), v1.ResourcePods: q("110")},
		Allocatable:      v1.ResourceList{v1.ResourceCPU: q("2"), v1.ResourcePods: q("110")},
		Conditions:       []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}},
		Addresses:        []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.9"}, {Type: v1.NodeHostName, Address: "gw"}},
		NodeInfo:         v1.NodeSystemInfo{KubeletVersion: "v1"},
		DaemonEndpoints:  v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: 10250}},
		DeclaredFeatures: DeclaredFeatures,
	}
	old.Status.DeclaredFeatures = []string{"SomethingHoldfastDoesNot"}
	owned := map[v1.NodeConditionType]bool{v1.NodeReady: true, ConditionStateRecovered: true}
	patch, err := statusPatch(old, ours, owned)
	if err != nil {
		t.Fatal(err)
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
	if c := got.Status.Capacity; c.Cpu().String() != "2" || c.Pods().String() != "110" || c.Name("example.com/dongle", resource.DecimalSI).String() != "2" {
		t.Errorf("capacity %v: want holdfast's cpu and pods beside the dongle", c)
	}
	if a := got.Status.Allocatable; a.Name("example.com/dongle", resource.DecimalSI).String() != "2" || a.Cpu().String() != "2" {
		t.Errorf("allocatable %v", a)
	}
	types := map[v1.NodeConditionType]v1.ConditionStatus{}
	for _, c := range got.Status.Conditions {
		types[c.Type] = c.Status
	}
	if len(types) != 2 || types["NetworkUnavailable"] != v1.ConditionFalse || types[v1.NodeReady] != v1.ConditionTrue {
		t.Errorf("conditions %v: want NetworkUnavailable kept, Ready True, HoldfastStateRecovered gone", types)
	}
	if len(got.Status.Addresses) != 2 || got.Status.Addresses[0].Address != "192.0.2.9" {
		t.Errorf("addresses %v: want the new InternalIP only", got.Status.Addresses)
	}
	if p := got.Status.DaemonEndpoints.KubeletEndpoint.Port; p != 10250 {
		t.Errorf("kubelet endpoint port %d: want 10250, where the node API listens", p)
	}
	// The features holdfast implements, declared (the apiserver refuses a pod-level resize
	// on a node that does not declare it), and nothing else.
	if f := got.Status.DeclaredFeatures; !slices.Equal(f, []string{"InPlacePodLevelResourcesVerticalScaling", "InPlacePodVerticalScalingInitContainers"}) {
		t.Errorf("declared features %v: want InPlacePodLevelResourcesVerticalScaling and InPlacePodVerticalScalingInitContainers only", f)
	}
	if got.Labels["site"] != "a" || got.Annotations["note"] != "x" || got.Status.NodeInfo.KubeletVersion != "v1" {
		t.Errorf("labels %v annotations %v nodeInfo %v", got.Labels, got.Annotations, got.Status.NodeInfo)
	}
}

// TestStatusPatchReportedConditionNotDuplicated: a condition type holdfast reports but that is
// not in the owned set (the client certificate's, from Config.Conditions) is replaced, not
// kept beside the new one: the apiserver refuses a patch that lists a condition type twice
// ("doesn't match $setElementOrder list"), which stopped every node status update after the
// first on a gateway joined through TLS bootstrap.
func TestStatusPatchReportedConditionNotDuplicated(t *testing.T) {
	const certCondition v1.NodeConditionType = "HoldfastClientCertificateExpiring"
	old := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: certCondition, Status: v1.ConditionFalse, Reason: "ClientCertificateValid", Message: "valid until a"},
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"},
		}},
	}
	ours := v1.NodeStatus{Conditions: []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "again"},
		{Type: certCondition, Status: v1.ConditionFalse, Reason: "ClientCertificateValid", Message: "valid until b"},
	}}
	owned := map[v1.NodeConditionType]bool{v1.NodeReady: true}
	patch, err := statusPatch(old, ours, owned)
	if err != nil {
		t.Fatal(err)
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
	var msgs []string
	for _, c := range got.Status.Conditions {
		if c.Type == certCondition {
			msgs = append(msgs, c.Message)
		}
	}
	if len(msgs) != 1 || msgs[0] != "valid until b" {
		t.Errorf("%s conditions after the patch %s: %q, want only the new one", certCondition, patch, msgs)
	}
}
