package prober

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Config configures a Manager.
type Config struct {
	// Handler runs the probe attempts. Required; the agent's is NewHandlers(rt, policies).
	Handler Handler
	// Recorder receives the probes' events, as kubelet emits them: Warning Unhealthy
	// "Liveness probe failed: <output>" (and "... probe errored: ..."), Warning ProbeWarning.
	// Defaults to none.
	Recorder record.EventRecorder
	// OnStatusChange is called when a container's readiness or started state changes, so
	// that the pod worker computes and reports the pod's status again. It is called from a
	// probe worker's goroutine without the Manager's lock held, and must not block: poke
	// the pod worker. Defaults to nothing.
	OnStatusChange func(podUID types.UID)
	// OnContainerUnhealthy is called exactly once per container instance (containerID)
	// whose liveness or startup probe reached its failure threshold: the container must be
	// killed, and restarted per the pod's restartPolicy. Unhealthy answers the same until a
	// new instance of the container runs; probing that instance stops. Same calling rules as
	// OnStatusChange. Defaults to nothing.
	OnContainerUnhealthy func(podUID types.UID, container, containerID, message string)
	// Clock schedules the probes. Defaults to the real clock.
	Clock clock.Clock
	// Log defaults to discarding.
	Log *slog.Logger
}

// ContainerInfo is what the prober needs of a running container instance.
type ContainerInfo struct {
	// ID is the containerd ID of this instance; a new ID starts the probes over.
	ID string
	// StartedAt is when it started: initialDelaySeconds counts from there.
	StartedAt time.Time
	// Pid is its init process on the host (0 if unknown), for Wasm probes' file access.
	Pid uint32
}

// RunningContainers picks, from a pod's observed containers, the running instance of each
// container name: what UpdatePod takes.
func RunningContainers(observed []runtime.Container) map[string]ContainerInfo {
	out := map[string]ContainerInfo{}
	attempt := map[string]int{}
	for _, c := range observed {
		if c.State != runtime.StateRunning {
			continue
		}
		if a, seen := attempt[c.Name]; seen && a > c.Attempt {
			continue
		}
		attempt[c.Name] = c.Attempt
		out[c.Name] = ContainerInfo{ID: c.ID, StartedAt: c.StartedAt, Pid: c.Pid}
	}
	return out
}

// Unhealthy says that a container instance failed its liveness or startup probe and must be
// killed.
type Unhealthy struct {
	ContainerID string
	// Kind is Liveness or Startup.
	Kind Kind
	// Message is kubelet's, for the Killing event: "Container app failed liveness probe,
	// will be restarted".
	Message string
	// GracePeriodSeconds is the probe's terminationGracePeriodSeconds, which replaces the
	// pod's for this kill when set (kubelet does the same); nil otherwise.
	GracePeriodSeconds *int64
}

// Manager runs the probe workers of every pod the pod workers report. Its methods are safe
// for concurrent use.
type Manager struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger

	mu      sync.Mutex // protects pods, ctx, stopped, and the state of every worker
	pods    map[types.UID]*podState
	ctx     context.Context // set while Run runs: workers start under it
	stopped bool            // Run has returned or is returning: no new worker starts
	wg      sync.WaitGroup  // the worker goroutines
}

// podState is the latest observation of one pod, and its probe workers.
type podState struct {
	pod     *v1.Pod
	podIP   string
	running map[string]ContainerInfo
	workers map[workerKey]*worker
	// terminating: the pod's containers are being stopped (StopLivenessAndStartup); only its
	// readiness probes run, and UpdatePod starts no other.
	terminating bool
}

type workerKey struct {
	uid       types.UID
	container string
	kind      Kind
}

// NewManager builds a manager; no probe runs until Run.
func NewManager(cfg Config) *Manager {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OnStatusChange == nil {
		cfg.OnStatusChange = func(types.UID) {}
	}
	if cfg.OnContainerUnhealthy == nil {
		cfg.OnContainerUnhealthy = func(types.UID, string, string, string) {}
	}
	return &Manager{cfg: cfg, clock: cfg.Clock, log: cfg.Log, pods: map[types.UID]*podState{}}
}

// Run runs the probe workers until ctx ends, and returns once every one of them has
// returned. Workers of pods updated before Run start when it does.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil || m.stopped {
		m.mu.Unlock()
		return errors.New("prober: Run called twice")
	}
	if m.cfg.Handler == nil {
		m.mu.Unlock()
		return errors.New("prober: Config.Handler is required")
	}
	m.ctx = ctx
	for _, ps := range m.pods {
		for _, w := range ps.workers {
			m.startLocked(w)
		}
	}
	m.mu.Unlock()

	<-ctx.Done()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

func (m *Manager) startLocked(w *worker) {
	if m.ctx == nil || m.stopped || w.running || w.stopped {
		return
	}
	w.running = true
	// Stopping the worker cancels its attempt in flight (an exec, a dial).
	ctx, cancel := context.WithCancel(m.ctx)
	w.cancel = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		w.run(ctx)
	}()
}

