package main

import (
	"encoding/json"
	"testing"

	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name     string
		spec     string
		settings string
		reason   string // "" = allowed
	}{
		{"plain", `{"containers":[{"name":"a","image":"x"}]}`, `{}`, ""},
		{"privileged", `{"containers":[{"name":"a","securityContext":{"privileged":true}}]}`, `{}`, "Privileged"},
		{"privileged init", `{"initContainers":[{"name":"i","securityContext":{"privileged":true}}],"containers":[{"name":"a"}]}`, `{}`, "Privileged"},
		{"not privileged explicitly", `{"containers":[{"name":"a","securityContext":{"privileged":false}}]}`, `{}`, ""},
		{"cap add", `{"containers":[{"name":"a","securityContext":{"capabilities":{"add":["SYS_ADMIN"]}}}]}`, `{}`, "Privileged"},
		{"cap allowed", `{"containers":[{"name":"a","securityContext":{"capabilities":{"add":["NET_BIND_SERVICE"]}}}]}`, `{"allowedCapabilities":["NET_BIND_SERVICE"]}`, ""},
		{"hostPath", `{"containers":[{"name":"a"}],"volumes":[{"name":"v","hostPath":{"path":"/etc"}}]}`, `{}`, "HostPath"},
		{"hostPath dotdot", `{"containers":[{"name":"a"}],"volumes":[{"name":"v","hostPath":{"path":"/var/log/app/../../../etc"}}]}`, `{"allowedHostPaths":["/var/log/app"]}`, "HostPath"},
		{"hostPath allowed", `{"containers":[{"name":"a"}],"volumes":[{"name":"v","hostPath":{"path":"/var/log/app/x"}}]}`, `{"allowedHostPaths":["/var/log/app"]}`, ""},
		{"hostNetwork", `{"hostNetwork":true,"containers":[{"name":"a"}]}`, `{}`, "HostNamespace"},
		{"unknown setting", `{"containers":[{"name":"a"}]}`, `{"allowedHostPath":["/x"]}`, "InvalidSettings"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(`{"pod":{"spec":` + tc.spec + `},"node":{"name":"n"},"settings":` + tc.settings + `}`)
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
