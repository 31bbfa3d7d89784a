package eviction

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// Kubelet's reason and message formats (pkg/kubelet/eviction/helpers.go).
const (
	// Reason is the evicted pod's status reason, the event's reason and admission's.
	Reason                  = "Evicted"
	nodeLowMessageFmt       = "The node was low on resource: %v. "
	thresholdMetMessageFmt  = "Threshold quantity: %v, available: %v. "
	containerMessageFmt     = "Container %s was using %s, request is %s, has larger consumption of %v. "
	nodeConditionMessageFmt = "The node had condition: %v. "
)

// podCleanupTimeout bounds the wait for an evicted pod's cleanup, kubelet's
// podCleanupTimeout; podCleanupPoll is how often it is checked.
const (
	podCleanupTimeout = 30 * time.Second
	podCleanupPoll    = time.Second
)

// admissionSettleTimeout bounds how long eviction waits, in a row, for pods still being
// admitted before it ranks those it has.
const admissionSettleTimeout = 30 * time.Second

// immediateGracePeriod is the grace period of a pod evicted for a hard threshold, kubelet's
// immediateEvictionGracePeriodSeconds.
const immediateGracePeriod = time.Second

// criticalPriority is kubelet's scheduling.SystemCriticalPriority: pods at or above it
// (system-node-critical, system-cluster-critical) are never evicted.
const criticalPriority = 2 * 1000000000

// mirrorAnnotation marks a mirror pod (kubetypes.ConfigMirrorAnnotationKey).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// Pods is the part of the pod manager eviction acts on.
type Pods interface {
	// ActivePods are the admitted pods that run: not finished, not being deleted or evicted;
	// undecided counts the pods whose admission is not decided yet.
	ActivePods() (active []*v1.Pod, undecided int)
	// Evict stops the pod's containers with the grace period and ends it Failed with reason
	// Evicted and the message.
	Evict(pod *v1.Pod, grace time.Duration, message string) error
	// CleanedUp says the pod's containers are stopped and its volumes and network released.
	CleanedUp(uid types.UID) bool
}

// StatsProvider measures the pods' usage of the resource a signal is about.
type StatsProvider interface {
	Stats(ctx context.Context, pods []*v1.Pod, signal Signal) StatsFunc
}

// Reclaimer frees node-level disk space: exited containers, unused images (agent/gc).
type Reclaimer interface {
	Reclaim(ctx context.Context) error
}

// Config tunes the manager.
type Config struct {
	Thresholds []Threshold
	// PressureTransitionPeriod is how long a pressure condition stays True after its last
	// threshold was last met (kubelet's evictionPressureTransitionPeriod).
	PressureTransitionPeriod time.Duration
	// MonitoringInterval is how often signals are observed; at most one pod is evicted each.
	MonitoringInterval time.Duration
	// MaxPodGracePeriod bounds the grace period of pods evicted for a soft threshold
	// (kubelet's evictionMaxPodGracePeriod).
	MaxPodGracePeriod time.Duration
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

// Manager observes the node, reports pressure and evicts pods.
type Manager struct {
	cfg       Config
	observer  Observer
	pods      Pods
	stats     StatsProvider
	reclaimer Reclaimer // nil: no node-level reclaim
	recorder  record.EventRecorder
	log       *slog.Logger

	mu sync.Mutex // protects firstMet, lastMet, conditions, undecidedSince
	// firstMet is when each threshold met now was first seen met (soft grace periods).
	firstMet map[string]time.Time
	// lastMet is when a threshold of each pressure condition was last seen met.
	lastMet map[v1.NodeConditionType]time.Time
	// conditions are the pressure conditions in effect since the last observation.
	conditions []v1.NodeConditionType
	// undecidedSince is when eviction began waiting for pods' admission decisions; zero when
	// it is not waiting.
	undecidedSince time.Time
}

// NewManager builds a manager; Run runs it. reclaimer may be nil.
func NewManager(cfg Config, observer Observer, pods Pods, stats StatsProvider, reclaimer Reclaimer, recorder record.EventRecorder, log *slog.Logger) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MonitoringInterval <= 0 {
		cfg.MonitoringInterval = 10 * time.Second
	}
	return &Manager{
		cfg: cfg, observer: observer, pods: pods, stats: stats, reclaimer: reclaimer, recorder: recorder, log: log,
		firstMet: map[string]time.Time{}, lastMet: map[v1.NodeConditionType]time.Time{},
	}
}

