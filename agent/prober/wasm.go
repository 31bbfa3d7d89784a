package prober

import (
	"context"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/policy"
)

// PolicyProber runs a Wasm probe policy; *policy.Manager is one.
type PolicyProber interface {
	Probe(ctx context.Context, policyName string, target policy.ProbeTarget) (success bool, message string, err error)
}

// WasmHandler runs the probes a pod hands to a Wasm probe policy by annotation (see
// policy.ParseProbeAnnotations): the policy judges the container, reaching it only through
// what its grants allow: the pod's IP and declared ports, and files of the container's root
// filesystem (/proc/<pid>/root, where its volumes are mounted too). The probe's timing
// fields apply unchanged; its own handler (the exec placeholder) is not run.
type WasmHandler struct {
	Policies PolicyProber
}

// Probe calls the policy named by t's annotation.
func (h *WasmHandler) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	name, ok, err := policy.WasmProbe(t.Pod, t.Container.Name, t.Kind.policyKind())
	if err != nil {
		return 0, "", err
	}
	if !ok {
		return 0, "", fmt.Errorf("no Wasm probe policy annotation %s on the pod", policy.ProbeAnnotation(t.Container.Name, t.Kind.policyKind()))
	}
	target := policy.ProbeTarget{
		Pod:       t.Pod,
		Container: t.Container.Name,
		PodIP:     t.PodIP,
		Ports:     podPorts(t.Pod),
	}
	if t.Pid > 0 {
		target.RootFS = fmt.Sprintf("/proc/%d/root", t.Pid)
	}
	success, msg, err := h.Policies.Probe(ctx, name, target)
	switch {
	case err != nil:
		// The policy's failurePolicy is Fail: a module error fails the probe (under Ignore
		// the policy answers success itself).
		if msg == "" {
			msg = err.Error()
		}
		return Failure, msg, nil
	case !success:
		return Failure, msg, nil
	}
	return Success, msg, nil
}

// podPorts returns the TCP ports the pod's containers declare, sorted, once each: the pod
// shares one IP, so a policy may check any of them.
func podPorts(pod *v1.Pod) []int32 {
	seen := map[int32]bool{}
	var out []int32
	add := func(cs []v1.Container) {
		for _, c := range cs {
			for _, p := range c.Ports {
				if (p.Protocol == "" || p.Protocol == v1.ProtocolTCP) && !seen[p.ContainerPort] {
					seen[p.ContainerPort] = true
					out = append(out, p.ContainerPort)
				}
			}
		}
	}
	add(pod.Spec.InitContainers)
	add(pod.Spec.Containers)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
