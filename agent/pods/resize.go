package pods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/offline"
)

// In-place pod resize, as the kubelet does it (GA since 1.35): the pod's spec holds the
// desired resources (changed through the pods/resize subresource); the node allocates them
// when they fit beside the other pods' allocations (Deferred while they do not, Infeasible
// when they never can), keeps the allocation in the state store (it survives agent restarts
// and offline reboots: containers run with what was allocated, not with whatever spec comes
// first), then actuates it: each running container's cgroup updated in place where its
// resizePolicy says NotRequired, the container restarted where it says RestartContainer.
// The status reports what the cgroups hold (read back), the allocation, and the
// PodResizePending and PodResizeInProgress conditions.

// Event reasons of a resize, the kubelet's.
const (
	ReasonResizeStarted    = "ResizeStarted"
	ReasonResizeCompleted  = "ResizeCompleted"
	ReasonResizeDeferred   = "ResizeDeferred"
	ReasonResizeInfeasible = "ResizeInfeasible"
	ReasonResizeError      = "ResizeError"
)

// deferredResizeRetry is how long a deferred resize waits at most before it is judged again
// (the kubelet's first retry is after 30 s); a pod that finishes or goes retries at once.
const deferredResizeRetry = 30 * time.Second

// resizeProgressCheck is how soon a pod whose resize is in progress is looked at again: a
// container restarted for it, or an update that failed, is seen to.
const resizeProgressCheck = 5 * time.Second

// ResizeAdmitter judges a resize: the pod with its desired resources, beside the others with
// their allocated ones.
type ResizeAdmitter interface {
	AdmitResize(pod *v1.Pod, others []*v1.Pod) admission.ResizeVerdict
}

// ContainerUsage measures a running container, as the backend does for eviction.
type ContainerUsage interface {
	Usage(ctx context.Context, c runtime.Container) (cgroups.Usage, error)
}

// allocation is the resources the node allocated to a pod's resizable containers, by name,
// and its pod-level resources under podLevel (absent: none).
type allocation map[string]v1.ResourceRequirements

// podLevel is the key of the pod-level resources (spec.resources) in an allocation: no
// container can have it, the API requires a name. Kept in the same map, a resize of both is
// judged, recorded and merged as one.
const podLevel = ""

// podLevelResources is the pod-level resources pod asks for, nil when it sets none (the
// kubelet's IsPodLevelResourcesSet, with empty lists as none).
func podLevelResources(pod *v1.Pod) *v1.ResourceRequirements {
	r := pod.Spec.Resources
	if r == nil || len(r.Requests) == 0 && len(r.Limits) == 0 {
		return nil
	}
	return &v1.ResourceRequirements{Requests: r.Requests.DeepCopy(), Limits: r.Limits.DeepCopy()}
}

// podLevelOf is the pod-level resources a allocates, nil for none.
func (a allocation) podLevelOf() *v1.ResourceRequirements {
	if r, ok := a[podLevel]; ok {
		return r.DeepCopy()
	}
	return nil
}

// toRecord is a as the store keeps it, from the record fromRecord reads.
func (a allocation) toRecord() offline.Allocation {
	rec := offline.Allocation{Containers: maps.Clone(a), Pod: a.podLevelOf()}
	delete(rec.Containers, podLevel)
	return rec
}

func fromRecord(rec offline.Allocation) allocation {
	a := allocation(maps.Clone(rec.Containers))
	if rec.Pod != nil {
		a[podLevel] = *rec.Pod
	}
	return a
}

