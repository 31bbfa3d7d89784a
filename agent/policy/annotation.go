package policy

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// A container's probe refers to a Wasm probe policy by an annotation on the
// pod, so that the PodSpec stays valid for the API and for any kubelet:
//
//	metadata:
//	  annotations:
//	    probe.holdfast.dev/collector.readiness: collector-health
//	spec:
//	  containers:
//	  - name: collector
//	    readinessProbe:
//	      exec:
//	        command: ["holdfast-wasm-probe", "collector-health"]
//	      periodSeconds: 10
//	      timeoutSeconds: 1
//	      failureThreshold: 3
//
// The key is ProbeAnnotationPrefix + "<container>.<liveness|readiness|startup>",
// the value the name of a probe policy of the node's configuration. The
// container must declare that probe: its timing fields (initialDelaySeconds,
// periodSeconds, timeoutSeconds, successThreshold, failureThreshold) apply
// unchanged, and its handler is replaced by the policy. The recommended
// handler is the exec placeholder above: on a node without holdfast it fails
// (no such command), which keeps a pod that depends on a Wasm check from
// being reported healthy by mistake. If the placeholder names a policy, it
// must be the annotation's.
const (
	ProbeAnnotationPrefix = "probe.holdfast.dev/"
	// ProbePlaceholderCommand is the exec command of the placeholder handler.
	ProbePlaceholderCommand = "holdfast-wasm-probe"
)

// ProbeKind is which probe of a container a policy serves.
type ProbeKind string

const (
	Liveness  ProbeKind = "liveness"
	Readiness ProbeKind = "readiness"
	Startup   ProbeKind = "startup"
)

// ProbeRef says that a container's probe is served by a policy.
type ProbeRef struct {
	Container string
	Kind      ProbeKind
	Policy    string
	// Probe is the container's probe, whose timing fields apply.
	Probe *corev1.Probe
}

// ProbeAnnotation returns the annotation key for a container's probe.
func ProbeAnnotation(container string, kind ProbeKind) string {
	return ProbeAnnotationPrefix + container + "." + string(kind)
}

// ParseProbeAnnotations returns the Wasm probes a pod declares, sorted by
// container and kind. It checks every probe.holdfast.dev/ annotation and
// returns all errors found (a pod with an invalid one should be rejected
// rather than run with a probe silently missing).
func ParseProbeAnnotations(pod *corev1.Pod) ([]ProbeRef, error) {
	var refs []ProbeRef
	var errs []string
	for key, value := range pod.Annotations {
		if !strings.HasPrefix(key, ProbeAnnotationPrefix) {
			continue
		}
		ref, err := parseProbeAnnotation(pod, strings.TrimPrefix(key, ProbeAnnotationPrefix), strings.TrimSpace(value))
		if err != nil {
			errs = append(errs, fmt.Sprintf("annotation %s: %v", key, err))
			continue
		}
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Container != refs[j].Container {
			return refs[i].Container < refs[j].Container
		}
		return refs[i].Kind < refs[j].Kind
	})
	if len(errs) > 0 {
		sort.Strings(errs)
		return refs, fmt.Errorf("invalid Wasm probe annotations: %s", strings.Join(errs, "; "))
	}
	return refs, nil
}

func parseProbeAnnotation(pod *corev1.Pod, suffix, policyName string) (ProbeRef, error) {
	dot := strings.LastIndexByte(suffix, '.')
	if dot <= 0 {
		return ProbeRef{}, fmt.Errorf("key must be %s<container>.<liveness|readiness|startup>", ProbeAnnotationPrefix)
	}
	ref := ProbeRef{Container: suffix[:dot], Kind: ProbeKind(suffix[dot+1:]), Policy: policyName}
	switch ref.Kind {
	case Liveness, Readiness, Startup:
	default:
		return ProbeRef{}, fmt.Errorf("probe kind %q must be liveness, readiness or startup", ref.Kind)
	}
	if !nameRE.MatchString(policyName) {
		return ProbeRef{}, fmt.Errorf("value %q is not a policy name", policyName)
	}
	c := findContainer(pod, ref.Container)
	if c == nil {
		return ProbeRef{}, fmt.Errorf("the pod has no container %q", ref.Container)
	}
	switch ref.Kind {
	case Liveness:
		ref.Probe = c.LivenessProbe
	case Readiness:
		ref.Probe = c.ReadinessProbe
	case Startup:
		ref.Probe = c.StartupProbe
	}
	if ref.Probe == nil {
		return ProbeRef{}, fmt.Errorf("container %q has no %sProbe to carry the timing fields; add one with exec command [%s, %s]",
			ref.Container, ref.Kind, ProbePlaceholderCommand, policyName)
	}
	if ex := ref.Probe.Exec; ex != nil && len(ex.Command) > 1 && ex.Command[0] == ProbePlaceholderCommand && ex.Command[1] != policyName {
		return ProbeRef{}, fmt.Errorf("the placeholder command names policy %q but the annotation names %q", ex.Command[1], policyName)
	}
	return ref, nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	// Sidecars (init containers with restartPolicy Always) have probes too.
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

// WasmProbe returns the policy serving a container's probe, if any. It
// ignores annotations of other containers and reports only this probe's
// error.
func WasmProbe(pod *corev1.Pod, container string, kind ProbeKind) (policyName string, ok bool, err error) {
	value, found := pod.Annotations[ProbeAnnotation(container, kind)]
	if !found {
		return "", false, nil
	}
	ref, err := parseProbeAnnotation(pod, container+"."+string(kind), strings.TrimSpace(value))
	if err != nil {
		return "", false, fmt.Errorf("annotation %s: %w", ProbeAnnotation(container, kind), err)
	}
	return ref.Policy, true, nil
}

// IsPlaceholder reports whether a probe's handler is the exec placeholder.
func IsPlaceholder(p *corev1.Probe) bool {
	return p != nil && p.Exec != nil && len(p.Exec.Command) > 0 && p.Exec.Command[0] == ProbePlaceholderCommand
}
