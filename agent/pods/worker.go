package pods

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/credentials"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/internal/expansion"
	"github.com/holdfast-dev/holdfast/internal/failpoint"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
	"github.com/holdfast-dev/holdfast/internal/podutil"
	"github.com/holdfast-dev/holdfast/offline"
)

// resyncPeriod bounds how long a pod goes without a sync even when nothing signals it
// (kubelet's syncFrequency). What changes a pod signals its worker: its source (spec,
// deletion), a task event (exit, OOM), the prober, the services cache, and the relist for
// what events missed; timed steps (back-off, pull retry, active deadline) set their own,
// shorter, next sync. Each sync asks the shims of the pod's containers for their state.
const resyncPeriod = time.Minute

// worker owns one pod: it alone creates, starts, stops and removes the pod's containers.
type worker struct {
	m      *Manager
	signal chan struct{} // buffered(1): a pending "sync again", coalesced

	mu  sync.Mutex // protects pod, phase, terminatedFrom, removal, activeTermination, cancelRun, readded, decision, eviction, restart
	pod *v1.Pod
	// phase is where the pod is in its life (phase.go); only the worker's goroutine moves
	// it, under mu, so that goroutine reads it without.
	phase lifePhase
	// terminatedFrom is the phase the pod's termination began in, once it began.
	terminatedFrom lifePhase
	// removal is the pod's authoritative removal (Manager.Remove, or an orphan's adoption),
	// nil when there is none: the pod is terminated.
	removal *removalOrder
	// activeTermination is the termination in progress (a call to terminate), nil when none
	// is: a deletion with a shorter grace period cancels it.
	activeTermination *termination
	// cancelRun cancels the sync in progress of a pod not being terminated (nil when none
	// runs): a deletion does not wait for what it is blocked on.
	cancelRun context.CancelFunc
	// readded is the pod its source delivered again after removing it (a static manifest
	// removed and put back, same UID): once this termination is over, it runs again.
	readded *v1.Pod
	// decision is the admission outcome, nil until the first sync decides it.
	decision *admission.Result
	// eviction is the eviction manager's order to evict the pod, nil when there is none.
	eviction *evictionOrder
	// restart is why the pod's running containers are to be stopped and started again by their
	// restart policy (`holdfast restart`), empty when they are not.
	restart string

	// Owned by the worker's goroutine.
	waiting    map[string]waitingInfo
	messages   map[string]string // termination messages of exited containers, by ID
	lastPodIPs []string          // the pod's addresses as last reported
	startTime  time.Time
	// deadlineExceeded and evicted are why the pod's run ended, as its status reports it:
	// it ran past spec.activeDeadlineSeconds; it was evicted for node pressure (stopped,
	// Failed with reason Evicted). Either moves a running pod to phaseFinishing; either may
	// also come after the pod finished on its own, and then changes what its status says.
	deadlineExceeded bool
	evicted          *evictionOrder
	// seen is when the worker was made (the pod first seen); startPending: the pod had no
	// running container at its first sync (not adopted from an earlier run of the agent) and
	// has not had all its containers running since: its startup is still to be recorded.
	seen         time.Time
	startPending bool
	// waitsFor is the UID of the previous version of this static pod it waits for, while it
	// does ("" otherwise): to log the wait once.
	waitsFor types.UID
	trace    startTrace // where the start went so far, while startPending
	syncErr  error      // why the sync in progress gave up, to be retried; nil when it did not
	// startFailed holds each container's consecutive failed starts (not for an image pull,
	// which has its own back-off): it is not tried again before its back-off has passed,
	// however often the worker is poked. Each failure changes the pod's status when its
	// message does (a CRI runtime names the container ID it made), and the status update
	// coming back from the API poked the worker: without this, a container that cannot be
	// created was tried again every few milliseconds, with a status patch and an event each
	// time. A change of the container's image (its hash) starts it over: the fix of a
	// failing start is tried at once, as the kubelet keys its back-off by image.
	startFailed map[string]*startBackOff
	// networkFailed holds the consecutive failures of the pod's network setup.
	networkFailed retryBackOff

	// allocated is the resources the node allocated to the pod's containers (resize.go), nil
	// until it is admitted. Under mu: other pods' admission and resizes read it.
	allocated allocation
	// resize is the pod's resize conditions; resizeRestarts the containers stopped for a
	// resize (resizePolicy RestartContainer) not yet running again with their allocation.
	// Owned by the worker's goroutine.
	resize         resizeState
	resizeRestarts map[string]bool
	// unrecordedRequests is, by container ID, the memory request a running container created
	// before holdfast recorded requests with its containers (runtime.Container.MemoryRequest
	// nil) runs with: its allocation's when this run of the agent first saw it, before any
	// resize this run allocated. Owned by the worker's goroutine.
	unrecordedRequests map[string]int64
	// hasDeferredResize: the pod's resize waits for resources (Deferred); read by other
	// workers to poke this one when resources are freed.
	hasDeferredResize atomic.Bool
}

// startRetryDelay is how long a start waiting for the cluster's services waits before the
// next try, should the poke that ends the wait never come.
const startRetryDelay = retryInitial

func newWorker(m *Manager, pod *v1.Pod) *worker {
	return &worker{m: m, pod: pod, signal: make(chan struct{}, 1), waiting: map[string]waitingInfo{}, messages: map[string]string{},
		startFailed: map[string]*startBackOff{}, seen: m.now(), resizeRestarts: map[string]bool{}, unrecordedRequests: map[string]int64{}}
}

// startBackOff is a container's failed starts, for the spec (containerHash) they failed with.
type startBackOff struct {
	retryBackOff
	hash string
}

// errWaitingForServices is the cause of a start that waits for the cluster's services to be
// read once (ServiceSource's only error).
var errWaitingForServices = errors.New("waiting for the cluster's services")

// startHeldFor is how long the start of container name must still wait after its last failed
// start (0: it may be tried now).
func (w *worker) startHeldFor(c *v1.Container) time.Duration {
	b, ok := w.startFailed[c.Name]
	if !ok || b.hash != containerHash(c) {
		return 0
	}
	return b.heldFor(w.m.now())
}

// noteStart records how a start of container c ended (err nil: it runs) and returns when the
// worker must look at the pod again for it (0: no need).
func (w *worker) noteStart(pod *v1.Pod, c *v1.Container, err error) time.Duration {
	switch {
	case err == nil:
		delete(w.startFailed, c.Name)
		return 0
	case errors.Is(err, errImagePullBackOff) || errors.Is(err, runtime.ErrImagePull):
		return w.pullRetryIn(pod, c) // pulls have their own back-off
	case errors.Is(err, errWaitingForServices):
		// Not held back by startRetryDelay: the source pokes every worker the moment the
		// services are read (Manager.ResyncAll, from services.Cache.OnKnown), and a pod with
		// a short activeDeadlineSeconds or startup probe budget must not lose 5 s after
		// that. The message does not change from one try to the next, so pokes from the
		// pod's own status updates do not turn into a loop. The timer is the fallback
		// should the poke never come.
		delete(w.startFailed, c.Name)
		return startRetryDelay
	case errors.As(err, new(*errConfig)), errors.As(err, new(*runtime.ConfigError)), errors.Is(err, runtime.ErrImageNeverPull):
		// Waiting for data rather than failing (a ConfigMap or Secret key not there yet, an
		// image to be side-loaded for pull policy Never; CreateContainerConfigError on both
		// backends): tried again every retryInitial, as the kubelet retries it at each sync,
		// so that the pod starts soon after it comes. The message does not change from one
		// try to the next: no status patch, no event per try.
		b := &startBackOff{hash: containerHash(c)}
		w.startFailed[c.Name] = b
		return b.failed(w.m.now())
	default:
		b := w.startFailed[c.Name]
		if b == nil || b.hash != containerHash(c) {
			b = &startBackOff{hash: containerHash(c)}
			w.startFailed[c.Name] = b
		}
		return b.failed(w.m.now())
	}
}

func (w *worker) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// snapshot is the pod's latest version and its removal order (nil: none).
func (w *worker) snapshot() (*v1.Pod, *removalOrder) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod, w.removal
}

