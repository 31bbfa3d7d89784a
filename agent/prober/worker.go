package prober

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// Kubelet's defaults for a probe's unset fields (the API server sets them on API pods; static
// pods may leave them zero).
const (
	DefaultPeriod           = 10 * time.Second
	DefaultTimeout          = time.Second
	DefaultSuccessThreshold = 1
	DefaultFailureThreshold = 3
)

// Event reasons, as kubelet names them.
const (
	ReasonUnhealthy    = "Unhealthy"
	ReasonProbeWarning = "ProbeWarning"
)

// worker runs one probe of one container, for each of its instances in turn.
type worker struct {
	m       *Manager
	key     workerKey
	probe   *v1.Probe     // immutable: a changed probe gets a new worker
	trigger chan struct{} // buffered(1): look again now, coalesced
	stop    chan struct{} // closed when the probe goes away

	// Protected by m.mu.
	running bool               // its goroutine was started
	stopped bool               // stop is closed
	cancel  context.CancelFunc // cancels the goroutine's context, once started
	// The rest is about the instance containerID, and starts over with a new one.
	containerID string
	since       time.Time // the instance's start: initialDelaySeconds counts from here
	result      Outcome   // Success or Failure once decided; 0: startup not passed yet
	lastOutcome Outcome   // of the last attempt, Success or Failure
	streak      int       // consecutive attempts with lastOutcome
	lastRun     time.Time // when the last attempt began; zero: none yet
	onHold      bool      // liveness or startup failed: no more attempts on this instance
	unhealthy   *Unhealthy
}

func newWorker(m *Manager, key workerKey, p *v1.Probe) *worker {
	return &worker{m: m, key: key, probe: p, trigger: make(chan struct{}, 1), stop: make(chan struct{})}
}

func (w *worker) poke() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// resetLocked starts over for a new instance of the container, with kubelet's initial
// results (liveness passing, readiness failing, startup undecided), except that a state the
// pod's reported status gives this very instance is kept (see Manager.UpdatePod).
func (w *worker) resetLocked(info ContainerInfo, pod *v1.Pod, now time.Time) {
	w.containerID = info.ID
	w.since = info.StartedAt
	if w.since.IsZero() {
		w.since = now
	}
	w.lastOutcome, w.streak, w.lastRun, w.onHold, w.unhealthy = 0, 0, time.Time{}, false, nil
	reported := reportedStatus(pod, w.key.container, info.ID)
	switch w.key.kind {
	case Liveness:
		w.result = Success
	case Readiness:
		w.result = Failure
		if reported != nil && reported.Ready {
			w.result = Success
		}
	case Startup:
		w.result = 0
		if reported != nil && reported.Started != nil && *reported.Started {
			w.result = Success
		}
	}
}

// adoptReportedLocked takes over what the pod's reported status says of this instance, only
// ever upgrading a result no probe attempt has produced yet.
func (w *worker) adoptReportedLocked(pod *v1.Pod) {
	reported := reportedStatus(pod, w.key.container, w.containerID)
	if reported == nil {
		return
	}
	switch w.key.kind {
	case Readiness:
		if reported.Ready {
			w.result = Success
		}
	case Startup:
		if reported.Started != nil && *reported.Started {
			w.result = Success
		}
	}
}

// reportedStatus returns the pod's reported status of that container instance, if any.
func reportedStatus(pod *v1.Pod, name, id string) *v1.ContainerStatus {
	for _, list := range [][]v1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if cs.Name == name && strings.TrimPrefix(cs.ContainerID, "containerd://") == id && cs.ContainerID != "" {
				return cs
			}
		}
	}
	return nil
}