// resizableContainers are the containers whose resources are allocated and resized (the
// kubelet's IsResizableContainer with InPlacePodVerticalScalingInitContainers, GA and locked
// on in 1.37): every init container, sidecar or not (a regular one is resized while it runs),
// and every app container; ephemeral containers have no resources.
func resizableContainers(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// allocationOf is the resources pod's spec asks for: what is allocated at admission.
func allocationOf(pod *v1.Pod) allocation {
	a := allocation{}
	for _, c := range resizableContainers(pod) {
		a[c.Name] = *c.Resources.DeepCopy()
	}
	if r := podLevelResources(pod); r != nil {
		a[podLevel] = *r
	}
	return a
}

// applyAllocation returns pod with its containers' and its pod-level resources replaced by
// a's (a copy, when they differ; pod itself otherwise), and whether they differed. A container
// a does not name keeps its spec's; pod-level resources a does not hold are none (an
// allocation recorded before they were admitted, of a pod that had none).
func applyAllocation(pod *v1.Pod, a allocation) (*v1.Pod, bool) {
	if a == nil {
		return pod, false
	}
	changed := !apiequality.Semantic.DeepEqual(podLevelResources(pod), a.podLevelOf())
	for _, c := range resizableContainers(pod) {
		if r, ok := a[c.Name]; ok && !apiequality.Semantic.DeepEqual(c.Resources, r) {
			changed = true
		}
	}
	if !changed {
		return pod, false
	}
	out := pod.DeepCopy()
	for _, c := range resizableContainers(out) {
		if r, ok := a[c.Name]; ok {
			c.Resources = *r.DeepCopy()
		}
	}
	out.Spec.Resources = a.podLevelOf()
	return out, true
}

// resizeState is the pod's resize conditions, as the worker reports them (owned by its
// goroutine).
type resizeState struct {
	pending    *v1.PodCondition // PodResizePending: Deferred or Infeasible
	inProgress *v1.PodCondition // PodResizeInProgress: allocated, not yet all applied
}

// conditions are the resize conditions to report.
func (s resizeState) conditions() []v1.PodCondition {
	var out []v1.PodCondition
	for _, c := range []*v1.PodCondition{s.pending, s.inProgress} {
		if c != nil {
			out = append(out, *c)
		}
	}
	return out
}

func resizeCondition(t v1.PodConditionType, reason, message string, generation int64, now time.Time) *v1.PodCondition {
	ts := metav1.NewTime(now.Truncate(time.Second))
	return &v1.PodCondition{Type: t, Status: v1.ConditionTrue, Reason: reason, Message: message,
		ObservedGeneration: generation, LastProbeTime: ts, LastTransitionTime: ts}
}

// loadAllocation sets the worker's allocation once the pod is admitted, if admitOnce did not
// (a pod never judged: it finished in its source): the one the store kept, else its spec's,
// recorded. Returns the allocation.
func (w *worker) loadAllocation(log *slog.Logger, pod *v1.Pod) allocation {
	w.mu.Lock()
	a := w.allocated
	w.mu.Unlock()
	if a != nil {
		return a
	}
	a, kept := w.keptAllocation(log, pod)
	if !kept {
		w.recordAllocation(log, pod.UID, a)
	}
	w.mu.Lock()
	w.allocated = a
	w.mu.Unlock()
	return a
}

// keptAllocation is the pod's allocation as the store kept it (kept: the pod was admitted or
// resized before an agent restart or a reboot), else its spec's, not recorded yet.
func (w *worker) keptAllocation(log *slog.Logger, pod *v1.Pod) (a allocation, kept bool) {
	if w.m.store != nil {
		got, err := w.m.store.GetAllocation(pod.UID)
		switch {
		case err == nil && got.Containers != nil:
			return fromRecord(got), true
		case err != nil && !errors.Is(err, offline.ErrNotFound):
			log.Warn("read the pod's allocated resources; allocating its spec's", "err", err)
		}
	}
	return allocationOf(pod), false
}

// recordAllocation keeps a in the store, before anything runs with it.
func (w *worker) recordAllocation(log *slog.Logger, uid types.UID, a allocation) bool {
	if w.m.store == nil {
		return true
	}
	if err := w.m.store.SetAllocation(uid, a.toRecord()); err != nil {
		log.Warn("record the pod's allocated resources", "err", err)
		return false
	}
	return true
}

// allocatedPod is pod with the resources allocated to its containers.
func (w *worker) allocatedPod(pod *v1.Pod) *v1.Pod {
	w.mu.Lock()
	a := w.allocated
	w.mu.Unlock()
	p, _ := applyAllocation(pod, a)
	return p
}

// handleResize allocates the pod's desired resources when they differ from its allocation
// and fit (the kubelet's handlePodResourcesResize): one decision at a time, with admission's,
// each seeing the allocations before it. It returns when to judge a deferred resize again
// (0: nothing deferred).
func (w *worker) handleResize(log *slog.Logger, pod *v1.Pod) time.Duration {
	w.mu.Lock()
	current := w.allocated
	w.mu.Unlock()
	desired := allocationOf(pod)
	if _, differs := applyAllocation(pod, current); !differs {
		// Desired == allocated: nothing pending (a deferred resize reverted).
		w.resize.pending = nil
		return 0
	}
	w.m.admitMu.Lock()
	if w.m.undecided(pod.UID) {
		// A pod restored after an agent restart whose admission (and so its allocation) is
		// not loaded yet holds resources all the same: judged without it, a deferred resize
		// would take them. Judged once every pod is (its worker's first sync, soon).
		w.m.admitMu.Unlock()
		return time.Second
	}
	verdict := admission.ResizeVerdict{Fit: true}
	if ra := w.m.resizeAdmitter; ra != nil {
		verdict = ra.AdmitResize(pod, w.m.admittedPods(pod.UID))
	}
	if verdict.Fit {
		merged := maps.Clone(current)
		maps.Copy(merged, desired)
		if _, ok := desired[podLevel]; !ok {
			delete(merged, podLevel) // none desired: none allocated
		}
		if !w.recordAllocation(log, pod.UID, merged) {
			w.m.admitMu.Unlock()
			return time.Second // not allocated until it is kept: the next sync tries again
		}
		w.mu.Lock()
		w.allocated = merged
		w.mu.Unlock()
	}
	w.m.admitMu.Unlock()
	now := w.m.now()
	if !verdict.Fit {
		changed := w.resize.pending == nil || w.resize.pending.Reason != verdict.Reason || w.resize.pending.ObservedGeneration != pod.Generation
		if changed {
			w.resize.pending = resizeCondition(v1.PodResizePending, verdict.Reason, verdict.Message, pod.Generation, now)
			reason := ReasonResizeDeferred
			if verdict.Reason == v1.PodReasonInfeasible {
				reason = ReasonResizeInfeasible
			}
			w.m.event(pod, v1.EventTypeWarning, reason, "%s", resizeMessage(pod, pod.Generation, verdict.Message, "Pod resize "+verdict.Reason))
			log.Info("pod resize pending", "reason", verdict.Reason, "message", verdict.Message)
		}
		if verdict.Reason == v1.PodReasonDeferred {
			return deferredResizeRetry
		}
		return 0
	}
	w.resize.pending = nil
	w.resize.inProgress = resizeCondition(v1.PodResizeInProgress, "", "", pod.Generation, now)
	w.m.event(pod, v1.EventTypeNormal, ReasonResizeStarted, "%s", resizeMessage(pod, pod.Generation, "", "Pod resize started"))
	log.Info("pod resize allocated", "generation", pod.Generation)
	if decreased(current, desired) {
		w.m.retryDeferredResizes(pod.UID) // what it gave back may let another's through
	}
	return 0
}

// decreased reports whether any request of next is below cur's.
func decreased(cur, next allocation) bool {
	for name, r := range next {
		for res, q := range cur[name].Requests {
			if n, ok := r.Requests[res]; !ok || n.Cmp(q) < 0 {
				return true
			}
		}
	}
	return false
}

// retryDeferredResizes pokes the workers whose resize is deferred (but except's): resources
// were freed.
func (m *Manager) retryDeferredResizes(except types.UID) {
	for _, w := range m.workerList() {
		if w.podUID() != except && w.hasDeferredResize.Load() {
			w.poke()
		}
	}
}

// resizeMessage is the kubelet's message of a resize event: what, then the desired resources
// of the pod's containers as JSON with the generation (events.podResizeMessage).
func resizeMessage(pod *v1.Pod, generation int64, errorMsg, prefix string) string {
	type containerAllocation struct {
		Name      string                  `json:"name"`
		Resources v1.ResourceRequirements `json:"resources"`
	}
	summary := struct {
		InitContainers []containerAllocation `json:"initContainers,omitempty"`
		Containers     []containerAllocation `json:"containers,omitempty"`
		Generation     int64                 `json:"generation"`
		Error          string                `json:"error,omitempty"`
	}{Generation: generation, Error: errorMsg}
	for _, c := range pod.Spec.InitContainers {
		summary.InitContainers = append(summary.InitContainers, containerAllocation{c.Name, c.Resources})
	}
	for _, c := range pod.Spec.Containers {
		summary.Containers = append(summary.Containers, containerAllocation{c.Name, c.Resources})
	}
	b, err := json.Marshal(summary)
	if err != nil {
		return prefix
	}
	return fmt.Sprintf("%s: %s", prefix, b)
}

// resizeAction is what a running container needs for its cgroup to hold its allocation.
type resizeAction struct {
	container runtime.Container
	spec      *v1.Container
	want      runtime.Resources
	applied   runtime.Resources
	// restart: a changed resource's resizePolicy is RestartContainer.
	restart bool
}

// planResize compares each running resizable container's applied resources (read back from
// its cgroup: applied, by container ID) with its allocated pod's, and says what to do (the
// kubelet's computePodResizeAction): nothing where they match, an update in place, or a
// restart where a changed resource's resizePolicy asks for one. Pure.
func planResize(allocated *v1.Pod, observed []runtime.Container, applied map[string]runtime.Resources, want func(*v1.Container) runtime.Resources, memoryRequest func(runtime.Container) (int64, bool)) []resizeAction {
	byName := groupByName(observed)
	var out []resizeAction
	for _, c := range resizableContainers(allocated) {
		attempts := byName[c.Name]
		if len(attempts) == 0 {
			continue
		}
		latest := attempts[len(attempts)-1]
		got, ok := applied[latest.ID]
		if latest.State != runtime.StateRunning || !ok {
			continue
		}
		target := want(c)
		cpu := !cpuMatches(target, got)
		mem := !podcgroups.MemoryMatches(target.MemoryLimit, got.MemoryLimit)
		// The memory request is in no cgroup: it changes nothing in place, but a container
		// whose memory policy is RestartContainer runs again with it (the kubelet compares
		// it with its actuated request).
		req, known := memoryRequest(latest)
		memRequest := known && req != c.Resources.Requests.Memory().Value() && restartPolicy(c, v1.ResourceMemory)
		if !cpu && !mem && !memRequest {
			continue
		}
		restart := cpu && restartPolicy(c, v1.ResourceCPU) || (mem || memRequest) && restartPolicy(c, v1.ResourceMemory)
		if restart && isRegularInit(allocated, c.Name) {
			// API validation refuses RestartContainer on a regular init container (killed, it
			// would fail the pod, not start again); a spec that did not go through it (a
			// static pod's) is updated in place.
			restart = false
		}
		out = append(out, resizeAction{container: latest, spec: c, want: target, applied: got, restart: restart})
	}
	return out
}

// memoryRequestOf is the memory request container c runs with: the one recorded with it, else
// (a container created before holdfast recorded requests) its allocation's when this run of
// the agent first saw it (noteUnrecordedRequests); unknown (false) when neither says.
func (w *worker) memoryRequestOf(c runtime.Container) (int64, bool) {
	if c.MemoryRequest != nil {
		return *c.MemoryRequest, true
	}
	r, ok := w.unrecordedRequests[c.ID]
	return r, ok
}

// noteUnrecordedRequests takes, for each running container seen for the first time with no
// memory request recorded (created by an agent from before the record), its request in the
// allocation a, before the sync allocates a resize: the agent before applied every allocation
// but a change of the request alone, which it took for done, so that is what it runs with. A
// later resize of the request alone then restarts it where its policy says so, as it does a
// container with the record. Containers no longer observed are forgotten.
func (w *worker) noteUnrecordedRequests(a allocation, observed []runtime.Container) {
	seen := make(map[string]bool, len(observed))
	for _, c := range observed {
		seen[c.ID] = true
		if _, ok := w.unrecordedRequests[c.ID]; ok || c.MemoryRequest != nil || c.State != runtime.StateRunning {
			continue
		}
		if r, ok := a[c.Name]; ok {
			w.unrecordedRequests[c.ID] = r.Requests.Memory().Value()
		}
	}
	for id := range w.unrecordedRequests {
		if !seen[id] {
			delete(w.unrecordedRequests, id)
		}
	}
}

// isRegularInit reports whether name is one of pod's init containers other than a sidecar.
func isRegularInit(pod *v1.Pod, name string) bool {
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.Name == name {
			return !isSidecar(c)
		}
	}
	return false
}

