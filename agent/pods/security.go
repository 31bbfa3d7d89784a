package pods

import (
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// containerSecurity is the confinement of container c of pod: the container's securityContext
// over the pod's, the pod's host namespaces, and its AppArmor profile, resolved once as the
// kubelet resolves them (determineEffectiveSecurityContext) for every backend to apply.
func containerSecurity(pod *v1.Pod, c *v1.Container) runtime.Security {
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &v1.PodSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		sc = &v1.SecurityContext{}
	}
	sec := runtime.Security{
		RunAsUser:              containerOrPod(sc.RunAsUser, psc.RunAsUser),
		RunAsGroup:             containerOrPod(sc.RunAsGroup, psc.RunAsGroup),
		Privileged:             sc.Privileged != nil && *sc.Privileged,
		ReadOnlyRootFilesystem: sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem,
		// kubelet's AddNoNewPrivileges: only when allowPrivilegeEscalation is false.
		NoNewPrivileges:       sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		UnmaskedProcMount:     sc.ProcMount != nil && *sc.ProcMount == v1.UnmaskedProcMount,
		HostNetwork:           pod.Spec.HostNetwork,
		HostPID:               pod.Spec.HostPID,
		HostIPC:               pod.Spec.HostIPC,
		ShareProcessNamespace: pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace,
	}
	if nonRoot := containerOrPod(sc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot != nil && *nonRoot {
		sec.RunAsNonRoot = true
	}
	// kubelet puts fsGroup first among the supplementary groups, then supplementalGroups.
	if psc.FSGroup != nil {
		sec.SupplementalGroups = append(sec.SupplementalGroups, *psc.FSGroup)
	}
	sec.SupplementalGroups = append(sec.SupplementalGroups, psc.SupplementalGroups...)
	if caps := sc.Capabilities; caps != nil {
		sec.Capabilities = &runtime.Capabilities{}
		for _, a := range caps.Add {
			sec.Capabilities.Add = append(sec.Capabilities.Add, string(a))
		}
		for _, d := range caps.Drop {
			sec.Capabilities.Drop = append(sec.Capabilities.Drop, string(d))
		}
	}
	if p := containerOrPod(sc.SeccompProfile, psc.SeccompProfile); p != nil {
		sec.Seccomp = &runtime.Profile{Type: runtime.ProfileType(p.Type), Localhost: ptrString(p.LocalhostProfile)}
	}
	if p := appArmorProfile(pod, c); p != nil {
		sec.AppArmor = &runtime.Profile{Type: runtime.ProfileType(p.Type), Localhost: ptrString(p.LocalhostProfile)}
	}
	if len(psc.Sysctls) > 0 {
		sec.Sysctls = make(map[string]string, len(psc.Sysctls))
		for _, s := range psc.Sysctls {
			sec.Sysctls[strings.ReplaceAll(s.Name, "/", ".")] = s.Value
		}
	}
	return sec
}

// containerOrPod is the container's setting if it has one, else the pod's.
func containerOrPod[T any](container, pod *T) *T {
	if container != nil {
		return container
	}
	return pod
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// appArmorProfile is the profile kubelet asks for a container: the container's, else the
// deprecated per-container annotation, else the pod's; nil when none is set.
func appArmorProfile(pod *v1.Pod, c *v1.Container) *v1.AppArmorProfile {
	if c.SecurityContext != nil && c.SecurityContext.AppArmorProfile != nil {
		return c.SecurityContext.AppArmorProfile
	}
	if v, ok := pod.Annotations[v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix+c.Name]; ok {
		switch {
		case v == v1.DeprecatedAppArmorBetaProfileRuntimeDefault:
			return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
		case v == v1.DeprecatedAppArmorBetaProfileNameUnconfined:
			return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}
		case strings.HasPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix):
			name := strings.TrimPrefix(v, v1.DeprecatedAppArmorBetaProfileNamePrefix)
			return &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: &name}
		}
	}
	if psc := pod.Spec.SecurityContext; psc != nil && psc.AppArmorProfile != nil {
		return psc.AppArmorProfile
	}
	return nil
}