func (w *worker) latestPod() *v1.Pod {
	pod, _ := w.snapshot()
	return pod
}

// isOrphan reports whether the worker tears down containers no source claims (see
// removalOrder.orphan).
func (w *worker) isOrphan() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.removal != nil && w.removal.orphan
}

// evictionOrder is an eviction of the pod for node pressure: its containers are stopped with
// the grace period and it ends Failed with reason Evicted and the message.
type evictionOrder struct {
	grace   time.Duration
	message string
}

// termination is a termination in progress and the grace period it runs with.
type termination struct {
	grace  time.Duration
	cancel context.CancelFunc
}

// setPod records the pod's latest spec. A deletion with a shorter grace period than the
// termination in progress (kubectl delete --grace-period on a terminating pod) cancels that
// termination, and the next sync terminates again with the shorter one: as with kubelet's
// pod workers, a grace period can only decrease.
//
// A source delivering again a pod it removed (same UID: a static manifest put back while its
// pod terminates) is remembered; the manager starts it again once the termination is over,
// as kubelet restarts such a pod.
// setPod hands the worker the pod's latest version and reports whether it must sync for it.
// An update that changes only what the node reports of its containers (the status but its
// conditions, and the write's resource version and managed fields: the echo of the worker's
// own status patch, most of the time) needs no sync: the worker keeps it as the baseline of
// the next status it computes. Waking the worker for each echo made a loop of any failure
// whose message changes from one try to the next (a CRI sandbox ID). A change of conditions
// does wake it, as the kubelet reconciles readiness: a readiness gate another controller set
// makes the pod Ready, and Ready=False written by the node lifecycle controller while the
// node was away is the node's to correct.
func (w *worker) setPod(pod *v1.Pod) (wake bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.removal != nil && pod.DeletionTimestamp == nil {
		// Delivered again while it terminates: started afresh once the termination is done.
		// An orphan worker too (containers found at start that no source claimed yet): its
		// pod's source has delivered it after all, and must not find it stopped for good.
		w.readded = pod
		return true
	}
	// A status change wakes the worker when it decides something: conditions (readiness
	// gates), a phase set Succeeded or Failed by another writer (the pod is stopped).
	wake = specOrMetaChanged(w.pod, pod) || !apiequality.Semantic.DeepEqual(w.pod.Status.Conditions, pod.Status.Conditions) ||
		(podutil.IsTerminal(pod.Status.Phase) && !podutil.IsTerminal(w.pod.Status.Phase))
	w.pod = pod
	if t := w.activeTermination; t != nil && pod.DeletionTimestamp != nil && gracePeriod(pod) < t.grace {
		t.cancel()
	}
	if pod.DeletionTimestamp != nil {
		w.cancelRunLocked()
	}
	return wake
}

// specOrMetaChanged reports whether b differs from a in more than its status, resource
// version and managed fields.
func specOrMetaChanged(a, b *v1.Pod) bool {
	am, bm := a.ObjectMeta, b.ObjectMeta // shallow copies, to clear what a status write changes
	am.ResourceVersion, bm.ResourceVersion = "", ""
	am.ManagedFields, bm.ManagedFields = nil, nil
	return !apiequality.Semantic.DeepEqual(am, bm) || !apiequality.Semantic.DeepEqual(a.Spec, b.Spec)
}

// cancelRunLocked cancels the sync in progress, if one runs, because the pod is deleted.
func (w *worker) cancelRunLocked() {
	if w.cancelRun != nil {
		w.cancelRun()
		w.cancelRun = nil
	}
}

