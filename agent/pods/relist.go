package pods

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"errors"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/offline"
)

// What the manager learns from the runtime, besides what its workers ask it: containerd's
// task events, which reach the workers of their pods within a fraction of a second, and the
// relist (kubelet's PLEG), the safety net behind them that also finds the containers of
// pods no source claims and hands them to orphan workers.

// relistLoop relists the runtime until ctx ends: every RelistPeriod, sooner when asked
// (requestRelist), every relistRetry while it fails, and at once when the sources become
// ready.
func (m *Manager) relistLoop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	var prev map[string]string
	// sourcesWereReady: the last relist that succeeded saw the sources ready (the orphans
	// adopted). triedReady and triedStatic: what the sources were at the last relist tried,
	// failed or not; only their becoming ready since asks for a relist at once. A failed
	// relist is retried every relistRetry: taking the sources' readiness for news after a
	// failure relisted at once in a loop, for as long as the runtime was down.
	sourcesWereReady, triedReady, triedStatic := false, false, false
	for {
		wait := m.untilRelist()
		if wait <= 0 {
			m.scheduleRelist(m.cfg.RelistPeriod)
			triedStatic, triedReady = m.staticSourceReady(), m.SourcesReady()
			cur, ready, ok := m.relist(ctx, prev)
			if ok {
				prev, sourcesWereReady = cur, ready
			} else {
				m.requestRelist(relistRetry)
			}
			continue
		}
		if !sourcesWereReady {
			// Orphans are adopted at the first relist once the sources are ready: look
			// every second (no runtime call) rather than wait for the next relist.
			wait = min(wait, sourcesReadyPoll)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-m.relistCh:
			timer.Stop() // Go 1.23 timers: no stale tick after Stop or Reset
		}
		if !sourcesWereReady && ((!triedReady && m.SourcesReady()) || (!triedStatic && m.staticSourceReady())) {
			m.requestRelist(0)
		}
	}
}

const (
	// relistRetry is how soon a failed relist is tried again (containerd restarting).
	relistRetry = time.Second
	// sourcesReadyPoll is how often the sources are checked for readiness until they are.
	sourcesReadyPoll = time.Second
	// subscribeSettle is how long after the event subscription is set up the relist that
	// catches what happened without one runs: containerd registers the subscriber when its
	// side of the stream starts, a moment after the client's side.
	subscribeSettle = time.Second
)

// scheduleRelist sets the next relist d from now, whatever was due: a relist begins.
func (m *Manager) scheduleRelist(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.relistDue = time.Now().Add(d)
}

// requestRelist asks for a relist within d (0: now); an earlier one already due stands.
func (m *Manager) requestRelist(d time.Duration) {
	m.mu.Lock()
	if due := time.Now().Add(d); m.relistDue.IsZero() || due.Before(m.relistDue) {
		m.relistDue = due
	}
	m.mu.Unlock()
	select {
	case m.relistCh <- struct{}{}:
	default:
	}
}

// untilRelist is the time left until the next relist is due (0 or less: now).
func (m *Manager) untilRelist() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.relistDue.IsZero() {
		return 0
	}
	return time.Until(m.relistDue)
}

// DefaultRelistThreshold is kubelet's PLEG relist threshold.
const DefaultRelistThreshold = 3 * time.Minute

// RelistHealthy says whether the runtime was relisted recently (kubelet's "PLEG is not
// healthy" once RelistThreshold passed without a successful relist).
func (m *Manager) RelistHealthy() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastRelist.IsZero() {
		return fmt.Errorf("runtime not relisted yet")
	}
	if d := m.now().Sub(m.lastRelist); d > m.cfg.RelistThreshold {
		return fmt.Errorf("PLEG is not healthy: pleg was last seen active %s ago; threshold is %s", d.Round(time.Second), m.cfg.RelistThreshold)
	}
	return nil
}

// relist lists the runtime, pokes the workers of pods whose containers changed since the
// previous list (every pod's at the first), and hands containers of pods that no source
// claims to an orphan worker once the sources are ready. It returns the pods' fingerprints,
// whether the sources were ready, and false when the list failed. The list is bounded by
// RelistThreshold: a call a hung runtime never answers must not hold the relist loop for
// good; it gives up (RelistHealthy fails by then anyway) and tries again.
func (m *Manager) relist(ctx context.Context, prev map[string]string) (fingerprints map[string]string, sourcesReady, ok bool) {
	listCtx, cancel := context.WithTimeout(ctx, m.cfg.RelistThreshold)
	began := time.Now()
	list, err := m.rt.List(listCtx)
	cancel()
	if ctx.Err() == nil { // a relist cut short by the agent's stop says nothing of the runtime
		m.cfg.Metrics.ObserveRelist(time.Since(began), err)
	}
	if err != nil {
		m.log.Warn("relist runtime", "err", err)
		return prev, false, false
	}
	byPod := map[string][]runtime.Container{}
	for _, c := range list {
		byPod[c.PodUID] = append(byPod[c.PodUID], c)
	}
	cur := make(map[string]string, len(byPod))
	for uid, cs := range byPod {
		cur[uid] = fingerprint(cs)
	}
	m.mu.Lock()
	m.lastRelist = m.now()
	for uid, at := range m.terminated {
		if m.now().Sub(at) > 10*time.Minute {
			delete(m.terminated, uid)
		}
	}
	ready := m.sourcesReady()
	staticReady := !ready && m.staticReady()
	for uid, fp := range cur {
		w, ok := m.workers[types.UID(uid)]
		switch {
		case ok && (prev == nil || prev[uid] != fp):
			w.poke()
		case !ok && ready:
			m.adoptOrphanLocked(byPod[uid][0], m.isStatic(types.UID(uid), byPod[uid]))
		case !ok && staticReady && m.isStatic(types.UID(uid), byPod[uid]):
			m.adoptOrphanLocked(byPod[uid][0], true)
		}
	}
	if ready {
		// Pods with a network or a volume directory left but no container (deleted while the
		// agent was down, after their containers went) are orphans too.
		for _, uid := range append(m.net.Known(), m.cfg.Volumes.Known()...) {
			if _, ok := m.workers[types.UID(uid)]; !ok && byPod[uid] == nil {
				m.adoptOrphanLocked(runtime.Container{PodUID: uid}, false)
			}
		}
	}
	m.mu.Unlock()
	return cur, ready, true
}

