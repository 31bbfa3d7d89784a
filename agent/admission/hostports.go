package admission

import (
	v1 "k8s.io/api/core/v1"
)

// ReasonNodePorts is the reason a pod whose hostPort is taken is rejected with, as the kubelet's
// GeneralPredicates name it.
const ReasonNodePorts = "NodePorts"

// checkHostPorts refuses a pod asking for a hostPort (with its protocol and host IP) another
// admitted pod holds, with the kubelet's reason and message (the scheduler's NodePorts filter,
// run by the kubelet at admission). A host IP of 0.0.0.0 (or none) conflicts with every IP.
func checkHostPorts(pod *v1.Pod, admitted []*v1.Pod) Result {
	used := map[string]map[hostPortKey]bool{} // host IP -> protocol/port
	for _, p := range admitted {
		for _, cp := range hostPorts(p) {
			ip, key := cp.sanitized()
			if used[ip] == nil {
				used[ip] = map[hostPortKey]bool{}
			}
			used[ip][key] = true
		}
	}
	for _, cp := range hostPorts(pod) {
		ip, key := cp.sanitized()
		conflict := false
		if ip == bindAll {
			for _, ports := range used {
				conflict = conflict || ports[key]
			}
		} else {
			conflict = used[bindAll][key] || used[ip][key]
		}
		if conflict {
			return Result{Reason: ReasonNodePorts, Message: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"}
		}
	}
	return Admit
}

const bindAll = "0.0.0.0"

type hostPortKey struct {
	protocol string
	port     int32
}

type hostPort v1.ContainerPort

func (p hostPort) sanitized() (string, hostPortKey) {
	ip, proto := p.HostIP, string(p.Protocol)
	if ip == "" {
		ip = bindAll
	}
	if proto == "" {
		proto = string(v1.ProtocolTCP)
	}
	return ip, hostPortKey{proto, p.HostPort}
}

// hostPorts are the host ports a pod holds while it runs: those of its containers and of its
// sidecars (init containers that keep running), as the scheduler's GetHostPorts counts them.
func hostPorts(pod *v1.Pod) []hostPort {
	var out []hostPort
	add := func(c *v1.Container) {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				out = append(out, hostPort(p))
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}
