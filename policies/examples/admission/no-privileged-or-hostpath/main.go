// Command no-privileged-or-hostpath is a holdfast admission policy: it denies
// pods with a privileged container, a container allowed to escalate
// privileges explicitly, added capabilities outside an allow list, host
// namespaces, or hostPath volumes outside an allow list.
//
// Settings (all optional):
//
//	allowedHostPaths: ["/var/log/app"]   # hostPath prefixes that stay allowed
//	allowedCapabilities: ["NET_BIND_SERVICE"]
//	allowHostNetwork: false
package main

import (
	"fmt"
	"path"
	"slices"
	"strings"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

type settings struct {
	AllowedHostPaths    []string `json:"allowedHostPaths"`
	AllowedCapabilities []string `json:"allowedCapabilities"`
	AllowHostNetwork    bool     `json:"allowHostNetwork"`
}

func init() { admission.Handle(validate) }

func main() {}

func validate(req *sdk.AdmissionRequest) sdk.AdmissionResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return admission.Deny("InvalidSettings", "no-privileged-or-hostpath: settings: "+err.Error())
	}
	spec := req.Pod.Spec
	if spec.HostPID || spec.HostIPC {
		return admission.Deny("HostNamespace", "the pod shares the host's PID or IPC namespace")
	}
	if spec.HostNetwork && !s.AllowHostNetwork {
		return admission.Deny("HostNamespace", "the pod uses the host's network namespace")
	}
	for _, c := range spec.AllContainers() {
		sc := c.SecurityContext
		if sc == nil {
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			return admission.Deny("Privileged", fmt.Sprintf("container %q is privileged", c.Name))
		}
		if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
			return admission.Deny("Privileged", fmt.Sprintf("container %q allows privilege escalation", c.Name))
		}
		if sc.Capabilities != nil {
			for _, capName := range sc.Capabilities.Add {
				name := strings.TrimPrefix(strings.ToUpper(capName), "CAP_")
				if !slices.Contains(s.AllowedCapabilities, name) {
					return admission.Deny("Privileged", fmt.Sprintf("container %q adds capability %s", c.Name, capName))
				}
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		if !hostPathAllowed(v.HostPath.Path, s.AllowedHostPaths) {
			return admission.Deny("HostPath", fmt.Sprintf("volume %q mounts host path %s", v.Name, v.HostPath.Path))
		}
	}
	return admission.Allow()
}

func hostPathAllowed(p string, allowed []string) bool {
	p = path.Clean("/" + p)
	for _, a := range allowed {
		a = path.Clean("/" + a)
		if p == a || strings.HasPrefix(p, a+"/") {
			return true
		}
	}
	return false
}