// run syncs the pod whenever signalled, on its resync timer, or when a back-off expires,
// until the pod is torn down or ctx ends. Ending ctx only stops the worker: the containers
// keep running (stopping the agent is not stopping the workload).
func (w *worker) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.signal:
		case <-timer.C:
		}
		next := w.timedSync(ctx)
		if w.phase == phaseTerminated {
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// timedSync syncs the pod and records how long the sync took, by the kubelet's operation
// types and whether it gave up.
func (w *worker) timedSync(ctx context.Context) time.Duration {
	pod, removal := w.snapshot()
	op := metrics.OperationSync
	switch {
	case removal != nil || pod.DeletionTimestamp != nil:
		op = metrics.OperationKill
	case w.phase == phaseAdmitting:
		op = metrics.OperationCreate
	}
	began := time.Now()
	w.syncErr = nil
	next := w.sync(ctx)
	if ctx.Err() != nil {
		return next // the agent stops: the sync was cut short, not slow
	}
	result := metrics.ResultSuccess
	if w.syncErr != nil {
		result = metrics.ResultError
	}
	w.m.cfg.Metrics.ObservePodSync(op, result, time.Since(began))
	return next
}

// sync brings the pod one step closer to its spec and reports its status. It returns when
// the next sync is due at the latest. Its phases: observe the runtime; terminate a deleted
// pod; otherwise admit once, then either report a finished pod (its network and volumes
// released) or prepare network and volumes, plan, apply and report.
func (w *worker) sync(ctx context.Context) time.Duration {
	pod, removal := w.snapshot()
	log := w.m.log.With("pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
	observed, err := w.m.rt.ListPod(ctx, string(pod.UID))
	if err != nil {
		log.Warn("observe pod containers", "err", err)
		w.syncErr = err
		return time.Second
	}
	if removal != nil || pod.DeletionTimestamp != nil {
		reason := ""
		if removal != nil {
			reason = removal.reason
		}
		return w.syncTermination(ctx, log, observed, reason)
	}
	// A deletion arriving now cancels this sync, whatever it waits for (an image pull, a
	// postStart hook), as kubelet's pod workers do: the termination comes next.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	w.cancelRun = cancel
	deleted := w.removal != nil || w.pod.DeletionTimestamp != nil
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelRun = nil
		w.mu.Unlock()
	}()
	if deleted {
		return 0
	}
	if prev := w.previousStaticVersion(runCtx, pod, observed); prev != "" {
		if w.waitsFor != prev {
			w.waitsFor = prev
			log.Info("static pod waits for its previous version to stop before it starts", "previousUID", prev)
		}
		return resyncPeriod // its worker's end pokes this one (Manager.startWorkerLocked)
	}
	w.waitsFor = ""
	next := w.syncRunning(runCtx, log, pod, observed)
	if runCtx.Err() != nil && ctx.Err() == nil {
		log.Info("sync cancelled: the pod is being deleted")
		return 0
	}
	return next
}

// previousStaticVersion is the UID of another version of this static pod (same namespace and
// name: its manifest edited, and so its UID) whose worker still runs or terminates, "" if
// none or if this one already has containers running (adopted across an agent restart).
// Started beside it, the two would share the host's ports and hostPath data for the old one's
// grace period: as the kubelet, a static pod waits for its previous version to stop.
//
// A previous version no worker has yet (its containers found running after an agent restart:
// the manifest edited while the agent was down, or an edit cut short by a kill) counts too,
// if its container or its record says it came from a manifest (an API pod of the same name is
// no previous version: it does not hold the static pod up): the relist hands it to an orphan
// worker once the file source has read its directory (Manager.isStatic), and is asked to look
// now. One the relist adopts while this looks counts by its orphan worker's pod, which says
// whether it is a static pod's.
func (w *worker) previousStaticVersion(ctx context.Context, pod *v1.Pod, observed []runtime.Container) types.UID {
	if !manifest.IsStatic(pod) || slices.ContainsFunc(observed, isRunning) {
		return ""
	}
	for _, other := range w.m.workerList() {
		if other == w {
			continue
		}
		p := other.latestPod()
		if p.UID != pod.UID && manifest.IsStatic(p) && p.Namespace == pod.Namespace && p.Name == pod.Name {
			return p.UID
		}
	}
	all, err := w.m.rt.List(ctx)
	if err != nil {
		return "" // the runtime cannot tell: the worker's start goes through it again anyway
	}
	for _, c := range all {
		if c.State != runtime.StateRunning || c.PodUID == string(pod.UID) || c.PodNamespace != pod.Namespace || c.PodName != pod.Name {
			continue
		}
		uid := types.UID(c.PodUID)
		// A worker may have it now that had none in the pass above: the relist adopted it as
		// an orphan in between (at the agent's start, the first relist and this worker's
		// first sync run at once). Its worker's pod says whether it is a static pod's, as
		// the pass above would have read it; skipped as known, it counted in neither pass
		// and both versions ran for the old one's grace period. Once that worker is gone
		// (delete under the manager's lock, then the poke of this static pod's workers) the
		// next sync looks again.
		if other := w.m.worker(uid); other != nil {
			if manifest.IsStatic(other.latestPod()) {
				return uid
			}
			continue
		}
		if c.Static || w.m.recordedAsStatic(uid) {
			w.m.requestRelist(0)
			return uid
		}
	}
	return ""
}

// syncTermination stops and removes the pod's containers, network and volumes. A deletion
// with a shorter grace period cuts a termination in progress short (see setPod).
func (w *worker) syncTermination(ctx context.Context, log *slog.Logger, observed []runtime.Container, reason string) time.Duration {
	if reason == "" {
		reason = "pod deleted in the API"
	}
	termCtx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.moveToLocked(phaseTerminating)
	pod := w.pod // the latest: a shorter grace period that came since the snapshot counts
	w.activeTermination = &termination{grace: gracePeriod(pod), cancel: cancel}
	w.mu.Unlock()
	err := w.terminate(termCtx, pod, observed, reason)
	shortened := termCtx.Err() != nil && ctx.Err() == nil
	cancel()
	w.mu.Lock()
	w.activeTermination = nil
	w.mu.Unlock()
	if err != nil && shortened {
		log.Info("grace period shortened; terminating again", "grace", gracePeriod(w.latestPod()))
		return 0
	}
	if err != nil {
		log.Warn("terminate pod", "err", err)
		w.syncErr = err
		return time.Second
	}
	w.mu.Lock()
	removed := w.removal != nil
	w.mu.Unlock()
	if w.m.store != nil && removed {
		// Gone from its source and from the node: its record goes too, or the store keeps
		// it for good (a record per version of a static manifest) and an offline boot may run
		// it again (the record the first sync's admission wrote back after the source had
		// removed the pod). Not for an API pod the node terminated because it is being
		// deleted: its final status may still wait in the outbox, which keeps the statuses of
		// pods with a record; the API source deletes the record when the API deletes the pod.
		if err := w.m.store.DeletePod(pod.UID); err != nil && !errors.Is(err, offline.ErrNotFound) {
			log.Warn("remove the record of a terminated pod", "err", err)
		}
	}
	w.moveTo(phaseTerminated)
	return 0
}

// syncRunning runs an admitted pod that is not being deleted.
func (w *worker) syncRunning(ctx context.Context, log *slog.Logger, pod *v1.Pod, observed []runtime.Container) time.Duration {
	if w.startTime.IsZero() {
		w.startTime = w.m.now()
		// A pod none of whose containers runs is started (a new pod, or a pod cached across
		// a reboot); one whose containers run was adopted from a previous run of the agent.
		w.startPending = !slices.ContainsFunc(observed, isRunning)
	}
	if w.phase == phaseAdmitting && finishedInItsSource(pod, observed) {
		// As the kubelet: a pod its source reports finished (Succeeded or Failed: the node
		// said so before a restart or a reboot that lost its containers, or its record did) of
		// which nothing runs here is never started again. Started, a Job's pod would run twice.
		log.Info("pod finished before (its status says " + string(pod.Status.Phase) + ") and nothing of it runs: not started again")
		w.mu.Lock()
		// Never admitted in this life, and never to be: a later sync must not take it
		// for a pod to admit (a rejection would turn its Succeeded into Failed).
		w.decision = &admission.Result{Admitted: true}
		w.moveToLocked(phaseFinishing)
		w.mu.Unlock()
		return w.syncFinished(ctx, log, pod, observed)
	}
	began := w.m.now()
	r := w.admitOnce(ctx, log, pod, observed)
	w.timePhase(metrics.PhaseAdmission, began)
	if !r.Admitted {
		st := admission.Rejected(r)
		st.QOSClass = pod.Status.QOSClass
		w.m.status.SetPodStatus(pod, st)
		return time.Minute
	}
	w.recordExits(ctx, log, observed)
	next := resyncPeriod
	// A pod its source says is Succeeded or Failed is stopped, also while its containers run
	// (another writer set its phase: a controller that gave up on it, an operator), as the
	// kubelet does: reported Running over that phase, it would run on, unseen by the cluster.
	finished := w.phase == phaseFinishing || w.phase == phaseFinished || podFinished(pod, observed) || podutil.IsTerminal(pod.Status.Phase)
	if d, ok := w.activeDeadline(pod); ok && !finished {
		// A pod that finished on its own is past any deadline's reach (the kubelet applies it
		// to active pods only): its status stays Succeeded, not Failed for DeadlineExceeded.
		if d > 0 {
			next = min(next, d)
		} else if !w.deadlineExceeded {
			w.deadlineExceeded = true
			log.Info("pod active longer than its activeDeadlineSeconds; stopping it", "activeDeadlineSeconds", *pod.Spec.ActiveDeadlineSeconds)
			w.m.event(pod, v1.EventTypeNormal, ReasonDeadlineExceeded, "%s", MessageDeadlineExceeded)
		}
	}
	if w.evicted == nil {
		w.evicted = w.evictionOrdered(pod)
	}
	w.readTerminationMessages(pod, observed)
	if finished || w.deadlineExceeded || w.evicted != nil {
		return w.syncFinished(ctx, log, pod, observed)
	}

	// The spec's resources are desired; the containers run with the allocated ones.
	desired := pod
	w.noteUnrecordedRequests(w.loadAllocation(log, desired), observed)
	if retry := w.handleResize(log, desired); retry > 0 {
		next = min(next, retry)
		w.hasDeferredResize.Store(true)
	} else {
		w.hasDeferredResize.Store(false)
	}
	pod = w.allocatedPod(desired)

	podIPs, hostIPs, vols, ok, prepNext := w.prepare(ctx, log, pod)
	next = min(next, prepNext)
	p := computePlan(pod, observed, w.m.backoff, w.startedFunc(pod))
	p.kill = append(p.kill, w.probeKills(pod, observed, p.kill)...)
	p.kill = append(p.kill, w.restartKills(observed, p.kill)...)
	var podCgroup *cgroups.Settings
	if ok {
		podCgroup = w.readPodCgroup(log, pod)
		p.kill = append(p.kill, w.actuateResize(ctx, log, desired, pod, observed, podCgroup, p.kill)...)
		next = min(next, w.apply(ctx, log, pod, observed, p, podIPs, hostIPs, vols))
	}
	for name, d := range p.backOff {
		w.m.event(pod, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s", name)
		next = min(next, max(d/4, 100*time.Millisecond))
	}
	if ctx.Err() != nil {
		return 0 // cancelled by a deletion: what was observed is out of date
	}
	if len(p.start)+len(p.kill)+len(p.remove) > 0 {
		var err error
		if observed, err = w.observe(ctx, log, pod); err != nil {
			log.Warn("observe pod containers", "err", err)
			w.syncErr = err
			return time.Second
		}
	}
	w.lastPodIPs = podIPs
	ready, started := w.updateProber(pod, observed, podIPs, hostIPs)
	applied := w.readApplied(ctx, observed)
	if !ok || w.resize.inProgress != nil {
		// Not read this sync, or changed by the resize since: read (again).
		podCgroup = w.readPodCgroup(log, pod)
	}
	w.noteResizeProgress(desired, pod, observed, applied, podCgroup)
	if w.resize.inProgress != nil {
		next = min(next, resizeProgressCheck)
	}
	st := computeStatus(statusInput{
		pod: pod, observed: observed, waiting: w.waiting, backOff: p.backOff,
		podIPs: podIPs, hostIPs: hostIPs, startTime: w.startTime, now: w.m.now(),
		ready: ready, started: started, messages: w.messages,
		applied: applied, want: w.wantResources(pod), resize: w.resize.conditions(),
		podCgroup: runningPodCgroup(podCgroup, observed),
	})
	if w.startPending && allContainersRunning(pod, st) {
		w.reportStart(log, w.m.now().Sub(w.seen))
		w.startPending = false
	}
	w.m.status.SetPodStatus(desired, st)
	return next
}

// allContainersRunning reports whether every (non-init) container of the pod runs, as the
// status says: the end of its startup.
func allContainersRunning(pod *v1.Pod, st v1.PodStatus) bool {
	running := 0
	for _, cs := range st.ContainerStatuses {
		if cs.State.Running != nil {
			running++
		}
	}
	return len(pod.Spec.Containers) > 0 && running == len(pod.Spec.Containers)
}

// evictionOrdered returns the eviction ordered by the eviction manager, or the one reported
// before an agent restart (the pod's status says Failed, Evicted), nil when there is none.
func (w *worker) evictionOrdered(pod *v1.Pod) *evictionOrder {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.eviction != nil {
		return w.eviction
	}
	if pod.Status.Phase == v1.PodFailed && pod.Status.Reason == ReasonEvicted {
		// Its containers were being stopped when the agent went down: they go at once.
		return &evictionOrder{grace: time.Second, message: pod.Status.Message}
	}
	return nil
}

// admitOnce runs admission the first time the pod is synced and returns its decision.
func (w *worker) admitOnce(ctx context.Context, log *slog.Logger, pod *v1.Pod, observed []runtime.Container) admission.Result {
	w.mu.Lock()
	decision := w.decision
	w.mu.Unlock()
	if decision != nil {
		return *decision
	}
	var fromSpec allocation // allocated now from the spec: to be recorded after the pod's record
	r := w.m.admit(ctx, pod, observed, func(r admission.Result) {
		// The allocation is published with the decision, in admission's order: from the
		// moment the pod counts for another pod's admission or resize, it counts with what
		// it was allocated. Published first, a pod restored with a pending resize was
		// counted with its spec until its allocation was read, and one judged meanwhile was
		// rejected for resources the node had.
		var a allocation
		if r.Admitted {
			var kept bool
			if a, kept = w.keptAllocation(log, pod); !kept {
				fromSpec = a
			}
		}
		w.mu.Lock()
		w.decision = &r
		w.allocated = a
		if r.Admitted {
			w.moveToLocked(phaseRunning)
		} else {
			w.moveToLocked(phaseRejected)
		}
		w.mu.Unlock()
	})
	if fromSpec != nil {
		// After admit recorded the pod, which the allocation's record belongs to; before
		// anything runs with it.
		w.recordAllocation(log, pod.UID, fromSpec)
	}
	if !r.Admitted {
		log.Info("pod rejected by admission", "reason", r.Reason, "message", r.Message)
		w.m.event(pod, v1.EventTypeWarning, r.Reason, "%s", r.Message)
	}
	return r
}

// observe lists the pod's containers again after the sync changed them, with their exits
// recorded and their termination messages read: a container started by this sync may have
// exited already, and its message is read only once its exit is recorded.
func (w *worker) observe(ctx context.Context, log *slog.Logger, pod *v1.Pod) ([]runtime.Container, error) {
	observed, err := w.m.rt.ListPod(ctx, string(pod.UID))
	if err != nil {
		return nil, err
	}
	w.recordExits(ctx, log, observed)
	w.readTerminationMessages(pod, observed)
	return observed, nil
}

// recordExits writes the exits the runtime reports on the containers themselves, and takes
// what was recorded into observed: that it was (Recorded), and the reason (an OOM kill found
// in the container's cgroup, which the task list cannot tell).
func (w *worker) recordExits(ctx context.Context, log *slog.Logger, observed []runtime.Container) {
	for i, c := range observed {
		if c.State == runtime.StateExited && !c.Recorded {
			reason, err := w.m.rt.RecordExit(ctx, c.ID)
			if err != nil {
				log.Warn("record container exit", "container", c.Name, "err", err)
				continue
			}
			observed[i].Recorded = true
			if reason != "" {
				observed[i].Reason = reason
			}
		}
	}
}

// readTerminationMessages reads the termination message of each container attempt once, when
// it is first seen exited, or, for a message to come from its log, first seen with its exit
// recorded (terminationMessage); the messages of attempts no longer observed are forgotten.
func (w *worker) readTerminationMessages(pod *v1.Pod, observed []runtime.Container) {
	seen := make(map[string]bool, len(observed))
	for _, c := range observed {
		seen[c.ID] = true
		if _, ok := w.messages[c.ID]; ok || c.State != runtime.StateExited {
			continue
		}
		if spec := findContainer(pod, c.Name); spec != nil {
			if msg, ok := terminationMessage(w.m.podDir(pod.UID), spec, c); ok {
				w.messages[c.ID] = msg
			}
		}
	}
	for id := range w.messages {
		if !seen[id] {
			delete(w.messages, id)
		}
	}
}

// activeDeadline returns how long the pod may still run under spec.activeDeadlineSeconds,
// counted from its startTime as kubelet counts it (<= 0: past it); ok is false without one.
func (w *worker) activeDeadline(pod *v1.Pod) (left time.Duration, ok bool) {
	if pod.Spec.ActiveDeadlineSeconds == nil {
		return 0, false
	}
	start := w.startTime
	if pod.Status.StartTime != nil {
		start = pod.Status.StartTime.Time
	}
	if pod.Status.Reason == ReasonDeadlineExceeded {
		return 0, true // reported before an agent restart: stays so
	}
	return start.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second).Sub(w.m.now()), true
}

// podFinished reports whether the pod's containers are done for good under its restart
// policy: Succeeded or Failed from what the runtime shows alone.
func podFinished(pod *v1.Pod, observed []runtime.Container) bool {
	if len(observed) == 0 {
		return false
	}
	st := computeStatus(statusInput{pod: pod, observed: observed})
	return podutil.IsTerminal(st.Phase)
}

// syncFinished handles a pod whose run is over (its containers are done under its restart
// policy, or it ran past its activeDeadlineSeconds): containers still running (sidecars, or
// every container past the deadline) are stopped, and what only a running pod needs goes,
// as with kubelet: its network (CNI DEL releases its address), its volumes and their token
// renewals, its probes; it no longer counts in admission. The exited containers stay, so
// its status (phase, exit codes, messages) is still reported, until the pod is deleted.
func (w *worker) syncFinished(ctx context.Context, log *slog.Logger, pod *v1.Pod, observed []runtime.Container) time.Duration {
	if w.phase == phaseRunning {
		w.moveTo(phaseFinishing)
	}
	if w.phase == phaseFinishing {
		why, grace := "pod finished", gracePeriod(pod)
		if podutil.IsTerminal(pod.Status.Phase) {
			why = "the pod's status says " + string(pod.Status.Phase)
		}
		if w.deadlineExceeded {
			why = MessageDeadlineExceeded
		}
		if w.evicted != nil {
			why, grace = w.evicted.message, w.evicted.grace
		}
		if w.m.prober != nil {
			w.m.prober.RemovePod(pod.UID)
		}
		if err := w.stopRunning(ctx, pod, observed, grace, why); err != nil {
			log.Warn("stop the containers of a finished pod", "err", err)
			return time.Second
		}
		if err := w.releaseResources(ctx, pod); err != nil {
			log.Warn("release the network and volumes of a finished pod", "err", err)
			return time.Second
		}
		w.moveTo(phaseFinished)
		w.m.retryDeferredResizes(pod.UID) // what it held is free for a deferred resize
		log.Info("pod finished; its network and volumes are released", "reason", why)
		var err error
		if observed, err = w.observe(ctx, log, pod); err != nil {
			log.Warn("observe pod containers", "err", err)
			w.syncErr = err
			return time.Second
		}
	}
	st := computeStatus(statusInput{
		pod: w.allocatedPod(pod), observed: observed, waiting: w.waiting, podIPs: w.reportedPodIPs(pod), hostIPs: w.m.hostIPs(),
		startTime: w.startTime, terminated: true, now: w.m.now(), messages: w.messages,
		deadlineExceeded: w.deadlineExceeded, evicted: w.evicted,
	})
	switch {
	case podutil.IsTerminal(pod.Status.Phase) && !podutil.IsTerminal(st.Phase):
		// Its containers are gone (removed, or lost with a reboot): nothing the runtime
		// shows can say more than the status its source has, and a phase never goes back
		// from Succeeded or Failed (the kubelet's status manager refuses it too).
		st = *pod.Status.DeepCopy()
	case st.Phase != pod.Status.Phase || st.Reason == "":
		// Stopped because another writer set its phase: the containers say how they ended.
		keepSourceTerminalPhase(pod, &st)
	}
	w.m.status.SetPodStatus(pod, st)
	return resyncPeriod
}

// keepSourceTerminalPhase sets st's phase, reason and message to the pod's when its source
// says it is Succeeded or Failed (another writer set it): a phase never goes back from there,
// and the kubelet keeps the API's terminal phase over what its containers show.
func keepSourceTerminalPhase(pod *v1.Pod, st *v1.PodStatus) {
	if podutil.IsTerminal(pod.Status.Phase) {
		st.Phase, st.Reason, st.Message = pod.Status.Phase, pod.Status.Reason, pod.Status.Message
	}
}

// finishedInItsSource reports whether the pod's source says it finished (its status phase
// Succeeded or Failed) and none of its containers runs here.
func finishedInItsSource(pod *v1.Pod, observed []runtime.Container) bool {
	return podutil.IsTerminal(pod.Status.Phase) && !slices.ContainsFunc(observed, isRunning)
}

// prepare sets up the pod's network and volumes before any container starts. ok is false
// while either is not ready: nothing is then started or killed and the containers stay
// ContainerCreating (or CreatePodSandboxError), as in kubelet. Volumes.Setup records
// FailedMount itself.
func (w *worker) prepare(ctx context.Context, log *slog.Logger, pod *v1.Pod) (podIPs, hostIPs []string, vols *volumes.PodVolumes, ok bool, next time.Duration) {
	next = resyncPeriod
	hostIPs = w.m.hostIPs()
	began := w.m.now()
	if w.m.cfg.Cgroups != nil {
		// The pod's cgroup before anything of it runs: the CRI sandbox's pause container is
		// its first process.
		if _, err := w.m.cfg.Cgroups.EnsurePod(pod); err != nil {
			log.Warn("make pod cgroup", "err", err)
			return nil, hostIPs, nil, false, 5 * time.Second
		}
	}
	if wait := w.networkFailed.heldFor(began); wait > 0 {
		// Backing off a network that failed: poked meanwhile (a status echo, a probe), the
		// worker does not try it again before its time.
		return nil, hostIPs, nil, false, wait
	}
	pn, err := w.m.net.Setup(ctx, pod)
	if !pod.Spec.HostNetwork {
		w.timePhase(metrics.PhaseNetwork, began)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, hostIPs, nil, false, 0
		}
		w.m.event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		for _, c := range allContainers(pod) {
			w.waiting[c.Name] = waitingInfo{ReasonCreatePodSandboxError, "failed to set up pod network: " + err.Error()}
		}
		if errors.Is(err, network.ErrNetworkNotReady) {
			// No CNI configuration yet (written by a DaemonSet, or late at first boot):
			// waiting for it, not failing, as the kubelet waits for its network plugin.
			// Tried every retryInitial, so that pods start soon after it comes.
			w.networkFailed = retryBackOff{}
		}
		return nil, hostIPs, nil, false, w.networkFailed.failed(w.m.now())
	}
	w.networkFailed = retryBackOff{}
	if !pod.Spec.HostNetwork {
		podIPs = pn.IPs
	}
	began = w.m.now()
	vols, err = w.m.cfg.Volumes.Setup(ctx, pod)
	w.timePhase(metrics.PhaseVolumes, began)
	if err != nil {
		log.Warn("set up pod volumes", "err", err)
		return podIPs, hostIPs, nil, false, 5 * time.Second
	}
	return podIPs, hostIPs, vols, true, next
}

