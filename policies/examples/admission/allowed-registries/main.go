// Command allowed-registries is a holdfast admission policy: it admits a pod
// only if every image (init, regular and ephemeral containers) comes from an
// allowed registry or repository prefix.
//
// Settings:
//
//	registries: ["docker.io/library", "registry.local:5000"]
//
// An entry matches the fully qualified image name ("nginx" is
// "docker.io/library/nginx:latest") on a path boundary: "docker.io/library"
// allows "docker.io/library/nginx" but not "docker.io/library-evil/x".
package main

import (
	"fmt"
	"strings"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

type settings struct {
	Registries []string `json:"registries"`
}

func init() { admission.Handle(validate) }

func main() {}

func validate(req *sdk.AdmissionRequest) sdk.AdmissionResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return admission.Deny("InvalidSettings", "allowed-registries: settings: "+err.Error())
	}
	if len(s.Registries) == 0 {
		return admission.Deny("InvalidSettings", "allowed-registries: settings.registries is empty, so no image could be allowed")
	}
	for _, c := range req.Pod.Spec.AllContainers() {
		ref := sdk.ParseImage(c.Image)
		name := ref.Registry + "/" + ref.Repository
		if !allowed(name, s.Registries) {
			return admission.Deny("RegistryNotAllowed",
				fmt.Sprintf("container %q uses image %q from %s, which is not in the allowed registries %v", c.Name, c.Image, ref.Registry, s.Registries))
		}
	}
	return admission.Allow()
}

func allowed(name string, prefixes []string) bool {
	for _, p := range prefixes {
		p = strings.TrimSuffix(p, "/")
		if name == p || strings.HasPrefix(name, p+"/") {
			return true
		}
	}
	return false
}
