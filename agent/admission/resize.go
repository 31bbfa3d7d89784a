package admission

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// ResizeVerdict is the node's answer to a resize (new resources for a running pod's
// containers), as the kubelet's allocation manager gives it: allocate now, later (Deferred:
// the other pods' allocations leave no room now), or never (Infeasible).
type ResizeVerdict struct {
	// Fit: the desired resources are allocated now.
	Fit bool
	// Reason is v1.PodReasonDeferred or v1.PodReasonInfeasible when it does not fit.
	Reason  string
	Message string
}

// CheckResize judges pod's desired resources (its spec) against the node's allocatable and
// the resources allocated to the other admitted pods (others, with their allocated resources
// in their specs). Requests beyond the node's allocatable on their own can never fit:
// Infeasible, with the kubelet's message (the kubelet up to 1.36; a 1.37 apiserver refuses
// such a resize itself, PodResizeValidator, so a gateway sees it only from an older control
// plane or after its allocatable shrank). Requests that fit the node but not beside the
// others' allocations are Deferred, with the node's admission message, and tried again when
// resources are freed. The pod count is not judged: the pod is already on the node.
func CheckResize(pod *v1.Pod, allocatable v1.ResourceList, others []*v1.Pod) ResizeVerdict {
	want := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	for _, name := range []v1.ResourceName{v1.ResourceMemory, v1.ResourceCPU} {
		req, capacity := want[name], allocatable[name]
		if _, ok := allocatable[name]; ok && req.Cmp(capacity) > 0 {
			return ResizeVerdict{Reason: v1.PodReasonInfeasible,
				Message: fmt.Sprintf("Node didn't have enough capacity: %s, requested: %s, capacity: %s", name, quantity(name, req), quantity(name, capacity))}
		}
	}
	node := Node{Allocatable: allocatable.DeepCopy()}
	delete(node.Allocatable, v1.ResourcePods)
	if r := checkResources(pod, node, others); !r.Admitted {
		return ResizeVerdict{Reason: v1.PodReasonDeferred, Message: r.Message}
	}
	return ResizeVerdict{Fit: true}
}
