package node

import (
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/holdfast-dev/holdfast/agent/kube/patch"
)

// withOwnedStatus returns the node's status with what holdfast owns replaced by st and
// everything else kept: capacity and allocatable keep the resources others advertise (a
// device plugin's, an admin's extended resources); conditions keep the types other
// controllers write, while holdfast's own are replaced (and dropped when it no longer reports
// them); nodeInfo, addresses, daemon endpoints, declared features and images are holdfast's. A condition type st reports is
// holdfast's whether or not ownedConditions names it (Config.Conditions' types are known only
// once reported): kept beside st's, it would be in the list twice, which the apiserver refuses.
func withOwnedStatus(old v1.NodeStatus, st v1.NodeStatus, ownedConditions map[v1.NodeConditionType]bool) v1.NodeStatus {
	out := *old.DeepCopy()
	out.Capacity = mergeResources(old.Capacity, st.Capacity)
	out.Allocatable = mergeResources(old.Allocatable, st.Allocatable)
	reported := map[v1.NodeConditionType]bool{}
	for _, c := range st.Conditions {
		reported[c.Type] = true
	}
	out.Conditions = nil
	for _, c := range old.Conditions {
		if !ownedConditions[c.Type] && !reported[c.Type] {
			out.Conditions = append(out.Conditions, c)
		}
	}
	out.Conditions = append(out.Conditions, st.Conditions...)
	out.NodeInfo = st.NodeInfo
	out.Addresses = st.Addresses
	out.DaemonEndpoints = st.DaemonEndpoints
	out.DeclaredFeatures = st.DeclaredFeatures
	out.Images = st.Images
	out.Phase = st.Phase
	return out
}

func mergeResources(old, ours v1.ResourceList) v1.ResourceList {
	out := old.DeepCopy()
	if out == nil {
		out = v1.ResourceList{}
	}
	for k, v := range ours {
		out[k] = v
	}
	return out
}

// statusPatch is the strategic merge patch from the node's status to the one with holdfast's
// part replaced by st, as the kubelet's PatchNodeStatus computes it: only what changed is
// sent, so fields other writers own are left alone, and no resourceVersion precondition is
// needed. Addresses are declared a merge list by type but are replaced whole, as the kubelet
// does, or an address that changed would be added beside the old one. (component-helpers'
// nodeutil.PatchNodeStatus does the same but without a context, so a hung apiserver would
// hold the status loop, and with it the agent's shutdown.)
func statusPatch(node *v1.Node, st v1.NodeStatus, ownedConditions map[v1.NodeConditionType]bool) ([]byte, error) {
	updated := withOwnedStatus(node.Status, st, ownedConditions)
	replaceAddresses := len(node.Status.Addresses) > 0 && !apiequality.Semantic.DeepEqual(node.Status.Addresses, updated.Addresses)
	diff := updated
	if replaceAddresses {
		diff.Addresses = node.Status.Addresses
	}
	p, err := patch.TwoWay(v1.Node{Status: node.Status}, v1.Node{Status: diff}, patch.Node)
	if err != nil {
		return nil, fmt.Errorf("node status patch: %w", err)
	}
	if !replaceAddresses {
		return p, nil
	}
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		return nil, fmt.Errorf("node status patch: %w", err)
	}
	status, _ := m["status"].(map[string]any)
	if status == nil {
		status = map[string]any{}
		m["status"] = status
	}
	addrs := []any{}
	for _, a := range updated.Addresses {
		addrs = append(addrs, a)
	}
	status["addresses"] = append(addrs, map[string]any{"$patch": "replace"})
	return json.Marshal(m)
}