// cpuMatches reports whether the CPU settings applied are want's: the same CFS quota (or the
// one systemd rounds it to, with the systemd cgroup driver) and period, when limited, and the
// same shares, or on cgroup v2 the shares its weight stands for.
func cpuMatches(want, got runtime.Resources) bool {
	if !podcgroups.QuotaMatch(want.CPUQuota, got.CPUQuota, got.CPUPeriod) || want.CPUQuota > 0 && want.CPUPeriod != got.CPUPeriod {
		return false
	}
	return podcgroups.SharesMatch(want.CPUShares, got.CPUShares)
}

// restartPolicy reports whether the container's resizePolicy for resource is
// RestartContainer (the default is NotRequired).
func restartPolicy(c *v1.Container, resource v1.ResourceName) bool {
	for _, p := range c.ResizePolicy {
		if p.ResourceName == resource {
			return p.RestartPolicy == v1.RestartContainer
		}
	}
	return false
}

// actuateResize brings each running container's cgroup to its allocation (the kubelet's
// doPodResizeAction): updated in place, or restarted where its resizePolicy asks (returned as
// kills, which apply carries out; the plan of the next sync starts the new attempt with the
// allocation). already are the containers this sync kills anyway. A failed update is the
// PodResizeInProgress condition's Error, with a ResizeError event.
func (w *worker) actuateResize(ctx context.Context, log *slog.Logger, pod, allocated *v1.Pod, observed []runtime.Container, podCgroup *cgroups.Settings, already []killAction) []killAction {
	actions := planResize(allocated, observed, w.readApplied(ctx, observed), w.wantResources(allocated), w.memoryRequestOf)
	if len(actions) == 0 && !w.podCgroupStale(allocated, podCgroup) {
		return nil
	}
	if w.resize.inProgress == nil {
		// Allocated before an agent restart, or a container started again meanwhile: the
		// resize is still to be applied.
		w.resize.inProgress = resizeCondition(v1.PodResizeInProgress, "", "", pod.Generation, w.m.now())
	}
	var kills []killAction
	var failed []string
	// The pod cgroup holds its containers throughout, as the kubelet orders each resource
	// (the pod raised before its containers, lowered after them): first set to cover them
	// both as they run and as they will (per resource the larger), then, once they are
	// resized, to its allocation exactly.
	pc := w.m.cfg.Cgroups
	if err := w.checkMemoryDecreases(ctx, allocated, actions, already); err != nil {
		// As the kubelet: nothing of the resize is applied while it would set a limit below
		// what a container uses (on cgroup v2 the kernel would OOM-kill it); tried again at
		// the next syncs, the resize in progress with the Error.
		failed = append(failed, err.Error())
		actions = slices.DeleteFunc(actions, func(a resizeAction) bool { return !a.restart })
	} else if pc != nil {
		if err := pc.CoverPod(allocated); err != nil {
			failed = append(failed, fmt.Sprintf("pod cgroup: %v", err))
		}
	}
	for _, a := range actions {
		if containsKill(already, a.container.ID) {
			continue
		}
		if a.restart {
			kills = append(kills, killAction{id: a.container.ID, name: a.spec.Name, reason: "resize requires restart",
				event: fmt.Sprintf("Container %s resize requires restart", a.spec.Name)})
			w.resizeRestarts[a.spec.Name] = true
			continue
		}
		if err := w.m.rt.UpdateContainerResources(ctx, a.container.ID, a.want); err != nil {
			if ctx.Err() != nil {
				return kills
			}
			if errors.Is(err, runtime.ErrNotFound) {
				// It exited since it was observed (a regular init container done with its
				// work): nothing to resize, no error, as containerd's CRI answers the kubelet.
				// A next attempt starts with the allocation.
				log.Debug("container gone before its resize", "container", a.spec.Name)
				continue
			}
			failed = append(failed, fmt.Sprintf("failed to update resources of container %q: %v", a.spec.Name, err))
			continue
		}
		log.Info("container resized in place", "container", a.spec.Name, "cpuShares", a.want.CPUShares, "cpuQuota", a.want.CPUQuota, "memoryLimit", a.want.MemoryLimit)
	}
	if pc != nil && len(failed) == 0 {
		if err := pc.UpdatePod(allocated); err != nil {
			failed = append(failed, fmt.Sprintf("pod cgroup: %v", err))
		}
	}
	if len(failed) > 0 {
		msg := strings.Join(failed, "; ")
		if c := w.resize.inProgress; c.Reason != v1.PodReasonError || c.Message != msg {
			c.Reason, c.Message = v1.PodReasonError, msg
			w.m.event(pod, v1.EventTypeWarning, ReasonResizeError, "%s", resizeMessage(allocated, c.ObservedGeneration, msg, "Pod resize error"))
		}
	}
	return kills
}