// UpdatePod tells the manager the pod's spec and which of its containers run now, after
// each observation of the runtime and before its status is computed from Ready and Started.
// podIP is the pod's address (the node's for a host-network pod), "" if it has none yet;
// running maps container names to their running instance (see RunningContainers).
//
// Workers start for each probe the pod's containers declare (restartable init containers
// included) and stop for probes that are gone. A container seen with a new ID starts over:
// liveness passing, readiness failing, startup not yet passed. A container instance seen for
// the first time while pod.Status reports that very instance ready (or started) keeps that
// state until its probe says otherwise, so that an agent restart does not flap the pod's
// readiness; this needs a pod that carries its last reported status.
func (m *Manager) UpdatePod(pod *v1.Pod, podIP string, running map[string]ContainerInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[pod.UID]
	if ps == nil {
		ps = &podState{workers: map[workerKey]*worker{}}
		m.pods[pod.UID] = ps
	}
	ps.pod, ps.podIP = pod, podIP
	ps.running = make(map[string]ContainerInfo, len(running))
	for name, info := range running {
		ps.running[name] = info
	}

	want := map[workerKey]*v1.Probe{}
	for _, c := range probedContainers(pod) {
		for _, k := range kinds {
			if ps.terminating && k != Readiness {
				continue
			}
			if p := probeOf(c, k); p != nil {
				want[workerKey{uid: pod.UID, container: c.Name, kind: k}] = p
			}
		}
	}
	for key, w := range ps.workers {
		if p, ok := want[key]; !ok || !equality.Semantic.DeepEqual(p, w.probe) {
			m.stopLocked(ps, w)
		}
	}
	for _, k := range kinds { // startup first: readiness and liveness read its state
		for key, p := range want {
			if key.kind != k {
				continue
			}
			w := ps.workers[key]
			if w == nil {
				w = newWorker(m, key, p)
				ps.workers[key] = w
				m.startLocked(w)
			}
			if info, ok := ps.running[key.container]; ok && info.ID != w.containerID {
				w.resetLocked(info, pod, m.clock.Now())
			} else if ok && w.lastRun.IsZero() {
				// Not probed yet since the agent started: a later copy of the pod (the
				// apiserver's, after the cache's) may report this instance ready or started.
				w.adoptReportedLocked(pod)
			}
			w.poke()
		}
	}
}

// StopLivenessAndStartup is the kubelet's of the same name, called as the pod's containers are
// about to be stopped: its liveness and startup probes end for good (a container asked to
// stop, its handler removing what they check, is not killed again for failing them), and its
// readiness probes go on while the containers shut down, so that a pod whose readiness fails
// once it is asked to stop is reported unready while it drains. A container that had not
// passed its startup probe counts as started, as the kubelet sets that result to success.
// RemovePod ends the rest once the containers are stopped.
func (m *Manager) StopLivenessAndStartup(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[uid]
	if ps == nil {
		// Not probed yet since the agent started: the UpdatePod that follows starts only
		// the readiness probes.
		ps = &podState{workers: map[workerKey]*worker{}}
		m.pods[uid] = ps
	}
	ps.terminating = true
	for key, w := range ps.workers {
		if key.kind != Readiness {
			m.stopLocked(ps, w)
		}
	}
	for _, w := range ps.workers {
		w.poke() // one gated on the startup probe may run now
	}
}

// RemovePod stops the probes of a pod being torn down and forgets it.
func (m *Manager) RemovePod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[uid]
	if ps == nil {
		return
	}
	for _, w := range ps.workers {
		m.stopLocked(ps, w)
	}
	delete(m.pods, uid)
}

func (m *Manager) stopLocked(ps *podState, w *worker) {
	if !w.stopped {
		w.stopped = true
		close(w.stop)
		if w.cancel != nil {
			w.cancel()
		}
	}
	delete(ps.workers, w.key)
}

// Ready reports whether the container runs, has started, and passes its readiness probe (or
// has none): the container status's ready.
func (m *Manager) Ready(uid types.UID, container string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[uid]
	if ps == nil {
		return false
	}
	info, ok := ps.running[container]
	if !ok || !ps.startedLocked(uid, container, info.ID) {
		return false
	}
	w := ps.workers[workerKey{uid, container, Readiness}]
	return w == nil || (w.containerID == info.ID && w.result == Success)
}

// Started reports whether the container runs and has passed its startup probe (or has
// none): the container status's started.
func (m *Manager) Started(uid types.UID, container string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[uid]
	if ps == nil {
		return false
	}
	info, ok := ps.running[container]
	return ok && ps.startedLocked(uid, container, info.ID)
}

// Unhealthy reports whether the running instance of the container failed its liveness or
// startup probe and must be killed. It answers the same until a new instance runs.
func (m *Manager) Unhealthy(uid types.UID, container string) (Unhealthy, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pods[uid]
	if ps == nil {
		return Unhealthy{}, false
	}
	info, ok := ps.running[container]
	if !ok {
		return Unhealthy{}, false
	}
	for _, k := range []Kind{Startup, Liveness} {
		if w := ps.workers[workerKey{uid, container, k}]; w != nil && w.unhealthy != nil && w.containerID == info.ID {
			return *w.unhealthy, true
		}
	}
	return Unhealthy{}, false
}

// startedLocked: the instance passed its startup probe, or the container has none.
func (ps *podState) startedLocked(uid types.UID, container, id string) bool {
	w := ps.workers[workerKey{uid, container, Startup}]
	return w == nil || (w.containerID == id && w.result == Success)
}

// probedContainers are the containers whose probes run: the app containers and the
// restartable init containers (sidecars). Kubelet ignores probes of other init containers.
func probedContainers(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			out = append(out, c)
		}
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// findContainer returns the probed container of that name, and whether it is an init
// container (for the event's field path).
func findContainer(pod *v1.Pod, name string) (*v1.Container, bool) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i], true
		}
	}
	return nil, false
}
