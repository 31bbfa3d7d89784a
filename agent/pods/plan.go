package pods

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
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
}

type killAction struct {
	id     string
	name   string
	reason string
}

// restartChecker tells whether a container may be restarted now or must wait (back-off).
type restartChecker interface {
	// inBackOff reports whether the container (pod UID + name) last finished at finishedAt
	// must still wait, and the current delay.
	inBackOff(key string, finishedAt time.Time) (bool, time.Duration)
}

// computePlan decides, for each container of the pod, whether to start, restart or leave it,
// following restartPolicy and back-off. It never kills a running container unless its spec
// changed: nothing here reacts to an absence of information.
func computePlan(pod *v1.Pod, observed []runtime.Container, backoff restartChecker) plan {
	p := plan{backOff: map[string]time.Duration{}}
	byName := groupByName(observed)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		attempts := byName[c.Name]
		if len(attempts) == 0 {
			p.start = append(p.start, startAction{container: c, attempt: 0})
			continue
		}
		latest := attempts[len(attempts)-1]
		// Keep the latest and the one before it (the lastState of a running restart);
		// older attempts are history nobody reports.
		for _, old := range attempts[:max(0, len(attempts)-2)] {
			p.remove = append(p.remove, old.ID)
		}
		hash := containerHash(c)
		switch latest.State {
		case runtime.StateCreated:
			p.start = append(p.start, startAction{container: c, attempt: latest.Attempt})
		case runtime.StateRunning:
			if latest.SpecHash != "" && latest.SpecHash != hash {
				p.kill = append(p.kill, killAction{id: latest.ID, name: c.Name, reason: "container spec changed, it will be restarted"})
			}
		case runtime.StateExited:
			specChanged := latest.SpecHash != "" && latest.SpecHash != hash
			if !specChanged && !shouldRestart(pod.Spec.RestartPolicy, latest.ExitCode) {
				continue
			}
			if wait, delay := backoff.inBackOff(backoffKey(pod, c.Name), latest.FinishedAt); wait && !specChanged {
				p.backOff[c.Name] = delay
				continue
			}
			p.start = append(p.start, startAction{container: c, attempt: latest.Attempt + 1})
		}
	}
	return p
}

func shouldRestart(policy v1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return true
	}
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

// containerHash identifies a container spec; a running container whose hash differs from its
// spec's was created from an older spec (the API allows changing a pod's images).
func containerHash(c *v1.Container) string {
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}