// readPodCgroup is what the pod's cgroup holds, read once a sync: judged against the
// allocation by the resize, reported in the status while the pod runs. nil without pod
// cgroups, or when it cannot be read (a pod from before pod cgroups).
func (w *worker) readPodCgroup(log *slog.Logger, allocated *v1.Pod) *cgroups.Settings {
	pc := w.m.cfg.Cgroups
	if pc == nil {
		return nil
	}
	got, err := pc.ReadPod(allocated)
	if err != nil {
		log.Debug("read the pod cgroup", "err", err)
		return nil
	}
	return &got
}

// runningPodCgroup is podCgroup while a container of the pod runs (the status reports a
// running pod's cgroup), else nil (its allocation is reported).
func runningPodCgroup(podCgroup *cgroups.Settings, observed []runtime.Container) *cgroups.Settings {
	if !slices.ContainsFunc(observed, isRunning) {
		return nil
	}
	return podCgroup
}

// podCgroupStale reports whether the pod's cgroup does not hold what the pod, as allocated,
// gives it (ResourceConfigForPod): a pod-level resize still to apply there, a container
// resized while it did not run (an app container during the init phase, an init container
// not started yet, one in back-off), which must not start under its pod's old limits (the
// kubelet's startingResizedContainer updates the pod cgroup first), or a resize cut short by
// an agent restart between CoverPod and UpdatePod. got is the pod cgroup read back
// (readPodCgroup); one that could not be read (nil) is not judged stale: its containers'
// resize goes on.
func (w *worker) podCgroupStale(allocated *v1.Pod, got *cgroups.Settings) bool {
	return got != nil && !w.m.cfg.Cgroups.PodHolds(allocated, *got)
}

