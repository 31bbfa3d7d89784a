package pods

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// StatusSink receives the statuses the workers compute. It owns what is reported.
type StatusSink interface {
	// SetPodStatus records the latest status of a pod; the sink decides when to write it.
	SetPodStatus(pod *v1.Pod, status v1.PodStatus)
	// PodTerminated says the pod's containers and network are gone: an API pod with a
	// deletionTimestamp may now be deleted for good.
	PodTerminated(pod *v1.Pod)
}

// Admitter decides whether the node takes a pod, given the pods it already runs.
type Admitter interface {
	Admit(ctx context.Context, pod *v1.Pod, admitted []*v1.Pod) admission.Result
}

// ServiceSource gives a pod's service link environment variables; *services.Cache implements
// it. Its only error is that the services were never read yet: the container waits with
// CreateContainerConfigError, and the source calls Manager.ResyncAll once they are read, which
// starts it at once.
type ServiceSource interface {
	EnvVars(pod *v1.Pod, static bool) (map[string]string, error)
}

// Config tunes the manager.
type Config struct {
	StateDir     string
	PodLogDir    string
	RelistPeriod time.Duration
	// RelistThreshold is how long the runtime may go without a successful relist before
	// RelistHealthy fails (kubelet's PLEG relist threshold). Defaults to 3m.
	RelistThreshold time.Duration
	BackOffBase     time.Duration
	BackOffMax      time.Duration
	// ImagePullBackOffBase and ImagePullBackOffMax bound the back-off between failed pulls
	// of one image by one pod (kubelet's 10s and 300s when zero).
	ImagePullBackOffBase, ImagePullBackOffMax time.Duration
	// RegistryCredentialsFile is the node's docker config.json, tried after the pod's
	// imagePullSecrets; empty: none.
	RegistryCredentialsFile string
	// HostIPs returns the node's addresses, reported as hostIP(s) and used by host-network pods.
	HostIPs func() []string
	// MemoryCapacity is the node's memory in bytes, for the OOM score of burstable pods.
	MemoryCapacity int64
	// NoSwap sets memory.swap.max to 0 for every container (kubelet's NoSwap on cgroup v2);
	// only where the host has the swap controller.
	NoSwap bool
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Cgroups makes each pod's cgroup before its first container and removes it after its
	// last (agent/podcgroups); nil: no pod cgroups (cgroupsPerQOS off), each container where
	// the runtime puts it by default.
	Cgroups PodCgroups
	// Volumes prepares and tears down pod volumes, and is the EnvSource of env. Required.
	Volumes *volumes.Manager
	// NodeName names the Node that node-level events (MissingClusterDNS) are recorded on.
	NodeName string
	// DNS is the node's DNS configuration pods' resolv.conf is composed from.
	DNS network.DNSSettings
	// Services gives containers their service link variables; nil: none (standalone).
	Services ServiceSource
	// Metrics records pod syncs, pod startup and relists; nil: none.
	Metrics *metrics.Metrics
	// Usage measures running containers: a memory limit lowered in place is refused below
	// what the container uses (the kubelet's check). nil: not checked.
	Usage ContainerUsage
	// HostResolvConf, SystemdResolvConf and HostsFile are the host's files; they default to
	// /etc/resolv.conf, /run/systemd/resolve/resolv.conf and /etc/hosts (tests change them).
	HostResolvConf, SystemdResolvConf, HostsFile string
}

func (c Config) hostResolvConf() string { return cmp.Or(c.HostResolvConf, network.HostResolvConf) }
func (c Config) systemdResolvConf() string {
	return cmp.Or(c.SystemdResolvConf, network.SystemdResolvConf)
}
func (c Config) hostsFile() string { return cmp.Or(c.HostsFile, "/etc/hosts") }