// apply carries out the plan: kills (with preStop hooks), starts (after back-off), and
// removal of old attempts. It returns when the next sync is due at the latest.
func (w *worker) apply(ctx context.Context, log *slog.Logger, pod *v1.Pod, observed []runtime.Container, p plan, podIPs, hostIPs []string, vols *volumes.PodVolumes) time.Duration {
	next := resyncPeriod
	for _, k := range p.kill {
		if k.event != "" {
			w.m.event(pod, v1.EventTypeNormal, "Killing", "%s", k.event)
		} else {
			w.m.event(pod, v1.EventTypeNormal, "Killing", "Stopping container %s: %s", k.name, k.reason)
		}
		grace := gracePeriod(pod)
		if k.grace != nil {
			grace = *k.grace
		}
		var pid uint32
		for _, c := range observed {
			if c.ID == k.id {
				pid = c.Pid
			}
		}
		if err := w.stopWithPreStop(ctx, pod, k.name, k.id, pid, grace, nil); err != nil {
			log.Warn("stop container", "container", k.name, "err", err)
		}
	}
	prev := groupByName(observed)
	for _, s := range p.start {
		if ctx.Err() != nil {
			return 0
		}
		if s.attempt > 0 {
			if attempts := prev[s.container.Name]; len(attempts) > 0 {
				last := attempts[len(attempts)-1]
				w.m.backoff.next(backoffKey(pod, s.container.Name), last.StartedAt, last.FinishedAt)
			}
		}
		if wait := w.startHeldFor(s.container); wait > 0 {
			next = min(next, wait)
			continue
		}
		err := w.startContainer(ctx, pod, s, podIPs, hostIPs, vols)
		if err != nil && !errors.Is(err, errImagePullBackOff) && !errors.Is(err, runtime.ErrImagePull) {
			log.Warn("start container", "container", s.container.Name, "attempt", s.attempt, "err", err)
		}
		if again := w.noteStart(pod, s.container, err); again > 0 {
			next = min(next, again)
		}
	}
	for _, id := range p.remove {
		if err := w.m.rt.RemoveContainer(ctx, id); err != nil {
			log.Warn("remove old container attempt", "id", id, "err", err)
			continue
		}
		for _, c := range observed {
			if c.ID != id {
				continue
			}
			if c.LogPath != "" {
				if err := logs.RemoveContainerLogs(c.LogPath); err != nil {
					log.Warn("remove logs of old container attempt", "id", id, "err", err)
				}
			}
			if err := os.Remove(terminationLogPath(w.m.podDir(pod.UID), c.Name, c.Attempt)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.Warn("remove termination log of old container attempt", "id", id, "err", err)
			}
		}
	}
	return next
}