// checkMemoryDecreases refuses, as the kubelet's validateMemoryResizeAction, memory limits
// lowered in place below what the containers use now, and a pod cgroup's memory limit lowered
// below what the pod uses as a whole: containers without limits of their own each under a
// pod-level limit lowered to less than their sum would pass one by one, and the pod cgroup's
// new limit OOM-kill them (cgroup v2) or be refused half-applied (v1). The pod's usage is its
// cgroup's, as the kubelet reads it: its running containers' added up would miss what an
// exited init container left in a memory-backed emptyDir. Without a usage source
// (Config.Usage) the containers' limits are not checked.
func (w *worker) checkMemoryDecreases(ctx context.Context, allocated *v1.Pod, actions []resizeAction, already []killAction) error {
	var errs []string
	if pc := w.m.cfg.Cgroups; pc != nil {
		desired, current, used, err := pc.PodMemory(allocated)
		switch {
		case err != nil:
			w.m.log.Debug("read the pod cgroup's memory", "pod", allocated.UID, "err", err)
		case desired > 0 && (current == 0 || desired < current) && used >= desired:
			errs = append(errs, fmt.Sprintf("attempting to set pod memory limit (%d) below current usage (%d)", desired, used))
		}
	}
	for _, a := range actions {
		lowered := a.want.MemoryLimit > 0 && (a.applied.MemoryLimit == 0 || a.want.MemoryLimit < a.applied.MemoryLimit)
		if w.m.cfg.Usage == nil || a.restart || !lowered || containsKill(already, a.container.ID) {
			continue
		}
		u, err := w.m.cfg.Usage.Usage(ctx, a.container)
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("missing container %q memory usage: %v", a.spec.Name, err))
		case u.MemoryUsage >= a.want.MemoryLimit:
			errs = append(errs, fmt.Sprintf("attempting to set container %q memory limit (%d) below current usage (%d)", a.spec.Name, a.want.MemoryLimit, u.MemoryUsage))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cannot decrease memory limits: %s", strings.Join(errs, ", "))
	}
	return nil
}