// PodCgroups is the pod cgroups' part the workers use (*podcgroups.Manager).
type PodCgroups interface {
	// PodDir is the pod's cgroup: its containers' parent.
	PodDir(pod *v1.Pod) string
	// EnsurePod makes the pod's cgroup with its limits if it is missing.
	EnsurePod(pod *v1.Pod) (string, error)
	// RemovePod removes it once its containers are gone; one still in use stays, with an error.
	RemovePod(uid types.UID) error
	// UpdatePod sets the pod's cgroup limits (and its QoS level's) from pod as allocated: a
	// resize. The workers call it after the containers' updates, CoverPod before them, so
	// that it always holds them whichever way each resource moves.
	UpdatePod(pod *v1.Pod) error
	// PodHolds reports whether the pod's cgroup, read back as got (ReadPod), holds what pod,
	// as allocated, gives it: a resize is applied at the pod level.
	PodHolds(pod *v1.Pod, got cgroups.Settings) bool
	// ReadPod reads back what the pod's cgroup holds (its status reports it).
	ReadPod(pod *v1.Pod) (cgroups.Settings, error)
	// CoverPod sets the pod's cgroup to hold its containers as they run and as pod, allocated,
	// will have them: before they are resized (then UpdatePod).
	CoverPod(pod *v1.Pod) error
	// PodMemory is the pod cgroup's memory limit as pod, allocated, sets it and as it holds
	// it now (0: none), and the memory charged to it: a resize must not lower the limit below
	// what the pod uses.
	PodMemory(pod *v1.Pod) (desired, current, used int64, err error)
}

// Manager dispatches desired pods to their workers and watches the runtime for changes.
type Manager struct {
	cfg      Config
	rt       runtime.Runtime
	net      runtime.Network
	status   StatusSink
	recorder record.EventRecorder
	log      *slog.Logger
	admitter Admitter // nil: admit everything
	// resizeAdmitter judges resizes; nil: every resize fits.
	resizeAdmitter ResizeAdmitter
	store          Records    // nil: decisions are not remembered across restarts
	admitMu        sync.Mutex // serializes admission: each decision sees the ones before it
	backoff        *backoff
	relistCh       chan struct{}   // buffered(1): relistDue moved earlier
	prober         *prober.Manager // nil: no probes; a running container is started and ready
	hooks          prober.Handler  // runs lifecycle hooks; nil: hooks fail with a clear error

	pullBackoff *backoff // failed pulls, keyed by pod UID + "/" + image

	mu           sync.Mutex // protects workers, ctx, sourcesReady, staticReady, lastRelist, relistDue
	workers      map[types.UID]*worker
	ctx          context.Context // set while Run runs; workers start under it
	wg           sync.WaitGroup  // the worker goroutines
	sourcesReady func() bool
	// staticReady reports whether the file source read its directory: it alone says which
	// static pods the node runs (see staticOrphan).
	staticReady func() bool
	lastRelist  time.Time
	relistDue   time.Time // when the next relist is due (wall clock, not cfg.Now); zero: now
	// terminated remembers pods torn down recently, so that a late update from a source (the
	// API's last status write racing the deletion) does not start them again.
	terminated map[types.UID]time.Time
}

// NewManager builds a manager; nothing runs until Run.
func NewManager(cfg Config, rt runtime.Runtime, net runtime.Network, status StatusSink, recorder record.EventRecorder, log *slog.Logger) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HostIPs == nil {
		cfg.HostIPs = func() []string { return nil }
	}
	if cfg.ImagePullBackOffBase <= 0 {
		cfg.ImagePullBackOffBase = 10 * time.Second
	}
	if cfg.ImagePullBackOffMax <= 0 {
		cfg.ImagePullBackOffMax = 300 * time.Second
	}
	if cfg.RelistThreshold <= 0 {
		cfg.RelistThreshold = DefaultRelistThreshold
	}
	return &Manager{
		cfg: cfg, rt: rt, net: net, status: status, recorder: recorder, log: log,
		backoff:      newBackoff(cfg.BackOffBase, cfg.BackOffMax, cfg.Now),
		pullBackoff:  newBackoff(cfg.ImagePullBackOffBase, cfg.ImagePullBackOffMax, cfg.Now),
		relistCh:     make(chan struct{}, 1),
		workers:      map[types.UID]*worker{},
		terminated:   map[types.UID]time.Time{},
		sourcesReady: func() bool { return false },
		staticReady:  func() bool { return false },
	}
}

