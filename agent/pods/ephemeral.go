package pods

import (
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// ephemeralContainers are the pod's ephemeral containers (kubectl debug) as containers: the
// API declares their common fields as a Container's, field for field, so the conversion is
// the kubelet's own.
func ephemeralContainers(pod *v1.Pod) []*v1.Container {
	out := make([]*v1.Container, 0, len(pod.Spec.EphemeralContainers))
	for i := range pod.Spec.EphemeralContainers {
		out = append(out, (*v1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	return out
}

// isEphemeral says name is one of the pod's ephemeral containers.
func isEphemeral(pod *v1.Pod, name string) bool {
	for i := range pod.Spec.EphemeralContainers {
		if pod.Spec.EphemeralContainers[i].Name == name {
			return true
		}
	}
	return false
}

// planEphemeral starts each ephemeral container once, as the kubelet does: before the init
// containers (so a pod stuck in its init phase can be debugged), never restarted. One with a
// targetContainerName joins that container's PID namespace, so it waits until it runs.
func (p *plan) planEphemeral(pod *v1.Pod, byName map[string][]runtime.Container) {
	for i, c := range ephemeralContainers(pod) {
		attempts := byName[c.Name]
		if len(attempts) > 0 && attempts[len(attempts)-1].State != runtime.StateCreated {
			continue // started once: ephemeral containers are never restarted
		}
		s := startAction{container: c}
		if len(attempts) > 0 {
			s.attempt = attempts[len(attempts)-1].Attempt
		}
		if target := pod.Spec.EphemeralContainers[i].TargetContainerName; target != "" {
			t := byName[target]
			if len(t) == 0 || t[len(t)-1].State != runtime.StateRunning || t[len(t)-1].Pid == 0 {
				continue // waits in ContainerCreating; the target's start syncs the pod again
			}
			s.pidNamespaceOf, s.pidNamespaceOfID = t[len(t)-1].Pid, t[len(t)-1].ID
		}
		p.start = append(p.start, s)
	}
}