func containsKill(kills []killAction, id string) bool {
	for _, k := range kills {
		if k.id == id {
			return true
		}
	}
	return false
}

// wantResources is what each container of the allocated pod is to run with.
func (w *worker) wantResources(allocated *v1.Pod) func(*v1.Container) runtime.Resources {
	return func(c *v1.Container) runtime.Resources {
		return containerResources(allocated, c, w.m.cfg.MemoryCapacity, w.m.cfg.NoSwap)
	}
}

// readApplied reads back what the cgroups of the running containers hold, by container ID; a
// container the runtime cannot tell of is left out (its status reports its allocation).
func (w *worker) readApplied(ctx context.Context, observed []runtime.Container) map[string]runtime.Resources {
	out := map[string]runtime.Resources{}
	for _, c := range observed {
		if c.State != runtime.StateRunning {
			continue
		}
		if r, err := w.m.rt.ContainerResources(ctx, c.ID); err == nil {
			out[c.ID] = r
		} else if !errors.Is(err, runtime.ErrNotFound) && ctx.Err() == nil {
			w.m.log.Debug("read a container's applied resources", "container", c.Name, "err", err)
		}
	}
	return out
}

// noteResizeProgress ends the PodResizeInProgress condition, with the kubelet's
// ResizeCompleted event, once every running container's cgroup holds its allocation and no
// container restarted for the resize is still to run again.
func (w *worker) noteResizeProgress(pod, allocated *v1.Pod, observed []runtime.Container, applied map[string]runtime.Resources, podCgroup *cgroups.Settings) {
	want := w.wantResources(allocated)
	byName := groupByName(observed)
	for name := range w.resizeRestarts {
		attempts := byName[name]
		c := findContainer(allocated, name)
		if c == nil || len(attempts) == 0 {
			delete(w.resizeRestarts, name)
			continue
		}
		latest := attempts[len(attempts)-1]
		if got, ok := applied[latest.ID]; ok && latest.State == runtime.StateRunning && cpuMatches(want(c), got) && podcgroups.MemoryMatches(want(c).MemoryLimit, got.MemoryLimit) {
			delete(w.resizeRestarts, name)
		}
	}
	if w.resize.inProgress == nil || len(w.resizeRestarts) > 0 || len(planResize(allocated, observed, applied, want, w.memoryRequestOf)) > 0 || w.podCgroupStale(allocated, podCgroup) {
		return
	}
	generation := w.resize.inProgress.ObservedGeneration
	w.resize.inProgress = nil
	w.m.event(pod, v1.EventTypeNormal, ReasonResizeCompleted, "%s", resizeMessage(allocated, generation, "", "Pod resize completed"))
}