func (m *Manager) now() time.Time    { return m.cfg.Now() }
func (m *Manager) hostIPs() []string { return m.cfg.HostIPs() }
func (m *Manager) podDir(uid types.UID) string {
	return filepath.Join(m.cfg.StateDir, "pods", string(uid))
}

// nodeEvent records an event on the Node.
func (m *Manager) nodeEvent(eventType, reason, message string) {
	if m.recorder != nil && m.cfg.NodeName != "" {
		ref := &v1.ObjectReference{Kind: "Node", Name: m.cfg.NodeName, UID: types.UID(m.cfg.NodeName)}
		m.recorder.Event(ref, eventType, reason, message)
	}
}

func (m *Manager) event(pod *v1.Pod, eventType, reason, format string, args ...any) {
	if m.recorder != nil {
		m.recorder.Eventf(pod, eventType, reason, format, args...)
	}
}

// Records is what the manager uses of the state store (offline.Store): each pod's record, its
// admission decision, which stands for the pod's life, across restarts, and the resources
// allocated to its containers (resize.go).
type Records interface {
	GetPod(uid types.UID) (offline.PodRecord, error)
	PutPod(source offline.Source, pod *v1.Pod) error
	SetAdmission(uid types.UID, a offline.Admission) error
	DeletePod(uid types.UID) error
	SetAllocation(uid types.UID, a offline.Allocation) error
	GetAllocation(uid types.UID) (offline.Allocation, error)
}

// SetAdmission installs the admission chain and the store that remembers its decisions, so
// that a pod is judged once in its life, never again after an agent restart.
func (m *Manager) SetAdmission(a Admitter, store Records) {
	m.admitter, m.store = a, store
}

// SetResizeAdmission installs what judges resizes against the node's allocatable, before Run.
func (m *Manager) SetResizeAdmission(r ResizeAdmitter) { m.resizeAdmitter = r }

// admittedPods returns the pods admitted and not finished, except the one being judged, each
// with the resources allocated to it (not its spec's, which a pending resize changed): as
// kubelet's admission, it leaves out pods that Succeeded or Failed.
func (m *Manager) admittedPods(except types.UID) []*v1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*v1.Pod
	for uid, w := range m.workers {
		w.mu.Lock()
		if uid != except && w.decision != nil && w.decision.Admitted && w.removal == nil && !w.terminalLocked() {
			p, _ := applyAllocation(w.pod, w.allocated)
			out = append(out, p)
		}
		w.mu.Unlock()
	}
	return out
}

// undecided reports whether a pod other than except has no admission decision yet (and is not
// going): its resources are unknown until it has one.
func (m *Manager) undecided(except types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, w := range m.workers {
		w.mu.Lock()
		pending := uid != except && w.decision == nil && w.removal == nil && !w.terminalLocked()
		w.mu.Unlock()
		if pending {
			return true
		}
	}
	return false
}

// ActivePods are the admitted pods that run, with their allocated resources: not finished,
// not being deleted and not being evicted. The eviction manager chooses among them. undecided counts the pods whose
// admission is not decided yet (just restored after an agent restart, or just arrived): they
// may run already, and ranking without them could evict the wrong pod.
func (m *Manager) ActivePods() (active []*v1.Pod, undecided int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.workers {
		w.mu.Lock()
		switch {
		case w.removal != nil || w.terminalLocked():
		case w.decision == nil:
			undecided++
		case w.decision.Admitted && w.eviction == nil && w.pod.DeletionTimestamp == nil:
			// With what is allocated to them, as the kubelet's getAllocatedPods: a resize
			// pending is not what a pod holds, nor what eviction ranks it by.
			p, _ := applyAllocation(w.pod, w.allocated)
			active = append(active, p)
		}
		w.mu.Unlock()
	}
	return active, undecided
}