// updateProber hands the prober this observation of the pod, before the status is computed
// from its answers, and returns them for the running containers (nil maps without a prober).
func (w *worker) updateProber(pod *v1.Pod, observed []runtime.Container, podIPs, hostIPs []string) (ready, started map[string]bool) {
	pr := w.m.prober
	if pr == nil {
		return nil, nil
	}
	running := prober.RunningContainers(observed)
	pr.UpdatePod(pod, first(podAddresses(pod, podIPs, hostIPs)), running)
	ready, started = map[string]bool{}, map[string]bool{}
	for name := range running {
		ready[name] = pr.Ready(pod.UID, name)
		started[name] = pr.Started(pod.UID, name)
	}
	return ready, started
}

// startedFunc is the prober's word on which running containers have started (passed their
// startup probe), nil without a prober.
func (w *worker) startedFunc(pod *v1.Pod) startedFunc {
	pr := w.m.prober
	if pr == nil {
		return nil
	}
	return func(name string) bool { return pr.Started(pod.UID, name) }
}

// restartKills returns the running containers to stop for a requested restart (each then
// starts again by its restart policy), and clears the request.
func (w *worker) restartKills(observed []runtime.Container, already []killAction) []killAction {
	w.mu.Lock()
	reason := w.restart
	w.restart = ""
	w.mu.Unlock()
	if reason == "" {
		return nil
	}
	var out []killAction
	for _, c := range observed {
		if c.State == runtime.StateRunning && !slices.ContainsFunc(already, func(k killAction) bool { return k.id == c.ID }) {
			out = append(out, killAction{id: c.ID, name: c.Name, reason: reason})
		}
	}
	return out
}

