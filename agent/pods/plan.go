package pods

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// plan is what one sync does to a pod; computePlan produces it from desired and observed
// state alone.
type plan struct {
	// start lists the containers to create and start, with the attempt to create.
	start []startAction
	// kill lists running containers to stop (spec changed).
	kill []killAction
	// remove lists exited containers no longer needed for status (older attempts).
	remove []string
	// backOff lists containers waiting for their restart back-off, with the delay.
	backOff map[string]time.Duration
}

type startAction struct {
	container *v1.Container
	attempt   int
	// pidNamespaceOf, when set, is the process whose PID namespace the container joins (an
	// ephemeral container's target).
	pidNamespaceOf uint32
	// pidNamespaceOfID is the runtime's ID of that container.
	pidNamespaceOfID string
}

type killAction struct {
	id     string
	name   string
	reason string
	// grace replaces the pod's grace period when set (a probe's terminationGracePeriodSeconds).
	grace *time.Duration
	// event is the Killing event's message; empty means "Stopping container NAME: REASON".
	event string
}

// restartChecker tells whether a container may be restarted now or must wait (back-off).
type restartChecker interface {
	// inBackOff reports whether the container (pod UID + name) last finished at finishedAt
	// must still wait, and the current delay.
	inBackOff(key string, finishedAt time.Time) (bool, time.Duration)
}

// computePlan decides, for each container of the pod, whether to start, restart or leave it,
// following restartPolicy and back-off. Init containers run first, in order, each to
// success (restartable "sidecar" init containers only need to be running); app containers
// start once the pod is initialized. It never kills a running container unless its spec
// changed: nothing here reacts to an absence of information.
func computePlan(pod *v1.Pod, observed []runtime.Container, backoff restartChecker, started startedFunc) plan {
	p := plan{backOff: map[string]time.Duration{}}
	byName := groupByName(observed)
	p.planEphemeral(pod, byName)
	if !initialized(pod, byName, started) {
		for i := range pod.Spec.InitContainers {
			c := &pod.Spec.InitContainers[i]
			if done := p.planInit(pod, c, byName[c.Name], backoff, started); !done {
				return p
			}
		}
	} else {
		// Initialized: regular init containers never run again; sidecars are kept running.
		for i := range pod.Spec.InitContainers {
			if c := &pod.Spec.InitContainers[i]; isSidecar(c) {
				p.planContainer(pod, c, byName[c.Name], v1.RestartPolicyAlways, backoff)
			}
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		p.planContainer(pod, c, byName[c.Name], pod.Spec.RestartPolicy, backoff)
	}
	return p
}

// startedFunc says whether a running container has started (its startup probe passed, or it
// has none). nil: every running container has.
type startedFunc func(container string) bool

func (f startedFunc) started(name string) bool { return f == nil || f(name) }

// planInit plans one init container of a pod that is not initialized yet, and reports
// whether the next one may go: a regular init container must have succeeded, a sidecar
// must be running and started, as kubelet waits for it.
func (p *plan) planInit(pod *v1.Pod, c *v1.Container, attempts []runtime.Container, backoff restartChecker, started startedFunc) bool {
	policy := pod.Spec.RestartPolicy
	if policy == v1.RestartPolicyAlways {
		policy = v1.RestartPolicyOnFailure // a failed init container is retried, a success kept
	}
	if isSidecar(c) {
		policy = v1.RestartPolicyAlways
	}
	p.planContainer(pod, c, attempts, policy, backoff)
	if len(attempts) == 0 {
		return false
	}
	latest := attempts[len(attempts)-1]
	if isSidecar(c) {
		return latest.State == runtime.StateRunning && started.started(c.Name)
	}
	return latest.State == runtime.StateExited && latest.ExitCode == 0
}

// planContainer plans one container under the given restart policy.
func (p *plan) planContainer(pod *v1.Pod, c *v1.Container, attempts []runtime.Container, policy v1.RestartPolicy, backoff restartChecker) {
	if len(attempts) == 0 {
		p.start = append(p.start, startAction{container: c, attempt: 0})
		return
	}
	latest := attempts[len(attempts)-1]
	// Keep the latest and the one before it (the lastState of a running restart); older
	// attempts are history nobody reports.
	for _, old := range attempts[:max(0, len(attempts)-2)] {
		p.remove = append(p.remove, old.ID)
	}
	switch latest.State {
	case runtime.StateCreated:
		p.start = append(p.start, startAction{container: c, attempt: latest.Attempt})
	case runtime.StateRunning:
		if specChanged(latest, c) {
			p.kill = append(p.kill, killAction{id: latest.ID, name: c.Name, reason: "container spec changed, it will be restarted"})
		}
	case runtime.StateExited:
		// An exited container is started again only by its restart policy, its image
		// changed or not: a container that completed in a Never or OnFailure pod is not run
		// twice (the kubelet's ShouldContainerBeRestarted). A changed image skips the
		// back-off.
		if !shouldRestart(c, policy, latest.ExitCode) {
			return
		}
		changed := specChanged(latest, c)
		if wait, delay := backoff.inBackOff(backoffKey(pod, c.Name), latest.FinishedAt); wait && !changed {
			p.backOff[c.Name] = delay
			return
		}
		p.start = append(p.start, startAction{container: c, attempt: latest.Attempt + 1})
	}
}

// isSidecar: an init container with restartPolicy Always runs beside the app containers.
func isSidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// initialized reports whether the pod's init phase is over: an app container was created
// once (init containers never run again after that, as in kubelet), or every regular init
// container succeeded and every sidecar runs and has started.
func initialized(pod *v1.Pod, byName map[string][]runtime.Container, started startedFunc) bool {
	for i := range pod.Spec.Containers {
		if len(byName[pod.Spec.Containers[i].Name]) > 0 {
			return true
		}
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		attempts := byName[c.Name]
		if len(attempts) == 0 {
			return false
		}
		latest := attempts[len(attempts)-1]
		if isSidecar(c) && (latest.State != runtime.StateRunning || !started.started(c.Name)) {
			return false
		}
		if !isSidecar(c) && (latest.State != runtime.StateExited || latest.ExitCode != 0) {
			return false
		}
	}
	return true
}

// initFailed reports whether a regular init container failed in a pod that never restarts.
func initFailed(pod *v1.Pod, byName map[string][]runtime.Container, started startedFunc) bool {
	if pod.Spec.RestartPolicy != v1.RestartPolicyNever || initialized(pod, byName, started) {
		return false
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if attempts := byName[c.Name]; !isSidecar(c) && len(attempts) > 0 {
			if l := attempts[len(attempts)-1]; l.State == runtime.StateExited && l.ExitCode != 0 {
				return true
			}
		}
	}
	return false
}

// shouldRestart is kubelet's ContainerShouldRestart (ContainerRestartRules): a container
// with its own restartPolicy is restarted by the first of its restartPolicyRules that matches
// the exit code, else by that policy; any other by policy, the pod's (or what it means for
// the container: an init container is retried on failure, a sidecar always).
func shouldRestart(c *v1.Container, policy v1.RestartPolicy, exitCode int32) bool {
	if c.RestartPolicy != nil {
		if rule, ok := matchingRestartRule(c, exitCode); ok && rule.Action == v1.ContainerRestartRuleActionRestart {
			return true
		}
		switch *c.RestartPolicy {
		case v1.ContainerRestartPolicyAlways:
			return true
		case v1.ContainerRestartPolicyOnFailure:
			return exitCode != 0
		case v1.ContainerRestartPolicyNever:
			return false
		}
	}
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return true
	}
}