// statusResources is what a running container's status reports (the kubelet's
// convertContainerStatusResources): its allocation, with the CPU and memory its cgroup holds
// where they differ from what the allocation gives (a resize not applied yet, or refused).
// The memory request is in no cgroup: the allocation's.
func statusResources(allocated v1.ResourceRequirements, want, got runtime.Resources) *v1.ResourceRequirements {
	r := allocated.DeepCopy()
	if r.Limits != nil {
		if _, ok := r.Limits[v1.ResourceCPU]; ok && (!podcgroups.QuotaMatch(want.CPUQuota, got.CPUQuota, got.CPUPeriod) || got.CPUPeriod != want.CPUPeriod) {
			if got.CPUQuota > 0 && got.CPUPeriod > 0 {
				r.Limits[v1.ResourceCPU] = *resourceMilli(got.CPUQuota * podcgroups.MilliCPUToCPU / got.CPUPeriod)
			} else {
				delete(r.Limits, v1.ResourceCPU)
			}
		}
		if _, ok := r.Limits[v1.ResourceMemory]; ok && !podcgroups.MemoryMatches(want.MemoryLimit, got.MemoryLimit) {
			if got.MemoryLimit > 0 {
				r.Limits[v1.ResourceMemory] = *resourceBytes(got.MemoryLimit)
			} else {
				delete(r.Limits, v1.ResourceMemory)
			}
		}
	}
	if r.Requests != nil {
		if _, ok := r.Requests[v1.ResourceCPU]; ok && !podcgroups.SharesMatch(want.CPUShares, got.CPUShares) {
			r.Requests[v1.ResourceCPU] = *resourceMilli(podcgroups.SharesToMilliCPU(got.CPUShares))
		}
	}
	return r
}
