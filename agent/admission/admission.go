// Package admission decides whether the node takes a pod, as kubelet's admission handlers do:
// the pod must fit the node's allocatable resources beside the pods already admitted, and its
// nodeSelector and required node affinity must match the node's labels. The checks are pure
// functions; the pod manager runs them once per pod and records the decision, so a running
// pod is never judged again after an agent restart.
package admission

import (
	"fmt"
	"runtime"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Reasons a pod is rejected with, named as kubelet names them.
const (
	ReasonOutOfCPU      = "OutOfcpu"
	ReasonOutOfMemory   = "OutOfmemory"
	ReasonOutOfPods     = "OutOfpods"
	ReasonNodeAffinity  = "NodeAffinity"
	ReasonUnexpectedErr = "UnexpectedAdmissionError"
	// ReasonPodOSNotSupported: spec.os.name names another OS than the node's.
	ReasonPodOSNotSupported = "PodOSNotSupported"
	// ReasonPodOSSelector: the pod's own kubernetes.io/os label names another OS.
	ReasonPodOSSelector = "PodOSSelectorNodeLabelDoesNotMatch"
)

// Result is an admission decision.
type Result struct {
	Admitted bool
	Reason   string
	Message  string
}

// Admit is the outcome for an admitted pod.
var Admit = Result{Admitted: true}

// Node is what admission knows about the node.
type Node struct {
	Labels      map[string]string
	Allocatable v1.ResourceList
	// Sysctls are the sysctls (names, or patterns ending in "*") pods may set: kubelet's safe
	// set (SafeSysctls) and the configuration's allowedUnsafeSysctls.
	Sysctls []string
	// AppArmor says the host enforces AppArmor profiles.
	AppArmor bool
}

// Check runs the built-in checks for pod, given the pods already admitted and running.
func Check(pod *v1.Pod, node Node, admitted []*v1.Pod) Result {
	if r := checkOS(pod); !r.Admitted {
		return r
	}
	if r := checkSupported(pod); !r.Admitted {
		return r
	}
	if r := checkSysctls(pod, node.Sysctls); !r.Admitted {
		return r
	}
	if r := checkAppArmor(pod, node.AppArmor); !r.Admitted {
		return r
	}
	if r := checkAffinity(pod, node); !r.Admitted {
		return r
	}
	if r := checkResources(pod, node, admitted); !r.Admitted {
		return r
	}
	return checkHostPorts(pod, admitted)
}

// checkOS rejects a pod meant for another operating system, as kubelet's predicate admission
// does before anything else: by spec.os.name, and by the pod's own kubernetes.io/os label
// (kubelet compares the label with the node's, which is always runtime.GOOS).
func checkOS(pod *v1.Pod) Result {
	if os, ok := pod.Labels[v1.LabelOSStable]; ok && os != runtime.GOOS {
		return Result{Reason: ReasonPodOSSelector, Message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"}
	}
	if pod.Spec.OS != nil && string(pod.Spec.OS.Name) != runtime.GOOS {
		return Result{Reason: ReasonPodOSNotSupported, Message: "Failed to admit pod as the OS field doesn't match node OS"}
	}
	return Admit
}

func checkAffinity(pod *v1.Pod, node Node) Result {
	n := &v1.Node{}
	n.Labels = node.Labels
	if len(pod.Spec.NodeSelector) > 0 {
		if !labels.SelectorFromSet(pod.Spec.NodeSelector).Matches(labels.Set(node.Labels)) {
			return Result{Reason: ReasonNodeAffinity, Message: fmt.Sprintf("Predicate NodeAffinity failed: node labels do not match the pod's nodeSelector %v", pod.Spec.NodeSelector)}
		}
	}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(n)
	if err != nil {
		return Result{Reason: ReasonUnexpectedErr, Message: fmt.Sprintf("evaluate node affinity: %v", err)}
	}
	if !ok {
		return Result{Reason: ReasonNodeAffinity, Message: "Predicate NodeAffinity failed: node does not match the pod's required node affinity"}
	}
	return Admit
}

func checkResources(pod *v1.Pod, node Node, admitted []*v1.Pod) Result {
	if max, ok := node.Allocatable[v1.ResourcePods]; ok && int64(len(admitted)+1) > max.Value() {
		return Result{Reason: ReasonOutOfPods, Message: fmt.Sprintf("Node didn't have enough resource: pods, requested: 1, used: %d, capacity: %d", len(admitted), max.Value())}
	}
	want := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	used := v1.ResourceList{}
	for _, p := range admitted {
		for name, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}
	for _, r := range []struct {
		name   v1.ResourceName
		reason string
	}{{v1.ResourceCPU, ReasonOutOfCPU}, {v1.ResourceMemory, ReasonOutOfMemory}} {
		req, ok := want[r.name]
		if !ok || req.IsZero() {
			continue
		}
		capacity, ok := node.Allocatable[r.name]
		if !ok {
			continue
		}
		u := used[r.name]
		total := u.DeepCopy()
		total.Add(req)
		if total.Cmp(capacity) > 0 {
			return Result{Reason: r.reason, Message: fmt.Sprintf("Node didn't have enough resource: %s, requested: %s, used: %s, capacity: %s",
				r.name, quantity(r.name, req), quantity(r.name, u), quantity(r.name, capacity))}
		}
	}
	return Admit
}

// quantity prints cpu in millicores and the rest in bytes, as kubelet's messages do.
func quantity(name v1.ResourceName, q resource.Quantity) string {
	if name == v1.ResourceCPU {
		return fmt.Sprint(q.MilliValue())
	}
	return fmt.Sprint(q.Value())
}

// Rejected builds the failed status of a rejected pod, with kubelet's message form.
func Rejected(r Result) v1.PodStatus {
	msg := r.Message
	if !strings.HasPrefix(msg, "Pod was rejected") {
		msg = "Pod was rejected: " + msg
	}
	return v1.PodStatus{Phase: v1.PodFailed, Reason: r.Reason, Message: msg}
}
