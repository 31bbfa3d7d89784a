package main

import (
	"encoding/json"
	"testing"

	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

func TestValidate(t *testing.T) {
	settings := `{"registries":["docker.io/library","registry.local:5000"]}`
	cases := []struct {
		name    string
		images  []string
		allowed bool
	}{
		{"official image", []string{"nginx:1.27"}, true},
		{"local registry", []string{"registry.local:5000/team/app@sha256:abcd"}, true},
		{"other docker hub user", []string{"evil/nginx"}, false},
		{"prefix is not a path boundary", []string{"docker.io/library-evil/x"}, false},
		{"one bad container among good", []string{"nginx", "quay.io/x/y:1"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var containers []map[string]string
			for i, img := range tc.images {
				containers = append(containers, map[string]string{"name": string(rune('a' + i)), "image": img})
			}
			in, _ := json.Marshal(map[string]any{
				"pod":      map[string]any{"spec": map[string]any{"containers": containers}},
				"node":     map[string]any{"name": "n"},
				"settings": json.RawMessage(settings),
			})
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
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (%s)", resp.Allowed, tc.allowed, resp.Message)
			}
			if !resp.Allowed && resp.Reason != "RegistryNotAllowed" {
				t.Fatalf("reason = %q", resp.Reason)
			}
		})
	}
}