// probeKills returns the running containers whose liveness or startup probe failed, killed
// as kubelet kills them: with the probe's terminationGracePeriodSeconds if it sets one, and
// kubelet's event. computePlan restarts them per restartPolicy once they have exited.
func (w *worker) probeKills(pod *v1.Pod, observed []runtime.Container, already []killAction) []killAction {
	pr := w.m.prober
	if pr == nil {
		return nil
	}
	var out []killAction
	for _, c := range observed {
		if c.State != runtime.StateRunning || slices.ContainsFunc(already, func(k killAction) bool { return k.id == c.ID }) {
			continue
		}
		u, ok := pr.Unhealthy(pod.UID, c.Name)
		if !ok || u.ContainerID != c.ID {
			continue
		}
		k := killAction{id: c.ID, name: c.Name, reason: u.Message, event: u.Message}
		if u.GracePeriodSeconds != nil && pod.DeletionGracePeriodSeconds == nil {
			g := time.Duration(*u.GracePeriodSeconds) * time.Second
			k.grace = &g
		}
		out = append(out, k)
	}
	return out
}

// startContainer pulls (per policy), creates and starts one container attempt, recording
// why it could not in the container's waiting reason.
func (w *worker) startContainer(ctx context.Context, pod *v1.Pod, s startAction, podIPs, hostIPs []string, vols *volumes.PodVolumes) error {
	c := s.container
	fail := func(reason string, err error) error {
		if ctx.Err() != nil {
			return err // cancelled by a deletion: nothing to tell
		}
		w.waiting[c.Name] = waitingInfo{reason: reason, message: err.Error()}
		w.m.event(pod, v1.EventTypeWarning, "Failed", "Error: %s: %v", reason, err)
		return err
	}
	if isEphemeral(pod, c.Name) {
		// Added after the pod was admitted: its fields are checked here, as admission checks
		// the others'.
		if fields := admission.Unsupported(&v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{*c}}}); len(fields) > 0 {
			return fail(ReasonCreateContainerConfig, fmt.Errorf("ephemeral container %q: holdfast does not implement %s", c.Name, strings.Join(fields, ", ")))
		}
	}
	began := w.m.now()
	err := w.ensureImage(ctx, pod, c)
	w.timePhase(metrics.PhaseImage, began)
	if errors.Is(err, runtime.ErrImageNeverPull) {
		return fail(ReasonErrImageNeverPull, err)
	} else if err != nil {
		return err
	}
	began = w.m.now()
	cfg, err := w.containerConfig(ctx, pod, c, s.attempt, podIPs, hostIPs, vols)
	if err != nil {
		return fail(ReasonCreateContainerConfig, err)
	}
	if s.pidNamespaceOf != 0 {
		cfg.PIDNamespaceOf, cfg.PIDNamespaceOfPid = s.pidNamespaceOfID, s.pidNamespaceOf
	}
	failpoint.Inject(failpoint.PodBeforeCreate)
	id, err := w.m.rt.CreateContainer(ctx, cfg)
	w.timePhase(metrics.PhaseCreate, began)
	var cfgErr *errConfig
	var rtCfgErr *runtime.ConfigError
	if errors.As(err, &cfgErr) {
		return fail(ReasonCreateContainerConfig, cfgErr)
	} else if errors.As(err, &rtCfgErr) {
		return fail(ReasonCreateContainerConfig, rtCfgErr)
	} else if err != nil {
		return fail(ReasonCreateContainerError, err)
	}
	w.m.event(pod, v1.EventTypeNormal, "Created", "Created container %s", c.Name)
	failpoint.Inject(failpoint.ContainerBeforeStart)
	began = w.m.now()
	err = w.m.rt.StartContainer(ctx, id)
	w.timePhase(metrics.PhaseStart, began)
	if err != nil {
		return fail(ReasonRunContainerError, err)
	}
	delete(w.waiting, c.Name)
	w.m.event(pod, v1.EventTypeNormal, "Started", "Started container %s", c.Name)
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		if err := w.m.runHook(ctx, pod, c, id, 0, c.Lifecycle.PostStart, postStartTimeout); err != nil {
			if ctx.Err() != nil {
				// Cancelled by a deletion: the termination that follows stops the container.
				return fmt.Errorf("postStart hook of %s: %w", c.Name, ctx.Err())
			}
			// As kubelet: the container is killed and restarted per its restart policy.
			w.m.event(pod, v1.EventTypeWarning, "FailedPostStartHook", "PostStartHook failed: %v", err)
			if serr := w.m.rt.StopContainer(ctx, id, gracePeriod(pod)); serr != nil {
				return serr
			}
			return fmt.Errorf("postStart hook of %s: %w", c.Name, err)
		}
	}
	return nil
}

// errImagePullBackOff: the container's image failed to pull recently; no pull is tried
// until its back-off has passed.
var errImagePullBackOff = errors.New("image pull backing off")