// Evict kills the pod for node pressure, as kubelet's eviction manager does: its containers
// are stopped with the grace period, and it ends Failed with reason Evicted and the message,
// its network and volumes released. The pod stays until its source removes it.
func (m *Manager) Evict(pod *v1.Pod, grace time.Duration, message string) error {
	w := m.worker(pod.UID)
	if w == nil {
		return fmt.Errorf("pod %s/%s (%s) is not on this node", pod.Namespace, pod.Name, pod.UID)
	}
	w.mu.Lock()
	if w.eviction == nil {
		w.eviction = &evictionOrder{grace: grace, message: message}
	}
	// Whatever the sync in progress waits for (a pull, a postStart hook), the eviction comes
	// first.
	w.cancelRunLocked()
	w.mu.Unlock()
	w.poke()
	return nil
}

// CleanedUp says the pod's containers are stopped and its network and volumes released
// (the pod finished, or is gone): what it held is free again. The eviction manager waits for
// it before judging the node's pressure again, as kubelet's waits for an evicted pod's cleanup.
func (m *Manager) CleanedUp(uid types.UID) bool {
	w := m.worker(uid)
	if w == nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cleanedLocked()
}

// SetProber installs the probe runner, before Run. The workers report each observation of
// their pod to it and read Ready, Started and Unhealthy from it. hooks runs the lifecycle
// hooks (postStart, preStop) with the same handlers.
func (m *Manager) SetProber(p *prober.Manager, hooks prober.Handler) { m.prober, m.hooks = p, hooks }

// Resync asks the pod's worker for a sync now: a probe result changed.
func (m *Manager) Resync(uid types.UID) {
	if w := m.worker(uid); w != nil {
		w.poke()
	}
}

// workerList is the workers of the moment, to go through without holding the manager's lock
// (a worker's own lock is taken inside).
func (m *Manager) workerList() []*worker {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.workers))
}

// ResyncAll asks every worker for a sync now: something all pods may wait on (the cluster's
// services) became available.
func (m *Manager) ResyncAll() {
	for _, w := range m.workerList() {
		w.poke()
	}
}

// SetSourcesReady installs the check that says every source has delivered its complete set
// of pods. Until it holds, containers of unknown pods are left alone.
func (m *Manager) SetSourcesReady(ready func() bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sourcesReady = ready
}

// SetStaticSourceReady installs the file source's readiness: once it read its directory, the
// containers of a static pod it does not deliver (a manifest removed, or edited, while the
// agent was down) are torn down without waiting for the apiserver's list, which on an offline
// gateway may be weeks away.
func (m *Manager) SetStaticSourceReady(ready func() bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staticReady = ready
}

// Update hands the manager the desired state of a pod (new or changed).
func (m *Manager) Update(pod *v1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.workers[pod.UID]
	if _, gone := m.terminated[pod.UID]; gone && !ok && pod.DeletionTimestamp != nil {
		return
	}
	if !ok {
		w = newWorker(m, pod)
		m.workers[pod.UID] = w
		m.startWorkerLocked(w)
	} else {
		if !w.setPod(pod) {
			return
		}
	}
	w.poke()
}

// worker returns the pod's worker, nil when the pod is unknown.
func (m *Manager) worker(uid types.UID) *worker {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.workers[uid]
}

