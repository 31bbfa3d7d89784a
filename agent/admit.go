package agent

import (
	"context"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/policy"
)

// admitter is the node's admission chain: kubelet's built-in checks (resources, node
// affinity) first, then the gateway owner's Wasm admission policies.
type admitter struct {
	nodeName   string
	nodeLabels map[string]string
	storageDir string
	maxPods    int
	sysctls    []string       // sysctls pods may set: kubelet's safe set and allowedUnsafeSysctls
	appArmor   bool           // the host enforces AppArmor profiles
	policies   policyAdmitter // nil: no policies configured
	policyErr  error          // the policy configuration could not be loaded: refuse new pods
	// pressure refuses pods under node pressure (kubelet's eviction admit handler); nil: none.
	pressure interface {
		Admit(pod *v1.Pod) admission.Result
	}
	// reserved is what allocatable leaves out of the capacity; nil: nothing.
	reserved func(capacity v1.ResourceList) v1.ResourceList
}

// policyAdmitter is the part of the Wasm policy manager admission uses.
type policyAdmitter interface {
	Admit(ctx context.Context, pod *v1.Pod, node policy.NodeInfo) policy.Decision
}

func (a *admitter) Admit(ctx context.Context, pod *v1.Pod, admitted []*v1.Pod) admission.Result {
	// Under pressure first, as kubelet runs its eviction admit handler first.
	if a.pressure != nil {
		if r := a.pressure.Admit(pod); !r.Admitted {
			return r
		}
	}
	allocatable, err := node.Capacity(a.storageDir, a.maxPods)
	if err != nil {
		return admission.Result{Reason: admission.ReasonUnexpectedErr, Message: "measure node resources: " + err.Error()}
	}
	if a.reserved != nil {
		allocatable = node.Allocatable(allocatable, a.reserved(allocatable))
	}
	labels := node.Labels(a.nodeName, a.nodeLabels)
	if r := admission.Check(pod, admission.Node{Labels: labels, Allocatable: allocatable, Sysctls: a.sysctls, AppArmor: a.appArmor}, admitted); !r.Admitted {
		return r
	}
	if a.policyErr != nil {
		return admission.Result{Reason: "PolicyConfigError", Message: "the node's policy configuration could not be loaded: " + a.policyErr.Error()}
	}
	if a.policies != nil {
		d := a.policies.Admit(ctx, pod, policy.NodeInfo{Name: a.nodeName, Labels: labels, Allocatable: allocatable})
		if !d.Allowed {
			return admission.Result{Reason: d.Reason, Message: d.Message}
		}
	}
	return admission.Admit
}

// AdmitResize judges a resize against the node's allocatable, as Admit measures it, and the
// other pods' allocated resources (pods.ResizeAdmitter). Neither the pressure check nor the
// policies judge it: the pod runs already, and a resize is not a new pod.
func (a *admitter) AdmitResize(pod *v1.Pod, others []*v1.Pod) admission.ResizeVerdict {
	allocatable, err := node.Capacity(a.storageDir, a.maxPods)
	if err != nil {
		return admission.ResizeVerdict{Reason: v1.PodReasonDeferred, Message: "measure node resources: " + err.Error()}
	}
	if a.reserved != nil {
		allocatable = node.Allocatable(allocatable, a.reserved(allocatable))
	}
	return admission.CheckResize(pod, allocatable, others)
}

// allowedSysctls is the node's sysctl allowlist, as kubelet builds it: the safe sysctls this
// kernel namespaces, then the configuration's allowedUnsafeSysctls.
func allowedSysctls(cfg config.Config) []string {
	var uts unix.Utsname
	release := ""
	if unix.Uname(&uts) == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	return append(admission.SafeSysctls(release), cfg.AllowedUnsafeSysctls...)
}
