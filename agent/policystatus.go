package agent

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/policy"
)

// Reasons of the node's policy event and condition.
const (
	// ReasonPolicyLoadFailed: a policy's module failed to pull or to load (the Node event, and
	// the condition's reason while an older module serves).
	ReasonPolicyLoadFailed = "PolicyLoadFailed"
	// ReasonPolicyNotLoaded: a policy has no module serving; its failurePolicy decides.
	ReasonPolicyNotLoaded = "PolicyNotLoaded"
	// ReasonPolicyConfigInvalid: policies.yaml could not be used.
	ReasonPolicyConfigInvalid = "PolicyConfigInvalid"
	// ReasonPoliciesLoaded: every configured policy serves its configured module.
	ReasonPoliciesLoaded = "PoliciesLoaded"
)

// nodeRef is the Node as the object of the agent's events.
func (a *Agent) nodeRef() *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Node", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}
}

// policyConditions is the HoldfastPoliciesReady condition: none on a node without policies;
// False when policies.yaml is unusable or a policy does not serve the module it is configured
// with (an older one serving, or none); True otherwise. openErr is the error of opening the
// policies at start, if any.
func policyConditions(pm *policy.Manager, openErr error) []v1.NodeCondition {
	if pm == nil {
		return policiesReady(nil, nil, false, openErr)
	}
	statuses, configErr := pm.Status()
	return policiesReady(statuses, configErr, true, openErr)
}

// policiesReady computes the condition from the policies' statuses; configured is false on a
// node without policies.
func policiesReady(statuses []policy.Status, configErr error, configured bool, openErr error) []v1.NodeCondition {
	cond := func(ok bool, reason, msg string) []v1.NodeCondition {
		s := v1.ConditionFalse
		if ok {
			s = v1.ConditionTrue
		}
		return []v1.NodeCondition{{Type: node.ConditionPoliciesReady, Status: s, Reason: reason, Message: msg}}
	}
	if openErr != nil {
		return cond(false, ReasonPolicyConfigInvalid, fmt.Sprintf("new pods are refused until the configuration is fixed and holdfast restarted: %v", openErr))
	}
	if !configured {
		return nil
	}
	if configErr != nil {
		return cond(false, ReasonPolicyConfigInvalid, fmt.Sprintf("%v; the previous configuration keeps serving", configErr))
	}
	reason := ""
	var problems []string
	for _, st := range statuses {
		switch {
		case !st.Loaded:
			reason = ReasonPolicyNotLoaded
			problems = append(problems, fmt.Sprintf("policy %q is not loaded (failurePolicy %s applies): %s", st.Name, st.FailurePolicy, st.Error))
		case st.Error != "":
			if reason == "" {
				reason = ReasonPolicyLoadFailed
			}
			problems = append(problems, fmt.Sprintf("%s; module %s (%s) keeps serving", st.Error, st.Module, st.Digest))
		}
	}
	if len(problems) > 0 {
		return cond(false, reason, strings.Join(problems, "; "))
	}
	// Each module's digest is named, so that a fleet sees from the Node which version serves.
	loaded := make([]string, 0, len(statuses))
	for _, st := range statuses {
		loaded = append(loaded, fmt.Sprintf("%q %s", st.Name, st.Digest))
	}
	return cond(true, ReasonPoliciesLoaded, "policies loaded: "+strings.Join(loaded, ", "))
}