// Admission returns the pod's admission decision (node checks and admission policies), false
// while the pod is unknown or not decided yet.
func (m *Manager) Admission(uid types.UID) (admission.Result, bool) {
	w := m.worker(uid)
	if w == nil {
		return admission.Result{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.decision == nil {
		return admission.Result{}, false
	}
	return *w.decision, true
}

// Restart stops the pod's running containers, with their preStop hooks and grace period, so
// that each starts again by its restart policy (a container of a Never pod does not): what
// `holdfast restart` asks through the local API, offline too. The restarts show in the pod's
// status as any other.
func (m *Manager) Restart(uid types.UID, reason string) error {
	w := m.worker(uid)
	if w == nil {
		return fmt.Errorf("pod %s does not run here", uid)
	}
	w.mu.Lock()
	w.restart = reason
	w.mu.Unlock()
	w.poke()
	return nil
}

// Remove is an authoritative removal: the pod's containers are stopped and removed. Only the
// source that owns the pod calls it, and only when it knows the pod is gone.
func (m *Manager) Remove(uid types.UID, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.workers[uid]
	if !ok {
		return
	}
	w.mu.Lock()
	w.removal = &removalOrder{reason: reason, orphan: w.removal != nil && w.removal.orphan}
	w.readded = nil
	w.cancelRunLocked()
	w.mu.Unlock()
	w.poke()
}

// RunsStaticPod reports whether a static pod of that namespace and name has a worker, running
// or terminating: its mirror pod is not an orphan. A terminating one's mirror is the status
// side's to delete once the pod is down (as the kubelet skips the mirrors of terminating
// pods); deleted before, it would be made again while the pod still reports, in a loop.
func (m *Manager) RunsStaticPod(namespace, name string) bool {
	for _, w := range m.workerList() {
		pod := w.latestPod()
		// An orphan's worker (a previous version found running at start, its manifest gone)
		// reports nothing: no status side will delete the mirror when it is down, so the
		// mirror is the sweep's to delete at once.
		if manifest.IsStatic(pod) && pod.Namespace == namespace && pod.Name == name && !w.isOrphan() {
			return true
		}
	}
	return false
}

// Known reports whether a pod UID is handled by a worker (running or terminating).
func (m *Manager) Known(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.workers[uid]
	return ok
}

// SourcesReady reports whether every source has delivered its complete set of pods: until
// then a pod the manager does not know may still exist.
func (m *Manager) SourcesReady() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sourcesReady()
}

// Images returns the images of the containers (init containers included) of every pod a
// worker handles, so that image collection keeps them.
func (m *Manager) Images() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, w := range m.workers {
		pod := w.latestPod()
		for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for _, c := range cs {
				out = append(out, c.Image)
			}
		}
	}
	return out
}

func (m *Manager) startWorkerLocked(w *worker) {
	if m.ctx == nil {
		return // Run starts it
	}
	if m.ctx.Err() != nil {
		// Run is returning: a worker started now would race its Wait (a source delivering a
		// pod while the agent stops). The next start delivers the pod again.
		return
	}
	ctx := m.ctx
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		w.run(ctx)
		m.mu.Lock()
		defer m.mu.Unlock()
		uid := w.podUID()
		if w.currentPhase() != phaseTerminated || m.workers[uid] != w {
			return
		}
		delete(m.workers, uid)
		m.terminated[uid] = m.now()
		for _, other := range m.workers {
			if other.hasDeferredResize.Load() {
				other.poke() // what the pod held is free for a deferred resize
			}
		}
		w.mu.Lock()
		again := w.readded
		ended := w.pod
		w.mu.Unlock()
		if manifest.IsStatic(ended) {
			// The next version of this static pod waits for this one to stop (see
			// previousStaticVersion): it may start now.
			for _, other := range m.workers {
				if p := other.latestPod(); manifest.IsStatic(p) && p.Namespace == ended.Namespace && p.Name == ended.Name {
					other.poke()
				}
			}
		}
		if again != nil {
			// Its source delivered it again while it terminated: it starts afresh.
			m.log.Info("pod delivered again by its source while terminating; starting it again", "pod", again.Namespace+"/"+again.Name, "uid", uid)
			nw := newWorker(m, again)
			m.workers[uid] = nw
			m.startWorkerLocked(nw)
			nw.poke()
		}
	}()
}