// matchingRestartRule is the first of c's restartPolicyRules whose exit codes match.
func matchingRestartRule(c *v1.Container, exitCode int32) (v1.ContainerRestartRule, bool) {
	for _, rule := range c.RestartPolicyRules {
		if rule.ExitCodes == nil {
			continue
		}
		in := slices.Contains(rule.ExitCodes.Values, exitCode)
		switch rule.ExitCodes.Operator {
		case v1.ContainerRestartRuleOnExitCodesOpIn:
			if in {
				return rule, true
			}
		case v1.ContainerRestartRuleOnExitCodesOpNotIn:
			if !in {
				return rule, true
			}
		}
	}
	return v1.ContainerRestartRule{}, false
}

// groupByName returns each container name's attempts in increasing attempt order.
func groupByName(observed []runtime.Container) map[string][]runtime.Container {
	m := map[string][]runtime.Container{}
	for _, c := range observed {
		m[c.Name] = append(m[c.Name], c)
	}
	for _, list := range m {
		sort.Slice(list, func(i, j int) bool { return list[i].Attempt < list[j].Attempt })
	}
	return m
}

func backoffKey(pod *v1.Pod, name string) string { return string(pod.UID) + "/" + name }

// containerHash identifies what of a container's spec needs a new container when it changes:
// its name and its image, the one field of a running pod's containers the API lets change
// that a restart applies (the resources change through a resize, applied in place or not at
// all, never by a restart the pod's resizePolicy did not ask for: the apiserver requires
// NotRequired for a Never pod). Hashing the whole container, as holdfast did, restarted
// every container of every gateway on a control-plane upgrade that defaults one more field.
// The kubelet hashes the same two (pickFieldsToHash). The "v2-" prefix tells these hashes
// from the whole-container ones of containers an older holdfast made (specChanged).
func containerHash(c *v1.Container) string {
	b, _ := json.Marshal(struct{ Name, Image string }{c.Name, c.Image})
	sum := sha256.Sum256(b)
	return specHashPrefix + hex.EncodeToString(sum[:8])
}

const specHashPrefix = "v2-"

// specChanged reports whether a running or exited container was made from another spec than
// c: its hash differs from c's. A container an older holdfast made carries a hash of its
// whole spec, which a field defaulted since would change too: its image is compared instead,
// so that upgrading the agent restarts nothing. No hash: unchanged.
func specChanged(observed runtime.Container, c *v1.Container) bool {
	switch {
	case observed.SpecHash == "":
		return false
	case strings.HasPrefix(observed.SpecHash, specHashPrefix):
		return observed.SpecHash != containerHash(c)
	default:
		return observed.Image != c.Image
	}
}
