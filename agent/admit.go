package agent

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/node"
)

// admitter is the node's admission chain: kubelet's built-in checks (resources, node
// affinity) first, then the gateway owner's Wasm admission policies.
type admitter struct {
	nodeName   string
	nodeLabels map[string]string
	storageDir string
	maxPods    int
	policies   policyAdmitter // nil: no policies configured
}

// policyAdmitter is the part of the Wasm policy manager admission uses.
type policyAdmitter interface {
	Admit(ctx context.Context, pod *v1.Pod, labels map[string]string, allocatable v1.ResourceList) admission.Result
}

func (a *admitter) Admit(ctx context.Context, pod *v1.Pod, admitted []*v1.Pod) admission.Result {
	allocatable, err := node.Capacity(a.storageDir, a.maxPods)
	if err != nil {
		return admission.Result{Reason: admission.ReasonUnexpectedErr, Message: "measure node resources: " + err.Error()}
	}
	labels := node.Labels(a.nodeName, a.nodeLabels)
	if r := admission.Check(pod, admission.Node{Labels: labels, Allocatable: allocatable}, admitted); !r.Admitted {
		return r
	}
	if a.policies != nil {
		return a.policies.Admit(ctx, pod, labels, allocatable)
	}
	return admission.Admit
}