// ensureImage makes the container's image available as kubelet's image manager does: a pull
// that fails is reported as ErrImagePull and not tried again for a back-off (10s doubling to
// 5m per pod and image: a gateway on a metered uplink does not hammer its registry), during
// which the container waits in ImagePullBackOff. With policy Always and the registry out of
// reach, an image already present is used, with a Warning event saying so.
func (w *worker) ensureImage(ctx context.Context, pod *v1.Pod, c *v1.Container) error {
	key := string(pod.UID) + "/" + c.Image
	if wait, _ := w.m.pullBackoff.waiting(key); wait {
		msg := fmt.Sprintf("Back-off pulling image %q", c.Image)
		// Events once per back-off period, not at every sync: they cost uplink too.
		if w.waiting[c.Name].reason != ReasonImagePullBackOff {
			w.m.event(pod, v1.EventTypeNormal, "BackOff", "%s", msg)
			w.m.event(pod, v1.EventTypeWarning, "Failed", "Error: %s", ReasonImagePullBackOff)
		}
		w.waiting[c.Name] = waitingInfo{reason: ReasonImagePullBackOff, message: msg}
		return errImagePullBackOff
	}
	res, err := w.m.rt.EnsureImage(ctx, c.Image, c.ImagePullPolicy, w.pullCredentials(ctx, pod))
	switch {
	case errors.Is(err, runtime.ErrImageNeverPull):
		return err
	case err != nil && ctx.Err() != nil:
		// The sync was cancelled (the pod is being deleted): not the registry's failure.
		return err
	case err != nil:
		w.m.pullBackoff.failed(key)
		w.waiting[c.Name] = waitingInfo{reason: ReasonErrImagePull, message: err.Error()}
		w.m.event(pod, v1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", c.Image, err)
		w.m.event(pod, v1.EventTypeWarning, "Failed", "Error: %s", ReasonErrImagePull)
		return err
	}
	w.m.pullBackoff.reset(key)
	switch {
	case res.Stale != nil:
		w.m.event(pod, v1.EventTypeWarning, ReasonPullFailedUsingCachedImage,
			"Registry unreachable pulling image %q (imagePullPolicy Always): using the image already present on the node (%s): %v",
			c.Image, res.Digest, res.Stale)
	case res.Pulled:
		w.m.event(pod, v1.EventTypeNormal, "Pulled", "Successfully pulled image %q", c.Image)
	}
	return nil
}

// pullRetryIn is when to sync again after a failed or backed-off pull: soon after a failure,
// so that ImagePullBackOff shows as kubelet shows it, then when the back-off has passed.
func (w *worker) pullRetryIn(pod *v1.Pod, c *v1.Container) time.Duration {
	if w.waiting[c.Name].reason == ReasonErrImagePull {
		return time.Second
	}
	if wait, left := w.m.pullBackoff.waiting(string(pod.UID) + "/" + c.Image); wait {
		return max(left, 100*time.Millisecond)
	}
	return 100 * time.Millisecond
}

// pullCredentials returns the credentials a pull of pod's images tries: its imagePullSecrets
// (read with the node's identity, which the Node authorizer allows for pods bound to the node)
// in order, then the node's RegistryCredentialsFile. They are read only when a registry asks
// for authentication, so a pod whose image is present never needs its pull secret, offline
// or not.
func (w *worker) pullCredentials(ctx context.Context, pod *v1.Pod) runtime.Credentials {
	var (
		once sync.Once
		kr   credentials.Keyring
	)
	load := func() {
		var missing []string
		for _, ref := range pod.Spec.ImagePullSecrets {
			s, err := w.m.cfg.Volumes.Secret(ctx, pod, ref.Name)
			if err == nil {
				err = kr.AddSecret(s)
			}
			if err != nil {
				w.m.log.Warn("image pull secret", "pod", pod.Namespace+"/"+pod.Name, "secret", ref.Name, "err", err)
				missing = append(missing, ref.Name)
			}
		}
		if len(missing) > 0 {
			w.m.event(pod, v1.EventTypeWarning, "FailedToRetrieveImagePullSecret",
				"Unable to retrieve some image pull secrets (%s); attempting to pull the image may not succeed.", strings.Join(missing, ", "))
		}
		if f := w.m.cfg.RegistryCredentialsFile; f != "" {
			if err := kr.AddFile(f); err != nil {
				w.m.log.Warn("node registry credentials", "err", err)
			}
		}
	}
	return func(host string) (string, string, bool) {
		once.Do(load)
		return kr.Lookup(host)
	}
}

func (w *worker) containerConfig(ctx context.Context, pod *v1.Pod, c *v1.Container, attempt int, podIPs, hostIPs []string, vols *volumes.PodVolumes) (runtime.ContainerConfig, error) {
	var services map[string]string
	if w.m.cfg.Services != nil {
		var err error
		if services, err = w.m.cfg.Services.EnvVars(pod, manifest.IsStatic(pod)); err != nil {
			return runtime.ContainerConfig{}, &errConfig{msg: err.Error(), cause: errWaitingForServices}
		}
	}
	env, vars, err := resolveEnv(ctx, envInput{
		pod: pod, container: c, podIPs: podIPs, hostIPs: hostIPs, source: w.m.cfg.Volumes,
		warn:     func(reason, message string) { w.m.event(pod, v1.EventTypeWarning, reason, "%s", message) },
		services: services,
	})
	if err != nil {
		return runtime.ContainerConfig{}, err
	}
	if len(c.VolumeDevices) > 0 {
		return runtime.ContainerConfig{}, &errConfig{msg: fmt.Sprintf("container %q: volumeDevices are not supported yet", c.Name)}
	}
	volumeMounts, err := vols.Mounts(c, vars)
	if err != nil {
		return runtime.ContainerConfig{}, &errConfig{msg: err.Error()}
	}
	shortName, domain, err := network.PodHostnameAndDomain(pod, w.m.cfg.DNS.ClusterDomain)
	if err != nil {
		return runtime.ContainerConfig{}, err
	}
	hostname, err := network.KernelHostname(pod, shortName, domain)
	if err != nil {
		return runtime.ContainerConfig{}, err
	}
	cfg := runtime.ContainerConfig{
		PodUID:       string(pod.UID),
		PodName:      pod.Name,
		PodNamespace: pod.Namespace,
		Name:         c.Name,
		Attempt:      attempt,
		SpecHash:     containerHash(c),
		Static:       manifest.IsStatic(pod),
		Image:        c.Image,
		Command:      expansion.ExpandAll(c.Command, vars),
		Args:         expansion.ExpandAll(c.Args, vars),
		Env:          env,
		WorkingDir:   c.WorkingDir,
		Hostname:     hostname,
		LogPath:      filepath.Join(w.m.cfg.PodLogDir, podLogDirName(pod), c.Name, fmt.Sprintf("%d.log", attempt)),
		Mounts:       volumeMounts,
		Stdin:        c.Stdin,
		StdinOnce:    c.StdinOnce,
		TTY:          c.TTY,
		Resources:    containerResources(pod, c, w.m.cfg.MemoryCapacity, w.m.cfg.NoSwap),
		Security:     containerSecurity(pod, c),

		MemoryRequest: c.Resources.Requests.Memory().Value(),
		Pod:           pod,
		CgroupParent:  w.cgroupParent(pod),

		TerminationMessagePath: c.TerminationMessagePath,
	}
	// The termination log, unless a volume is mounted at its path.
	if !slices.ContainsFunc(volumeMounts, func(v specs.Mount) bool { return v.Destination == c.TerminationMessagePath }) {
		m, err := terminationLogMount(w.m.podDir(pod.UID), c, attempt)
		if err != nil {
			return cfg, err
		}
		if m != nil {
			cfg.Mounts = append(cfg.Mounts, *m)
		}
	}
	if !pod.Spec.HostNetwork {
		pn := w.m.net.Get(string(pod.UID))
		if pn == nil {
			return cfg, errors.New("pod network vanished before the container was created")
		}
		cfg.NetNSPath = pn.NetNSPath
	}
	mounts, err := w.podEtcFiles(pod, podIPs, shortName, domain)
	if err != nil {
		return cfg, err
	}
	// After the volumes, so that /etc/hosts lands on top of a volume mounted at /etc;
	// skipped where the pod mounts its own, as kubelet does.
	for _, m := range mounts {
		if !slices.ContainsFunc(volumeMounts, func(v specs.Mount) bool { return v.Destination == m.Destination }) {
			cfg.Mounts = append(cfg.Mounts, m)
		}
	}
	return cfg, nil
}

// podEtcFiles writes the pod's /etc/hosts and /etc/resolv.conf (shared by its containers)
// and returns the mounts for them. resolv.conf is composed once per pod, as a sandbox's is
// (its events are recorded then); /etc/hosts at every container start, as the kubelet does. A
// host-network pod gets the host's /etc/hosts with its hostAliases, as the kubelet writes it.
func (w *worker) podEtcFiles(pod *v1.Pod, podIPs []string, hostname, domain string) ([]specs.Mount, error) {
	dir := w.m.podDir(pod.UID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create pod dir: %w", err)
	}
	hosts := network.HostsFile(podIPs, hostname, domain, pod.Spec.HostAliases)
	if pod.Spec.HostNetwork {
		node, err := os.ReadFile(w.m.cfg.hostsFile())
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("read the host's hosts file: %w", err)
		}
		hosts = network.NodeHostsFile(node, pod.Spec.HostAliases)
	}
	hostsPath := filepath.Join(dir, "etc-hosts")
	if err := os.WriteFile(hostsPath, hosts, 0o644); err != nil {
		return nil, fmt.Errorf("write pod hosts file: %w", err)
	}
	resolvPath := filepath.Join(dir, "resolv.conf")
	if _, err := os.Stat(resolvPath); os.IsNotExist(err) {
		if err := w.writeResolvConf(pod, resolvPath); err != nil {
			return nil, err
		}
	}
	return []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: hostsPath, Options: []string{"rbind", "rw"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: resolvPath, Options: []string{"rbind", "ro"}},
	}, nil
}

// writeResolvConf composes the pod's resolv.conf from its dnsPolicy and dnsConfig and records
// the kubelet's events about it.
func (w *worker) writeResolvConf(pod *v1.Pod, path string) error {
	host, err := network.ReadHostResolvConf(w.m.cfg.hostResolvConf(), w.m.cfg.systemdResolvConf())
	if err != nil {
		return err
	}
	rc, events := network.PodDNS(pod, w.m.cfg.DNS, host)
	for _, e := range events {
		if e.OnNode {
			w.m.nodeEvent(v1.EventTypeWarning, e.Reason, e.Message)
		} else {
			w.m.event(pod, v1.EventTypeWarning, e.Reason, "%s", e.Message)
		}
	}
	if err := fsutil.WriteFileAtomic(path, rc.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write pod resolv.conf: %w", err)
	}
	return nil
}