// Run observes the node every MonitoringInterval until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.MonitoringInterval)
	defer t.Stop()
	for {
		m.Synchronize(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// UnderPressure says the node has the pressure condition (MemoryPressure, DiskPressure or
// PIDPressure): what the node controller reports.
func (m *Manager) UnderPressure(c v1.NodeConditionType) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.conditions, c)
}

// Synchronize observes the node once, updates the pressure conditions and, if a threshold is
// met (a soft one for its grace period), reclaims or evicts one pod. It returns the pod
// evicted, nil when none was.
func (m *Manager) Synchronize(ctx context.Context) *v1.Pod {
	obs, err := m.observer.Observe(ctx)
	if err != nil {
		m.log.Warn("observe eviction signals", "err", err)
		return nil
	}
	now := m.cfg.Now()
	var met []Threshold
	for _, t := range m.cfg.Thresholds {
		if thresholdMet(t, obs[t.Signal]) {
			met = append(met, t)
		}
	}
	evictable := m.update(met, now)
	if len(evictable) == 0 {
		return nil
	}
	// Memory first, then disk, then PIDs; the first threshold of that signal decides.
	slices.SortStableFunc(evictable, func(a, b Threshold) int {
		return slices.Index(signals, a.Signal) - slices.Index(signals, b.Signal)
	})
	t := evictable[0]
	m.log.Info("eviction threshold met", "threshold", t.String(), "available", obs[t.Signal].Available, "capacity", obs[t.Signal].Capacity)
	if t.Signal.Disk() && m.reclaimer != nil {
		if done := m.reclaim(ctx, t); done {
			return nil
		}
		if obs, err = m.observer.Observe(ctx); err != nil {
			m.log.Warn("observe eviction signals", "err", err)
			return nil
		}
	}
	return m.evictOne(ctx, t, obs)
}

// update records the thresholds met now and returns those to act on: hard ones, and soft ones
// met for their grace period. Pressure conditions follow every threshold met, held for the
// transition period, as kubelet's.
func (m *Manager) update(met []Threshold, now time.Time) []Threshold {
	m.mu.Lock()
	defer m.mu.Unlock()
	first := map[string]time.Time{}
	var act []Threshold
	for _, t := range met {
		k := t.String()
		at, ok := m.firstMet[k]
		if !ok {
			at = now
		}
		first[k] = at
		m.lastMet[t.Signal.Condition()] = now
		if now.Sub(at) >= t.GracePeriod {
			act = append(act, t)
		}
	}
	m.firstMet = first
	var conds []v1.NodeConditionType
	for _, c := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		if at, ok := m.lastMet[c]; ok && (at.Equal(now) || now.Sub(at) < m.cfg.PressureTransitionPeriod) {
			conds = append(conds, c)
		}
	}
	if !slices.Equal(conds, m.conditions) {
		m.log.Info("node pressure conditions", "conditions", conds)
	}
	m.conditions = conds
	return act
}

// reclaim frees node-level disk space and says whether that relieved the threshold.
func (m *Manager) reclaim(ctx context.Context, t Threshold) bool {
	if err := m.reclaimer.Reclaim(ctx); err != nil {
		m.log.Warn("reclaim node-level resources", "err", err)
	}
	obs, err := m.observer.Observe(ctx)
	if err != nil {
		return false
	}
	if thresholdMet(t, obs[t.Signal]) {
		return false
	}
	m.log.Info("node-level reclaim relieved the threshold; no pod evicted", "threshold", t.String())
	return true
}

// evictOne evicts the first pod in kubelet's ranking for the threshold that is not critical.
func (m *Manager) evictOne(ctx context.Context, t Threshold, obs Observations) *v1.Pod {
	pods, undecided := m.pods.ActivePods()
	if m.awaitAdmission(undecided) {
		// Right after an agent restart the restored pods are admitted one by one, their
		// containers running all along: ranking only those admitted so far once evicted a
		// Guaranteed pod while the BestEffort hog beside it was still being admitted.
		m.log.Info("eviction threshold met; waiting for every pod's admission before choosing one",
			"threshold", t.String(), "undecided", undecided)
		return nil
	}
	if len(pods) == 0 {
		m.log.Warn("eviction threshold met but no pod to evict", "threshold", t.String())
		return nil
	}
	stats := m.stats.Stats(ctx, pods, t.Signal)
	Rank(t.Signal, pods, stats)
	for _, pod := range pods {
		if IsCritical(pod) {
			continue
		}
		grace := immediateGracePeriod
		if !t.Hard() {
			grace = m.cfg.MaxPodGracePeriod
			if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
				grace = min(grace, time.Duration(*g)*time.Second)
			}
		}
		msg := Message(t, obs[t.Signal], pod, stats)
		m.log.Info("evicting pod", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID, "threshold", t.String(), "message", msg)
		if m.recorder != nil {
			m.recorder.Event(pod, v1.EventTypeWarning, Reason, msg)
		}
		if err := m.pods.Evict(pod, grace, msg); err != nil {
			m.log.Warn("evict pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			continue
		}
		m.waitForCleanup(ctx, pod)
		return pod
	}
	m.log.Warn("eviction threshold met but every pod is critical", "threshold", t.String())
	return nil
}