func (w *worker) podUID() types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod.UID
}

// Run starts the workers, follows containerd's task events and relists the runtime until
// ctx ends, then waits for every worker to return. Containers keep running.
//
// Task events are what keeps the workers up to date: an exit reaches the pod's worker within
// a fraction of a second, with no call to any shim. The relist (every shim asked for its
// task's state) is the safety net: every RelistPeriod, at once when the event subscription
// is back after a break, every second while it fails, and as soon as the sources are ready
// (orphans can only be told from pods then).
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	for _, w := range m.workers {
		m.startWorkerLocked(w)
	}
	m.mu.Unlock()
	defer func() {
		// No worker is started after this (startWorkerLocked checks the context under mu):
		// the Wait below sees every one that was.
		m.mu.Lock()
		m.mu.Unlock() // empty: it orders every start that saw the context live before the Wait
		m.wg.Wait()
	}()

	var eventsDone sync.WaitGroup
	eventsDone.Add(1)
	go func() {
		defer eventsDone.Done()
		m.followEvents(ctx)
	}()
	defer eventsDone.Wait()

	m.relistLoop(ctx)
	return nil
}

// PodUIDs returns the UID of every pod a worker handles, for the local /pods endpoint.
func (m *Manager) PodUIDs() []types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]types.UID, 0, len(m.workers))
	for uid := range m.workers {
		out = append(out, uid)
	}
	return out
}

// admit decides once whether the node takes the pod: a decision recorded by an earlier run
// stands; a pod whose containers already exist was admitted before (its record may have
// been lost with a corrupt database) and is never judged again; otherwise the admission
// chain decides and the decision is recorded before anything runs.
//
// Decisions are taken one at a time, each seeing the pods admitted before it: decided
// publishes the decision (the worker's) before the next is taken. Recording it in the store
// happens after, outside that order, so that the records of a burst of pods share the
// store's commits rather than queueing one commit (an fsync) per pod behind each other.
func (m *Manager) admit(ctx context.Context, pod *v1.Pod, observed []runtime.Container, decided func(admission.Result)) admission.Result {
	r, recorded := m.decide(ctx, pod, observed)
	decided(r)
	m.admitMu.Unlock()
	if !recorded {
		m.recordAdmission(pod, r)
	}
	return r
}

// decide takes the admission decision with admitMu held, and leaves it held for the caller to
// publish the decision first. recorded: the store already has it (or there is no store).
func (m *Manager) decide(ctx context.Context, pod *v1.Pod, observed []runtime.Container) (r admission.Result, recorded bool) {
	m.admitMu.Lock()
	if m.store != nil {
		if rec, err := m.store.GetPod(pod.UID); err == nil && !rec.Admission.At.IsZero() {
			if rec.Admission.Accepted {
				return admission.Admit, true
			}
			return admission.Result{Reason: rec.Admission.Reason, Message: rec.Admission.Message}, true
		}
	}
	r = admission.Admit
	if len(observed) == 0 && m.admitter != nil {
		r = m.admitter.Admit(ctx, pod, m.admittedPods(pod.UID))
	}
	return r, m.store == nil
}

// recordAdmission keeps the pod and its admission decision in the store, before anything of
// the pod runs: after a reboot the decision stands.
func (m *Manager) recordAdmission(pod *v1.Pod, r admission.Result) {
	src := offline.SourceAPI
	if manifest.IsStatic(pod) {
		src = offline.SourceFile
	}
	if _, err := m.store.GetPod(pod.UID); err != nil {
		if err := m.store.PutPod(src, pod); err != nil {
			m.log.Warn("record pod for its admission decision", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		}
	}
	if err := m.store.SetAdmission(pod.UID, offline.Admission{Accepted: r.Admitted, At: m.now(), Reason: r.Reason, Message: r.Message}); err != nil {
		m.log.Warn("record admission decision", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}