// terminate stops every container of the pod (all at once, each with the grace period),
// removes them and the pod's network, and reports the final status. It is idempotent: an
// interrupted termination resumes on the next sync.
func (w *worker) terminate(ctx context.Context, pod *v1.Pod, observed []runtime.Container, reason string) error {
	log := w.m.log.With("pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
	if err := w.stopDraining(ctx, pod, observed, reason); err != nil {
		return err
	}
	// Through observe: the exits recorded and the messages read, as on every listing; the
	// final status reports the termination messages the statuses before it did.
	final, err := w.observe(ctx, log, pod)
	if err != nil {
		return err
	}
	orphan := w.isOrphan()
	if !orphan {
		st := computeStatus(statusInput{
			pod: w.allocatedPod(pod), observed: final, waiting: w.waiting, hostIPs: w.m.hostIPs(),
			startTime: w.startTime, terminated: true, now: w.m.now(), messages: w.messages,
		})
		keepSourceTerminalPhase(pod, &st)
		w.m.status.SetPodStatus(pod, st)
	}
	for _, c := range final {
		if err := w.m.rt.RemoveContainer(ctx, c.ID); err != nil {
			return err
		}
	}
	// Unmounts tmpfs and subPath binds: RemoveAll below must never run through a mount.
	if err := w.releaseResources(ctx, pod); err != nil {
		return err
	}
	if w.m.cfg.Cgroups != nil {
		// After the runtime removed its containers (and the CRI sandbox with the network):
		// the pod's cgroup is empty. One still in use is left to podcgroups' Cleanup.
		if err := w.m.cfg.Cgroups.RemovePod(pod.UID); err != nil {
			log.Warn("remove pod cgroup", "err", err)
		}
	}
	if err := os.RemoveAll(w.m.podDir(pod.UID)); err != nil {
		return fmt.Errorf("remove pod dir: %w", err)
	}
	// Its containers are gone, so nothing can ask for their logs any more: they go now rather
	// than at the next garbage collection, which would dirty the flash in the middle of steady
	// running (and remains the safety net for a termination cut short by an agent crash).
	if w.m.cfg.PodLogDir != "" {
		if err := os.RemoveAll(filepath.Join(w.m.cfg.PodLogDir, podLogDirName(pod))); err != nil {
			return fmt.Errorf("remove pod logs: %w", err)
		}
	}
	w.m.backoff.forget(string(pod.UID))
	w.m.pullBackoff.forget(string(pod.UID))
	log.Info("pod stopped", "reason", reason, "containers", len(final))
	if !orphan {
		w.m.status.PodTerminated(pod)
	}
	return nil
}

// stopRunning stops every running container of the pod, each with the grace period (the
// pod's, or an eviction's) and its preStop hook: all at once, the sidecars last, in kubelet's
// terminationOrder.
func (w *worker) stopRunning(ctx context.Context, pod *v1.Pod, observed []runtime.Container, grace time.Duration, reason string) error {
	running := map[string]bool{}
	for _, c := range observed {
		if c.State == runtime.StateRunning {
			running[c.Name] = true
		}
	}
	order := newTerminationOrder(pod, running)
	var wg sync.WaitGroup
	errs := make([]error, len(observed))
	for i, c := range observed {
		if c.State != runtime.StateRunning {
			continue
		}
		w.m.event(pod, v1.EventTypeNormal, "Killing", "Stopping container %s: %s", c.Name, reason)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.stopWithPreStop(ctx, pod, c.Name, c.ID, c.Pid, grace, order)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stopDraining stops the deleted pod's running containers (stopRunning, with its grace
// period) as the kubelet's SyncTerminatingPod does: liveness and startup probes end first,
// readiness probes go on while the containers shut down, and the pod's status is reported
// again each time the worker is signalled meanwhile (a readiness result changed, a container
// exited). A pod whose readiness fails once it is asked to stop (its handler draining
// connections) is then reported unready while it drains, and Services stop sending it
// traffic; reported only once its last container was gone, it stayed Ready for its whole
// grace period. Once the containers are stopped, the pod is no longer probed.
func (w *worker) stopDraining(ctx context.Context, pod *v1.Pod, observed []runtime.Container, reason string) error {
	pr := w.m.prober
	if pr == nil || !slices.ContainsFunc(observed, isRunning) {
		// Nothing to drain (a pod rejected, finished, or not started yet): no status to
		// report meanwhile, which would say Pending over the one it has.
		err := w.stopRunning(ctx, pod, observed, gracePeriod(pod), reason)
		if pr != nil && err == nil {
			pr.RemovePod(pod.UID)
		}
		return err
	}
	pr.StopLivenessAndStartup(pod.UID)
	w.reportDraining(pod, observed)
	done := make(chan error, 1)
	go func() { done <- w.stopRunning(ctx, pod, observed, gracePeriod(pod), reason) }()
	for {
		select {
		case err := <-done:
			if err == nil {
				pr.RemovePod(pod.UID)
			}
			return err
		case <-w.signal:
			// Signals that meant something else (a shorter grace period, the pod gone from
			// its source) are seen by the sync that follows the termination.
			if now, err := w.m.rt.ListPod(ctx, string(pod.UID)); err == nil && slices.ContainsFunc(now, isRunning) {
				w.reportDraining(pod, now)
			}
		}
	}
}

func isRunning(c runtime.Container) bool { return c.State == runtime.StateRunning }

// reportDraining reports the status of a pod whose containers are being stopped: what runs,
// ready as its readiness probes say. An orphan (no source claims it) has no status to report.
func (w *worker) reportDraining(pod *v1.Pod, observed []runtime.Container) {
	if w.isOrphan() {
		return
	}
	podIPs, hostIPs := w.reportedPodIPs(pod), w.m.hostIPs()
	ready, started := w.updateProber(pod, observed, podIPs, hostIPs)
	st := computeStatus(statusInput{
		pod: w.allocatedPod(pod), observed: observed, waiting: w.waiting, podIPs: podIPs, hostIPs: hostIPs,
		startTime: w.startTime, now: w.m.now(), ready: ready, started: started, messages: w.messages,
		deadlineExceeded: w.deadlineExceeded, evicted: w.evicted,
	})
	keepSourceTerminalPhase(pod, &st) // a pod set Failed by another writer, then deleted
	w.m.status.SetPodStatus(pod, st)
}

// reportedPodIPs are the pod's addresses as this run of the agent set them up, else as its
// status reported them before (a pod adopted at an agent restart).
func (w *worker) reportedPodIPs(pod *v1.Pod) []string {
	if w.lastPodIPs != nil {
		return w.lastPodIPs
	}
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}

// cgroupParent is the pod's cgroup its containers are made in; "" without pod cgroups.
func (w *worker) cgroupParent(pod *v1.Pod) string {
	if w.m.cfg.Cgroups == nil {
		return ""
	}
	return w.m.cfg.Cgroups.PodDir(pod)
}

// releaseResources tears down what only running containers need: the pod's network (CNI DEL,
// then its namespace) and its volumes (unmounted, with their refreshes and token renewals).
// It is idempotent.
func (w *worker) releaseResources(ctx context.Context, pod *v1.Pod) error {
	if err := w.m.net.Teardown(ctx, string(pod.UID), pod.Namespace, pod.Name); err != nil {
		return err
	}
	return w.m.cfg.Volumes.Teardown(ctx, pod)
}

// allContainers lists the init containers, the app containers, then the ephemeral
// containers of a pod.
func allContainers(pod *v1.Pod) []*v1.Container {
	out := make([]*v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers)+len(pod.Spec.EphemeralContainers))
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return append(out, ephemeralContainers(pod)...)
}

func gracePeriod(pod *v1.Pod) time.Duration {
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return v1.DefaultTerminationGracePeriodSeconds * time.Second
}

// podLogDirName is kubelet's NAMESPACE_NAME_UID, fit for a file name.
func podLogDirName(pod *v1.Pod) string {
	return logs.PodDirName(pod.Namespace, pod.Name, string(pod.UID))
}
