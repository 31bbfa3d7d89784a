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
	// No pause container holds a pod-wide PID namespace (see the README), and borrowing the first
	// container's is not sound: when it exits or restarts, the kernel kills every process of the
	// namespace, the other containers with it.
	{"spec.shareProcessNamespace", func(p *v1.Pod) bool {
		return p.Spec.ShareProcessNamespace != nil && *p.Spec.ShareProcessNamespace
	}},

	{"spec.hostUsers: false (user namespaces)", func(p *v1.Pod) bool {
		return p.Spec.HostUsers != nil && !*p.Spec.HostUsers
	}},

	// The API accepts Unmasked only with hostUsers: false (a user namespace), refused above; an
	// unmasked /proc in the host's user namespace is what the validation exists to prevent.
	{"securityContext.procMount: Unmasked", func(p *v1.Pod) bool {
		return anyContainer(p, func(c *v1.Container) bool {
			return c.SecurityContext != nil && c.SecurityContext.ProcMount != nil && *c.SecurityContext.ProcMount == v1.UnmaskedProcMount
		})
	}},

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

	{"spec.runtimeClassName", func(p *v1.Pod) bool {
		return p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName != ""
	}},

	{"spec.resourceClaims (dynamic resource allocation)", func(p *v1.Pod) bool { return len(p.Spec.ResourceClaims) > 0 }},

	// Per-container restart policies and rules (ContainerRestartRules, beta and on by default)
	// are implemented for app containers with the Restart action. RestartAllContainers is an
	// alpha action; init containers other than sidecars restart by the pod's policy only.
	{"restartPolicyRules with an action other than Restart, or on an init container", func(p *v1.Pod) bool {
		for i := range p.Spec.InitContainers {
			if len(p.Spec.InitContainers[i].RestartPolicyRules) > 0 {
				return true
			}
		}
		return anyContainer(p, func(c *v1.Container) bool {
			for _, r := range c.RestartPolicyRules {
				if r.Action != v1.ContainerRestartRuleActionRestart {
					return true
				}
			}
			return false
		})
	}},
	{"initContainers[].restartPolicy other than Always", func(p *v1.Pod) bool {
		for i := range p.Spec.InitContainers {
			if rp := p.Spec.InitContainers[i].RestartPolicy; rp != nil && *rp != v1.ContainerRestartPolicyAlways {
				return true
			}
		}
		return false
	}},

	// containerd's runc shim gives a process whose output goes to a logging binary (holdfast's
	// logger, which keeps logs with the shim across agent restarts) a stdin only through a
	// terminal; without one the process would silently read nothing.
	{"stdin: true without tty: true", func(p *v1.Pod) bool {
		return anyContainer(p, func(c *v1.Container) bool { return c.Stdin && !c.TTY })
	}},
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

// anyContainer reports whether f holds for any init, app or ephemeral container of p.
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
	for i := range p.Spec.EphemeralContainers {
		if f((*v1.Container)(&p.Spec.EphemeralContainers[i].EphemeralContainerCommon)) {
			return true
		}
	}
	return false
}

func confinedAppArmor(p *v1.AppArmorProfile) bool {
	return p != nil && p.Type != v1.AppArmorProfileTypeUnconfined
}