// run probes until the probe goes away or ctx ends.
func (w *worker) run(ctx context.Context) {
	for {
		wait := w.step(ctx)
		var timer clock.Timer
		var due <-chan time.Time
		if wait >= 0 {
			timer = w.m.clock.NewTimer(wait)
			due = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-w.stop:
		case <-w.trigger:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil || w.isStopped() {
			return
		}
	}
}

func (w *worker) isStopped() bool {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	return w.stopped
}

// step runs the attempts that are due and returns how long until the next one may be; a
// negative wait means none will be until something changes (a poke).
func (w *worker) step(ctx context.Context) time.Duration {
	for {
		t, wait := w.next()
		if t == nil {
			return wait
		}
		outcome, output, err := w.attempt(ctx, *t)
		if ctx.Err() != nil {
			return -1 // stopping: the result means nothing
		}
		w.record(*t, outcome, output, err)
	}
}

// next returns the attempt to make now, or how long to wait (negative: until poked).
func (w *worker) next() (*Target, time.Duration) {
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if w.stopped {
		return nil, -1
	}
	ps := m.pods[w.key.uid]
	if ps == nil {
		return nil, -1
	}
	info, running := ps.running[w.key.container]
	if !running || info.ID != w.containerID || w.onHold {
		return nil, -1
	}
	if ps.pod.DeletionTimestamp != nil && w.key.kind != Readiness {
		// A pod on its way out is not restarted: kubelet stops liveness and startup probes.
		return nil, -1
	}
	c, _ := findContainer(ps.pod, w.key.container)
	if c == nil {
		return nil, -1
	}
	now := m.clock.Now()
	if d := time.Duration(w.probe.InitialDelaySeconds) * time.Second; d > 0 {
		if at := w.since.Add(d); now.Before(at) {
			return nil, at.Sub(now)
		}
	}
	started := ps.startedLocked(w.key.uid, w.key.container, info.ID)
	if w.key.kind == Startup && started {
		return nil, -1 // its job is done for this instance
	}
	if w.key.kind != Startup && !started {
		return nil, -1 // startup gates the others; its success pokes them
	}
	if !w.lastRun.IsZero() {
		if at := w.lastRun.Add(period(w.probe)); now.Before(at) {
			return nil, at.Sub(now)
		}
	}
	w.lastRun = now
	return &Target{
		Pod:         ps.pod,
		Container:   c,
		ContainerID: info.ID,
		Kind:        w.key.kind,
		Probe:       w.probe,
		PodIP:       ps.podIP,
		Pid:         info.Pid,
		Timeout:     timeout(w.probe),
	}, 0
}

// attempt runs the handler once, bounded by the probe's timeout.
func (w *worker) attempt(ctx context.Context, t Target) (Outcome, string, error) {
	ctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	return w.m.cfg.Handler.Probe(ctx, t)
}

// record counts an attempt's outcome toward the thresholds and acts on a decided result.
func (w *worker) record(t Target, outcome Outcome, output string, err error) {
	m := w.m
	kind := w.key.kind
	m.mu.Lock()
	if w.stopped || w.containerID != t.ContainerID {
		m.mu.Unlock()
		return // a stale attempt: the probe went away or the container restarted meanwhile
	}
	m.mu.Unlock()
	// Every attempt that did not pass says so in an event, as kubelet's do.
	switch {
	case err != nil:
		m.event(t, ReasonUnhealthy, "%s probe errored: %v", kind, err)
		m.log.Debug("probe errored", "pod", podName(t.Pod), "container", t.Container.Name, "probe", kind, "err", err)
		return
	case outcome == Warning:
		m.event(t, ReasonProbeWarning, "%s probe warning: %s", kind, output)
	case outcome == Failure:
		m.event(t, ReasonUnhealthy, "%s probe failed: %s", kind, output)
	}
	m.mu.Lock()
	if w.stopped || w.containerID != t.ContainerID {
		m.mu.Unlock()
		return
	}
	switch outcome {
	case Warning:
		outcome = Success
	case Success, Failure:
	default:
		m.mu.Unlock()
		m.log.Warn("probe handler returned no outcome; attempt ignored", "pod", podName(t.Pod), "container", t.Container.Name, "probe", kind)
		return
	}
	if outcome == w.lastOutcome {
		w.streak++
	} else {
		w.lastOutcome, w.streak = outcome, 1
	}
	threshold := failureThreshold(w.probe)
	if outcome == Success {
		threshold = successThreshold(w.probe, kind)
	}
	if w.streak < threshold {
		m.mu.Unlock()
		return
	}
	changed := w.result != outcome
	w.result = outcome
	var unhealthy *Unhealthy
	if outcome == Failure && kind != Readiness {
		// Kill, once: no more attempts on this instance, the next one starts over.
		w.onHold, w.streak = true, 0
		restart := t.Pod.Spec.RestartPolicy != v1.RestartPolicyNever || t.Container.RestartPolicy != nil
		msg := fmt.Sprintf("Container %s failed %s probe", t.Container.Name, strings.ToLower(string(kind)))
		if restart {
			msg += ", will be restarted"
		}
		w.unhealthy = &Unhealthy{ContainerID: t.ContainerID, Kind: kind, Message: msg, GracePeriodSeconds: w.probe.TerminationGracePeriodSeconds}
		unhealthy = w.unhealthy
	}
	if kind == Startup && outcome == Success && changed {
		if ps := m.pods[w.key.uid]; ps != nil {
			for _, k := range []Kind{Liveness, Readiness} {
				if sib := ps.workers[workerKey{w.key.uid, w.key.container, k}]; sib != nil {
					sib.poke()
				}
			}
		}
	}
	m.mu.Unlock()

	if changed {
		m.log.Info("probe result changed", "pod", podName(t.Pod), "container", t.Container.Name, "probe", kind, "result", outcome.String(), "output", output)
		if kind != Liveness {
			m.cfg.OnStatusChange(w.key.uid)
		}
	}
	if unhealthy != nil {
		m.cfg.OnContainerUnhealthy(w.key.uid, w.key.container, unhealthy.ContainerID, unhealthy.Message)
	}
}

// event records a probe event on the container, as kubelet does (the pod, with the
// container's field path).
func (m *Manager) event(t Target, reason, format string, args ...any) {
	if m.cfg.Recorder == nil {
		return
	}
	field := fmt.Sprintf("spec.containers{%s}", t.Container.Name)
	if _, isInit := findContainer(t.Pod, t.Container.Name); isInit {
		field = fmt.Sprintf("spec.initContainers{%s}", t.Container.Name)
	}
	ref := &v1.ObjectReference{
		Kind: "Pod", APIVersion: "v1",
		Namespace: t.Pod.Namespace, Name: t.Pod.Name, UID: t.Pod.UID, ResourceVersion: t.Pod.ResourceVersion,
		FieldPath: field,
	}
	m.cfg.Recorder.Eventf(ref, v1.EventTypeWarning, reason, format, args...)
}

func podName(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

func period(p *v1.Probe) time.Duration {
	if p.PeriodSeconds <= 0 {
		return DefaultPeriod
	}
	return time.Duration(p.PeriodSeconds) * time.Second
}

func timeout(p *v1.Probe) time.Duration {
	if p.TimeoutSeconds <= 0 {
		return DefaultTimeout
	}
	return time.Duration(p.TimeoutSeconds) * time.Second
}

func failureThreshold(p *v1.Probe) int {
	if p.FailureThreshold <= 0 {
		return DefaultFailureThreshold
	}
	return int(p.FailureThreshold)
}

// successThreshold is 1 for liveness and startup whatever the spec says (the API refuses
// anything else; a static pod might not have been through it).
func successThreshold(p *v1.Probe, k Kind) int {
	if p.SuccessThreshold <= 0 || k != Readiness {
		return DefaultSuccessThreshold
	}
	return int(p.SuccessThreshold)
}