// awaitAdmission says whether to hold off evicting because pods are still being admitted, for
// at most admissionSettleTimeout in a row: a pod whose admission hangs must not stop eviction
// for good.
func (m *Manager) awaitAdmission(undecided int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if undecided == 0 {
		m.undecidedSince = time.Time{}
		return false
	}
	now := m.cfg.Now()
	if m.undecidedSince.IsZero() {
		m.undecidedSince = now
	}
	return now.Sub(m.undecidedSince) < admissionSettleTimeout
}

// waitForCleanup waits until the evicted pod's memory, disk and PIDs are released, or
// podCleanupTimeout, as kubelet does: observing the node before would count them still in use
// and evict another pod for nothing.
func (m *Manager) waitForCleanup(ctx context.Context, pod *v1.Pod) {
	deadline := time.NewTimer(podCleanupTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(podCleanupPoll)
	defer poll.Stop()
	for !m.pods.CleanedUp(pod.UID) {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			m.log.Warn("evicted pod not cleaned up in time; going on", "pod", pod.Namespace+"/"+pod.Name, "timeout", podCleanupTimeout)
			return
		case <-poll.C:
		}
	}
	m.log.Info("evicted pod cleaned up", "pod", pod.Namespace+"/"+pod.Name)
}

// Message is kubelet's eviction message: the resource, the threshold and what was
// available, and each container using more memory than it requests.
func Message(t Threshold, o Observation, pod *v1.Pod, stats StatsFunc) string {
	res := t.Signal.Resource()
	msg := fmt.Sprintf(nodeLowMessageFmt, res)
	available := resource.NewQuantity(o.Available, t.Signal.Format())
	msg += fmt.Sprintf(thresholdMetMessageFmt, t.QuantityFor(o.Capacity), available)
	if res != v1.ResourceMemory {
		return msg
	}
	s, ok := stats(pod)
	if !ok {
		return msg
	}
	for _, c := range pod.Spec.Containers {
		used, ok := s.Containers[c.Name]
		if !ok {
			continue
		}
		req := c.Resources.Requests[v1.ResourceMemory]
		if used > req.Value() {
			msg += fmt.Sprintf(containerMessageFmt, c.Name, resource.NewQuantity(used, resource.BinarySI), req.String(), res)
		}
	}
	return msg
}

// IsCritical is kubelet's IsCriticalPod: static pods, mirror pods and pods of system critical
// priority are never evicted.
func IsCritical(pod *v1.Pod) bool {
	if manifest.IsStatic(pod) {
		return true
	}
	if _, ok := pod.Annotations[mirrorAnnotation]; ok {
		return true
	}
	return priority(pod) >= criticalPriority
}

// Admit is kubelet's eviction admit handler: under pressure only critical pods are admitted,
// and under memory pressure alone also pods that are not BestEffort (or tolerate the
// memory-pressure taint).
func (m *Manager) Admit(pod *v1.Pod) admission.Result {
	m.mu.Lock()
	conds := slices.Clone(m.conditions)
	m.mu.Unlock()
	if len(conds) == 0 || IsCritical(pod) {
		return admission.Admit
	}
	if len(conds) == 1 && conds[0] == v1.NodeMemoryPressure {
		if podutil.ComputePodQOS(pod) != v1.PodQOSBestEffort {
			return admission.Admit
		}
		taint := v1.Taint{Key: v1.TaintNodeMemoryPressure, Effect: v1.TaintEffectNoSchedule}
		for _, tol := range pod.Spec.Tolerations {
			if tol.ToleratesTaint(klog.Background(), &taint, false) {
				return admission.Admit
			}
		}
	}
	return admission.Result{Reason: Reason, Message: fmt.Sprintf(nodeConditionMessageFmt, conds)}
}
