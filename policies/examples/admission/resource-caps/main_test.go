package main

import (
	"encoding/json"
	"testing"

	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name       string
		containers string
		settings   string
		reason     string
	}{
		{"under caps", `[{"name":"a","resources":{"limits":{"cpu":"500m","memory":"256Mi"}}},{"name":"b","resources":{"limits":{"cpu":"1","memory":"512Mi"}}}]`, `{"maxCPU":"2","maxMemory":"1Gi"}`, ""},
		{"cpu sum over", `[{"name":"a","resources":{"limits":{"cpu":"1500m"}}},{"name":"b","resources":{"limits":{"cpu":"600m"}}}]`, `{"maxCPU":"2"}`, "ResourceCapExceeded"},
		{"memory over via request", `[{"name":"a","resources":{"requests":{"memory":"2Gi"}}}]`, `{"maxMemory":"1Gi"}`, "ResourceCapExceeded"},
		{"limit required", `[{"name":"a","resources":{"limits":{"cpu":"1"}}}]`, `{"requireLimits":true}`, "LimitRequired"},
		{"node fraction", `[{"name":"a","resources":{"limits":{"cpu":"3","memory":"1Mi"}}}]`, `{"maxFractionOfNode":0.5}`, "ResourceCapExceeded"},
		{"bad quantity", `[{"name":"a","resources":{"limits":{"cpu":"lots"}}}]`, `{}`, "InvalidResources"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(`{"pod":{"spec":{"containers":` + tc.containers + `}},"node":{"name":"n","allocatable":{"cpu":"4","memory":"8Gi"}},"settings":` + tc.settings + `}`)
			out, err := admission.Evaluate(in)
			if err != nil {
				t.Fatal(err)
			}
			var resp struct {
				Allowed bool
				Reason  string
				Message string
			}
			if err := json.Unmarshal(out, &resp); err != nil {
				t.Fatal(err)
			}
			if (tc.reason == "") != resp.Allowed || (tc.reason != "" && resp.Reason != tc.reason) {
				t.Fatalf("got allowed=%v reason=%q (%s), want reason %q", resp.Allowed, resp.Reason, resp.Message, tc.reason)
			}
		})
	}
}
