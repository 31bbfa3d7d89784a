package agent

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/policy"
)

func TestPoliciesReady(t *testing.T) {
	serving := policy.Status{Name: "regs", Module: "oci://r/p@sha256:aa", Digest: "sha256:11", Loaded: true, FailurePolicy: policy.Fail}
	oldServing := serving
	oldServing.Error = `policy "regs": module oci://r/p@sha256:bb: invalid magic number`
	none := policy.Status{Name: "caps", Module: "caps.wasm", FailurePolicy: policy.Ignore, Error: "open caps.wasm: no such file"}
	cases := []struct {
		name       string
		statuses   []policy.Status
		configErr  error
		configured bool
		openErr    error
		status     v1.ConditionStatus // "" = no condition
		reason     string
		mention    []string
	}{
		{"no policies", nil, nil, false, nil, "", "", nil},
		{"all loaded", []policy.Status{serving}, nil, true, nil, v1.ConditionTrue, ReasonPoliciesLoaded, []string{`"regs" sha256:11`}},
		{"an older module serves", []policy.Status{oldServing}, nil, true, nil, v1.ConditionFalse, ReasonPolicyLoadFailed,
			[]string{"sha256:bb", "invalid magic number", "oci://r/p@sha256:aa (sha256:11) keeps serving"}},
		{"none serves wins over an older one", []policy.Status{oldServing, none}, nil, true, nil, v1.ConditionFalse, ReasonPolicyNotLoaded,
			[]string{`policy "caps" is not loaded (failurePolicy Ignore applies)`, "no such file", "sha256:bb"}},
		{"policies.yaml broken after start", []policy.Status{serving}, errors.New("parse policies.yaml: bad"), true, nil, v1.ConditionFalse, ReasonPolicyConfigInvalid,
			[]string{"parse policies.yaml: bad", "previous configuration keeps serving"}},
		{"policies.yaml broken at start", nil, nil, false, errors.New("parse policies.yaml: bad"), v1.ConditionFalse, ReasonPolicyConfigInvalid,
			[]string{"new pods are refused", "parse policies.yaml: bad"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := policiesReady(tc.statuses, tc.configErr, tc.configured, tc.openErr)
			if tc.status == "" {
				if len(got) != 0 {
					t.Fatalf("conditions %+v, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0].Type != node.ConditionPoliciesReady || got[0].Status != tc.status || got[0].Reason != tc.reason {
				t.Fatalf("conditions %+v, want %s %s", got, tc.status, tc.reason)
			}
			for _, m := range tc.mention {
				if !strings.Contains(got[0].Message, m) {
					t.Errorf("message %q does not mention %q", got[0].Message, m)
				}
			}
		})
	}
}
