package admission

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// ReasonUnsupported is the reason a pod is rejected with when it asks for something holdfast does
// not implement. Running it without would silently give the pod less confinement, isolation or
// behaviour than its author asked for, so it is refused instead, with the fields named.
const ReasonUnsupported = "UnsupportedPodSpec"

// unsupportedChecks each name a PodSpec field holdfast does not implement and report whether pod
// uses it. One entry per field, in the order of the README's list "PodSpec fields not supported
// yet"; implementing a field removes its entry here and its line there.
var unsupportedChecks = []struct {
	field string
	used  func(pod *v1.Pod) bool
}{
	{"spec.hostPID", func(p *v1.Pod) bool { return p.Spec.HostPID }},

	{"spec.hostIPC", func(p *v1.Pod) bool { return p.Spec.HostIPC }},

	{"spec.shareProcessNamespace", func(p *v1.Pod) bool {
		return p.Spec.ShareProcessNamespace != nil && *p.Spec.ShareProcessNamespace
	}},

	{"spec.hostUsers: false (user namespaces)", func(p *v1.Pod) bool {
		return p.Spec.HostUsers != nil && !*p.Spec.HostUsers
	}},

	{"spec.securityContext.sysctls", func(p *v1.Pod) bool {
		return p.Spec.SecurityContext != nil && len(p.Spec.SecurityContext.Sysctls) > 0
	}},

	{"spec.securityContext.fsGroup", func(p *v1.Pod) bool {
		return p.Spec.SecurityContext != nil && (p.Spec.SecurityContext.FSGroup != nil || p.Spec.SecurityContext.FSGroupChangePolicy != nil)
	}},

	{"seccompProfile type Localhost", func(p *v1.Pod) bool {
		if sc := p.Spec.SecurityContext; sc != nil && isLocalhostSeccomp(sc.SeccompProfile) {
			return true
		}
		return anyContainer(p, func(c *v1.Container) bool {
			return c.SecurityContext != nil && isLocalhostSeccomp(c.SecurityContext.SeccompProfile)
		})
	}},

	{"appArmorProfile (other than Unconfined)", func(p *v1.Pod) bool {
		if sc := p.Spec.SecurityContext; sc != nil && confinedAppArmor(sc.AppArmorProfile) {
			return true
		}
		for k, v := range p.Annotations {
			if strings.HasPrefix(k, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix) && v != v1.DeprecatedAppArmorBetaProfileNameUnconfined {
				return true
			}
		}
		return anyContainer(p, func(c *v1.Container) bool {
			return c.SecurityContext != nil && confinedAppArmor(c.SecurityContext.AppArmorProfile)
		})
	}},

	{"securityContext.procMount: Unmasked", func(p *v1.Pod) bool {
		return anyContainer(p, func(c *v1.Container) bool {
			return c.SecurityContext != nil && c.SecurityContext.ProcMount != nil && *c.SecurityContext.ProcMount == v1.UnmaskedProcMount
		})
	}},

	{"spec.readinessGates", func(p *v1.Pod) bool { return len(p.Spec.ReadinessGates) > 0 }},

	{"spec.activeDeadlineSeconds", func(p *v1.Pod) bool { return p.Spec.ActiveDeadlineSeconds != nil }},

	{"spec.imagePullSecrets", func(p *v1.Pod) bool { return len(p.Spec.ImagePullSecrets) > 0 }},

	{"volumeMounts[].mountPropagation (other than None)", func(p *v1.Pod) bool {
		return anyContainer(p, func(c *v1.Container) bool {
			for _, m := range c.VolumeMounts {
				if m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone {
					return true
				}
			}
			return false
		})
	}},

	{"spec.ephemeralContainers", func(p *v1.Pod) bool { return len(p.Spec.EphemeralContainers) > 0 }},

	{"spec.runtimeClassName", func(p *v1.Pod) bool {
		return p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName != ""
	}},

	{"spec.resourceClaims (dynamic resource allocation)", func(p *v1.Pod) bool { return len(p.Spec.ResourceClaims) > 0 }},
}

// Unsupported returns the PodSpec fields pod uses that holdfast does not implement, in a stable
// order; empty when holdfast can run the pod as written.
func Unsupported(pod *v1.Pod) []string {
	var fields []string
	for _, c := range unsupportedChecks {
		if c.used(pod) {
			fields = append(fields, c.field)
		}
	}
	return fields
}

// checkSupported rejects a pod that uses a field holdfast does not implement.
func checkSupported(pod *v1.Pod) Result {
	fields := Unsupported(pod)
	if len(fields) == 0 {
		return Admit
	}
	return Result{Reason: ReasonUnsupported, Message: fmt.Sprintf(
		"holdfast does not implement %s; the pod would run with less than it asks for (see the README's list of PodSpec fields not supported)",
		strings.Join(fields, ", "))}
}

// anyContainer reports whether f holds for any init or app container of p.
func anyContainer(p *v1.Pod, f func(c *v1.Container) bool) bool {
	for i := range p.Spec.InitContainers {
		if f(&p.Spec.InitContainers[i]) {
			return true
		}
	}
	for i := range p.Spec.Containers {
		if f(&p.Spec.Containers[i]) {
			return true
		}
	}
	return false
}

func isLocalhostSeccomp(p *v1.SeccompProfile) bool {
	return p != nil && p.Type == v1.SeccompProfileTypeLocalhost
}

func confinedAppArmor(p *v1.AppArmorProfile) bool {
	return p != nil && p.Type != v1.AppArmorProfileTypeUnconfined
}