// staticSourceReady reports whether the file source has read its directory.
func (m *Manager) staticSourceReady() bool {
	m.mu.Lock()
	ready := m.staticReady
	m.mu.Unlock()
	return ready()
}

// isStatic reports whether the pod of containers cs came from a manifest: a container says so
// (runtime.Container.Static), or the store's record of the pod does (containers made before
// they said it). The containers of such a pod that no worker has are a static orphan: once the
// file source has read its directory, it alone decides those (a manifest removed while the
// agent was down, or a previous version of one edited meanwhile or during a kill), torn down
// without waiting for the apiserver's list, which an offline gateway may not see for weeks;
// until then the new version would wait for it, or both would run. The containers' own word
// survives the record's loss (a corrupt database quarantined, a record lost): with the record
// alone, a previous version whose record was lost ran beside the new one until the apiserver
// was back. A pod neither says is static waits for every source, as any: an API pod of the
// same namespace and name as a static pod is never taken for one.
func (m *Manager) isStatic(uid types.UID, cs []runtime.Container) bool {
	return slices.ContainsFunc(cs, func(c runtime.Container) bool { return c.Static }) || m.recordedAsStatic(uid)
}

// recordedAsStatic reports whether the store's record of the pod says it came from a manifest.
func (m *Manager) recordedAsStatic(uid types.UID) bool {
	if m.store == nil {
		return false
	}
	rec, err := m.store.GetPod(uid)
	return err == nil && rec.Source == offline.SourceFile
}

// adoptOrphanLocked starts a worker that tears down a pod no source claims: it was deleted
// while the agent was not running. static: the pod was a static pod's (isStatic);
// its worker's pod says so, so that the next version of that static pod waits for it to stop
// and is poked when it has.
func (m *Manager) adoptOrphanLocked(c runtime.Container, static bool) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(c.PodUID), Name: c.PodName, Namespace: c.PodNamespace}}
	if static {
		pod.Annotations = map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}
	}
	w := newWorker(m, pod)
	w.removal = &removalOrder{reason: "no source has this pod any more (deleted while the agent was down)", orphan: true}
	m.workers[pod.UID] = w
	m.startWorkerLocked(w)
	w.poke()
}

func fingerprint(cs []runtime.Container) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s:%s:%d", c.ID, c.State, c.ExitCode))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// followEvents hands containerd's task exits and OOMs to the workers of their pods. When the
// subscription breaks (containerd restarted), it subscribes again and has the runtime
// relisted once the new subscription is in place: what happened in between is not
// delivered.
func (m *Manager) followEvents(ctx context.Context) {
	subscribed := func() { m.requestRelist(subscribeSettle) }
	for ctx.Err() == nil {
		err := m.rt.SubscribeTaskEvents(ctx, subscribed, func(ev runtime.TaskEvent) { m.taskEvent(ctx, ev) })
		if ctx.Err() != nil {
			return
		}
		m.log.Warn("containerd event subscription ended; subscribing again", "err", err)
		m.requestRelist(0)
		select {
		case <-ctx.Done():
		case <-time.After(resubscribeDelay):
		}
	}
}

// resubscribeDelay is the pause between two attempts to subscribe to containerd's events.
const resubscribeDelay = time.Second

// taskEvent pokes the worker of the pod whose container exited or was OOM-killed (after
// recording the OOM on the container, which its exit then reports). A container of no known
// pod, or one whose pod cannot be read, is left to a relist at once.
func (m *Manager) taskEvent(ctx context.Context, ev runtime.TaskEvent) {
	if ev.OOM {
		if err := m.rt.RecordOOM(ctx, ev.ContainerID); err != nil {
			m.log.Debug("record OOM", "container", ev.ContainerID, "err", err)
		}
	}
	uid, err := m.rt.PodOf(ctx, ev.ContainerID)
	if errors.Is(err, runtime.ErrNotFound) {
		return // removed already: by its worker, which knows
	}
	if err != nil {
		m.log.Debug("find the pod of a task event", "container", ev.ContainerID, "err", err)
		m.requestRelist(0)
		return
	}
	if w := m.worker(types.UID(uid)); w != nil {
		w.poke()
		return
	}
	m.requestRelist(0)
}
