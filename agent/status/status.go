// Package status owns what is reported about pods: it keeps the latest status the pod
// workers computed, writes it to the apiserver through the status subresource when it
// changed (one patch per change, however many syncs computed it), and deletes an API pod for
// good once its containers are gone.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/kube/patch"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/internal/podutil"
	"github.com/holdfast-dev/holdfast/offline"
)

// Manager keeps and reports pod statuses. With a nil client it only keeps them (standalone).
//
// Statuses of API pods also go to the offline store's outbox before any write is tried, so a
// status computed while the apiserver is unreachable is delivered, with its original
// timestamps, when it comes back, even across an agent restart. Static pods are reported
// through mirror pods, which the manager creates (and re-creates when deleted) whenever the
// apiserver is reachable.
type Manager struct {
	client   kube.Interface
	store    Outbox // nil: no outbox
	nodeName string
	log      *slog.Logger
	wake     chan struct{} // buffered(1)

	mu      sync.Mutex // protects pods, nodeUID
	pods    map[types.UID]*entry
	nodeUID types.UID
}

// Outbox is what the manager uses of the state store (offline.Store): the outbox of statuses
// not yet delivered, and whether a pod still has a record.
type Outbox interface {
	AppendStatus(u offline.StatusUpdate) (seq uint64, err error)
	PendingStatuses() ([]offline.PendingStatus, map[string]error, error)
	AckStatuses(uid types.UID, upTo uint64) error
	GetPod(uid types.UID) (offline.PodRecord, error)
}

type entry struct {
	pod       *v1.Pod // latest pod object the worker had (for name, namespace, source)
	status    v1.PodStatus
	sent      *v1.PodStatus // last status the apiserver has; nil until read or written
	seq       uint64        // outbox sequence of status, to ack once delivered
	dirty     bool
	terminate bool      // containers gone: delete the API object after the final status
	mirrorUID types.UID // static pods: the mirror pod reporting for it, "" until created
	// observed counts the statuses Observed took as the base: one that came during a write
	// keeps the pod dirty, and its base is not overwritten by the write's answer.
	observed uint64
	// repatched: the status was written once more because the answer lacked it (stale, in
	// syncAll); reset by a new status or observation. A second answer that still lacks it is
	// left as it is: no loop with a writer or a field the apiserver keeps changing.
	repatched bool
}

// NewManager builds a manager; Run writes to the apiserver. store may be nil (no outbox).
func NewManager(client kube.Interface, store Outbox, nodeName string, log *slog.Logger) *Manager {
	return &Manager{client: client, store: store, nodeName: nodeName, log: log, wake: make(chan struct{}, 1), pods: map[types.UID]*entry{}}
}

// RestoreOutbox loads the statuses an earlier run could not deliver; Run delivers them in
// the order they were first recorded, coalesced to the latest per pod. The statuses of a pod
// the store has no record of any more (deleted from the API, its record removed, before they
// were delivered) are dropped: the pod is no longer the node's, and the Node authorizer
// refuses them (403) for as long as they are retried, which was for good.
func (m *Manager) RestoreOutbox() int {
	if m.store == nil {
		return 0
	}
	pending, bad, err := m.store.PendingStatuses()
	if err != nil {
		m.log.Error("load status outbox", "err", err)
		return 0
	}
	for key, err := range bad {
		m.log.Error("status outbox entry unreadable; quarantined", "key", key, "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	restored := 0
	for _, p := range pending {
		if _, ok := m.pods[p.UID]; ok {
			continue
		}
		_, err := m.store.GetPod(p.UID)
		switch {
		case errors.Is(err, offline.ErrNotFound):
			if err := m.store.AckStatuses(p.UID, p.LastSeq); err != nil {
				m.log.Warn("drop the statuses of a pod no longer on this node", "pod", p.Namespace+"/"+p.Name, "err", err)
			} else {
				m.log.Info("statuses of a pod no longer on this node dropped", "pod", p.Namespace+"/"+p.Name, "uid", p.UID)
			}
			continue
		case errors.Is(err, offline.ErrKeyMismatch):
			// Its record is sealed with a state key that is not loaded: the pod is not
			// restored, and its last status (Running, ready) would be shown and sent for a
			// pod that does not run. Left in the outbox, for the key's return.
			m.log.Info("statuses of a pod whose record is sealed with another state key not restored", "pod", p.Namespace+"/"+p.Name, "uid", p.UID)
			continue
		}
		restored++
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
		m.pods[p.UID] = &entry{pod: pod, status: p.Status, seq: p.LastSeq, dirty: true}
	}
	if restored > 0 {
		m.poke()
	}
	return restored
}

// MirrorDeleted is told that a mirror pod disappeared from the apiserver; if its static pod
// still runs, the mirror is created again.
func (m *Manager) MirrorDeleted(mirror *v1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.pods {
		if e.mirrorUID == mirror.UID {
			e.mirrorUID, e.sent, e.dirty = "", nil, true
			m.poke()
		}
	}
}

// Observed takes the status the apiserver has for a pod (or for a static pod's mirror), as the
// informer delivered it, as the base of the pod's next patch. Someone else may have written it
// since the node did: the node lifecycle controller marks every pod Ready=False while the node
// is unreachable. A patch computed from the last status the node sent then carried nothing
// (the node's status had not changed) or a transition time alone, and the API kept Ready=False
// until a periodic resync; the kubelet reads the pod again before each patch, which on a
// metered uplink costs a GET per status change. An echo of an older patch of the node's own
// costs one patch that changes nothing; a status equal to the base costs nothing.
func (m *Manager) Observed(pod *v1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.pods[pod.UID]
	if e == nil {
		for _, c := range m.pods {
			if c.mirrorUID != "" && c.mirrorUID == pod.UID {
				e = c
				break
			}
		}
	}
	// No base yet: the next patch reads the pod first anyway.
	if e == nil || e.sent == nil || apiequality.Semantic.DeepEqual(*e.sent, pod.Status) {
		return
	}
	e.sent = pod.Status.DeepCopy()
	e.dirty = true
	e.observed++
	e.repatched = false
	m.poke()
}

// SetPodStatus records a pod's latest computed status. An unchanged status is a no-op.
func (m *Manager) SetPodStatus(pod *v1.Pod, st v1.PodStatus) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[pod.UID]
	if !ok {
		e = &entry{}
		m.pods[pod.UID] = e
	}
	e.pod = pod
	if e.terminate {
		// A status after the teardown is a new life of the pod (its source delivered it again).
		e.terminate, e.dirty = false, true
	}
	if ok && apiequality.Semantic.DeepEqual(e.status, st) {
		return
	}
	m.logChange(pod, e.status, st, !ok)
	e.status = st
	e.dirty = true
	e.repatched = false
	if m.store != nil && !manifest.IsStatic(pod) {
		seq, err := m.store.AppendStatus(offline.StatusUpdate{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Status: st, Timestamp: time.Now()})
		if err != nil {
			m.log.Error("record status in the outbox", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		} else {
			e.seq = seq
		}
	}
	m.poke()
}

// PodTerminated marks the pod's teardown as complete.
func (m *Manager) PodTerminated(pod *v1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[pod.UID]
	if !ok {
		return
	}
	e.pod = pod
	e.terminate = true
	e.dirty = true
	m.poke()
}

// Get returns the latest status of a pod.
func (m *Manager) Get(uid types.UID) (v1.PodStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[uid]
	if !ok {
		return v1.PodStatus{}, false
	}
	return e.status, true
}

// Pods returns every pod the manager knows with its latest status, deep copies sorted by
// namespace and name: what the node API's /pods serves, as kubelet's does.
func (m *Manager) Pods() []*v1.Pod {
	m.mu.Lock()
	out := make([]*v1.Pod, 0, len(m.pods))
	for _, e := range m.pods {
		p := e.pod.DeepCopy()
		e.status.DeepCopyInto(&p.Status)
		out = append(out, p)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// PodView is one pod as `holdfast pods` and the tests show it: the pod's identity, where it
// came from and its status, from the local API socket's /pods (a v1.PodList).
type PodView struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	UID       types.UID    `json:"uid"`
	Source    string       `json:"source"`
	Status    v1.PodStatus `json:"status"`
}

// ViewOf is the view of a pod as the local API socket's /pods returns it (Manager.Pods).
func ViewOf(pod *v1.Pod) PodView {
	src := manifest.SourceAPI
	if manifest.IsStatic(pod) {
		src = manifest.SourceFile
	}
	return PodView{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Source: src, Status: pod.Status}
}

// Pending returns how many pods have a status not yet delivered to the apiserver (coalesced
// to the latest per pod, as Run delivers them); 0 on a standalone node, which delivers none.
func (m *Manager) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client == nil {
		return 0
	}
	n := 0
	for _, e := range m.pods {
		if e.dirty {
			n++
		}
	}
	return n
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Retries while the apiserver does not answer: from the first to the last, doubling. Status
// changes that arrive meanwhile wait for the next try (they are in the outbox already).
const (
	unreachableRetryFirst = time.Second
	unreachableRetryMax   = 10 * time.Second
)

// Run writes dirty statuses until ctx ends. A failed write stays dirty and is retried.
func (m *Manager) Run(ctx context.Context) error {
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	retry := unreachableRetryFirst
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		case <-ticker.C:
		}
		if !m.syncAll(ctx) {
			retry = unreachableRetryFirst
			continue
		}
		// Every pod's status changes at boot: without the pause, each change would try every
		// pending pod again against an apiserver that does not answer.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
		retry = min(2*retry, unreachableRetryMax)
	}
}

// unreachable: the request got no answer from the apiserver (a transport error, as opposed
// to an answer that refused it, or a failure of this pod's own); the other pending writes
// would get none either.
func unreachable(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr)
}

// syncAll delivers the pending statuses, oldest first, and reports whether it stopped because
// the apiserver did not answer: the first write that gets no answer ends the round.
func (m *Manager) syncAll(ctx context.Context) (apiUnreachable bool) {
	type job struct {
		uid       types.UID
		pod       *v1.Pod
		st        v1.PodStatus
		sent      *v1.PodStatus
		seq       uint64
		term      bool
		mirrorUID types.UID
		observed  uint64
	}
	var jobs []job
	m.mu.Lock()
	for uid, e := range m.pods {
		if !e.dirty {
			continue
		}
		if m.client == nil {
			e.dirty = false
			if e.terminate {
				delete(m.pods, uid)
			}
			continue
		}
		jobs = append(jobs, job{uid, e.pod, e.status, e.sent, e.seq, e.terminate, e.mirrorUID, e.observed})
	}
	m.mu.Unlock()
	// Deliver in the order statuses were first recorded, oldest first.
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].seq < jobs[j].seq })

	for _, j := range jobs {
		var sent *v1.PodStatus
		var err error
		mirrorUID := j.mirrorUID
		static := manifest.IsStatic(j.pod)
		switch {
		case static && j.term:
			err = m.deleteMirror(ctx, j.pod, mirrorUID)
		case static:
			var target *v1.Pod
			if target, err = m.ensureMirror(ctx, j.pod, mirrorUID); err == nil {
				if mirrorUID != target.UID {
					mirrorUID, j.sent = target.UID, &target.Status
				}
				sent, err = m.patch(ctx, target, j.sent, j.st)
			}
		default:
			sent, err = m.patch(ctx, j.pod, j.sent, j.st)
			if j.term && apierrors.IsForbidden(err) {
				// A pod that has terminated here and that the Node authorizer no longer lets
				// the node read is gone from the API (deleted while the node was offline):
				// nothing is left to report. Only a live pod's status is retried on 403.
				sent, err = nil, nil
			}
			if err == nil && m.store != nil && j.seq > 0 {
				if aerr := m.store.AckStatuses(j.uid, j.seq); aerr != nil {
					m.log.Warn("ack delivered status", "pod", j.pod.Namespace+"/"+j.pod.Name, "err", aerr)
				}
			}
			if err == nil && j.term && j.pod.DeletionTimestamp != nil {
				err = m.delete(ctx, j.pod)
			}
		}
		// The answer's status may still lack what the node wrote: another writer (the node
		// lifecycle controller's Ready=False) changed it after the base was taken, so the
		// patch carried nothing for it. The answer is the base then, and the pod stays
		// dirty: the next patch, from it, writes the node's status back.
		stale := false
		if err == nil && sent != nil && !j.term {
			stale = statusDiffers(*sent, overAPIStatus(*sent, j.st, static))
		}
		m.mu.Lock()
		if e := m.pods[j.uid]; e != nil {
			observedMeanwhile := e.observed != j.observed
			if sent != nil && !observedMeanwhile {
				e.sent = sent
			}
			if stale {
				stale = !e.repatched
				e.repatched = true
			}
			if static && e.mirrorUID == j.mirrorUID {
				e.mirrorUID = mirrorUID
			}
			if err == nil && !stale && !observedMeanwhile && apiequality.Semantic.DeepEqual(e.status, j.st) && e.terminate == j.term {
				e.dirty = false
				if e.terminate {
					delete(m.pods, j.uid)
				}
			}
		}
		m.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			if unreachable(err) {
				m.log.Warn("report pod status; apiserver unreachable, the statuses wait in the outbox", "pod", j.pod.Namespace+"/"+j.pod.Name,
					"pending", len(jobs), "err", err)
				return true
			}
			m.log.Warn("report pod status", "pod", j.pod.Namespace+"/"+j.pod.Name, "err", err)
		}
	}
	return false
}

// ensureMirror returns the mirror pod of a static pod, creating it (or replacing one made
// for an older version of the manifest) as kubelet does.
func (m *Manager) ensureMirror(ctx context.Context, static *v1.Pod, known types.UID) (*v1.Pod, error) {
	pods := m.client.CoreV1().Pods(static.Namespace)
	hash := static.Annotations[manifest.ConfigHashAnnotation]
	existing, err := pods.Get(ctx, static.Name, metav1.GetOptions{})
	if absent(err) {
		err = apierrors.NewNotFound(v1.Resource("pods"), static.Name)
	}
	isMirror := false
	if err == nil {
		_, isMirror = existing.Annotations[manifest.MirrorAnnotation]
	}
	switch {
	case err == nil && (!isMirror || existing.Spec.NodeName != m.nodeName):
		// A pod someone created under the static pod's name (or another node's mirror): not
		// this node's to delete, whatever it is. The static pod runs without a mirror, as with
		// the kubelet, whose create then fails too.
		return nil, fmt.Errorf("pod %s/%s (uid %s) holds the static pod's name and is not this node's mirror pod: no mirror is made while it exists (delete or rename it)",
			static.Namespace, static.Name, existing.UID)
	case err == nil && existing.Annotations[manifest.MirrorAnnotation] == hash && existing.DeletionTimestamp == nil:
		return existing, nil
	case err == nil:
		// A mirror of another version of the manifest (or a pod of the same name being
		// deleted): replace it.
		zero := int64(0)
		if err := pods.Delete(ctx, existing.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: metav1.NewUIDPreconditions(string(existing.UID))}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("replace stale mirror pod %s/%s: %w", static.Namespace, static.Name, err)
		}
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get mirror pod %s/%s: %w", static.Namespace, static.Name, err)
	}
	nodeUID, err := m.getNodeUID(ctx)
	if err != nil {
		return nil, err
	}
	mirror := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: static.Name, Namespace: static.Namespace,
			Labels:      static.Labels,
			Annotations: map[string]string{},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: m.nodeName, UID: nodeUID, Controller: ptr.To(true),
			}},
		},
		Spec: *static.Spec.DeepCopy(),
	}
	for k, v := range static.Annotations {
		mirror.Annotations[k] = v
	}
	mirror.Annotations[manifest.MirrorAnnotation] = hash
	created, err := pods.Create(ctx, mirror, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create mirror pod %s/%s: %w", static.Namespace, static.Name, err)
	}
	m.log.Info("mirror pod created", "pod", static.Namespace+"/"+static.Name, "mirrorUID", created.UID)
	return created, nil
}

// DeleteOrphanedMirror deletes a mirror pod whose static pod does not run here, if it is still
// that pod (its UID): a newer mirror made meanwhile is left alone.
func (m *Manager) DeleteOrphanedMirror(ctx context.Context, mirror *v1.Pod) error {
	if m.client == nil {
		return nil
	}
	zero := int64(0)
	err := m.client.CoreV1().Pods(mirror.Namespace).Delete(ctx, mirror.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: metav1.NewUIDPreconditions(string(mirror.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete mirror pod %s/%s: %w", mirror.Namespace, mirror.Name, err)
	}
	return nil
}

// deleteMirror deletes the mirror of a static pod that stopped, if it is still the one made
// for that version of the manifest.
func (m *Manager) deleteMirror(ctx context.Context, static *v1.Pod, mirrorUID types.UID) error {
	pods := m.client.CoreV1().Pods(static.Namespace)
	existing, err := pods.Get(ctx, static.Name, metav1.GetOptions{})
	if absent(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("get mirror pod %s/%s: %w", static.Namespace, static.Name, err)
	}
	if existing.Annotations[manifest.MirrorAnnotation] != static.Annotations[manifest.ConfigHashAnnotation] {
		return nil // already replaced by the mirror of a newer manifest
	}
	zero := int64(0)
	err = pods.Delete(ctx, existing.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(existing.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete mirror pod %s/%s: %w", static.Namespace, static.Name, err)
	}
	return nil
}

func (m *Manager) getNodeUID(ctx context.Context) (types.UID, error) {
	m.mu.Lock()
	uid := m.nodeUID
	m.mu.Unlock()
	if uid != "" {
		return uid, nil
	}
	node, err := m.client.CoreV1().Nodes().Get(ctx, m.nodeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s for mirror pod owner: %w", m.nodeName, err)
	}
	m.mu.Lock()
	m.nodeUID = node.UID
	m.mu.Unlock()
	return node.UID, nil
}

// absent says a GET found no pod this node may see. The Node authorizer answers Forbidden,
// not NotFound, for a pod that is not bound to this node, which includes one that no longer
// exists at all.
func absent(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsForbidden(err) }

// patch writes st with a strategic merge patch computed from the last status the apiserver
// accepted, with the pod UID as a precondition so a re-created pod of the same name is never
// patched with another pod's status.
func (m *Manager) patch(ctx context.Context, pod *v1.Pod, sent *v1.PodStatus, st v1.PodStatus) (*v1.PodStatus, error) {
	if sent == nil {
		// First write since start: patch from what the apiserver has, not from nothing.
		// Only NotFound means the pod is gone. A Forbidden is not final here: right after an
		// apiserver restart the Node authorizer refuses the node until its graph has caught up,
		// and a status dropped then would never be sent (nothing changes in a steady pod). A pod
		// deleted for good leaves this manager through PodTerminated instead (see syncAll).
		cur, err := m.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("read status of %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if cur.UID != pod.UID {
			return nil, nil // another pod of the same name: ours is gone
		}
		sent = &cur.Status
	}
	_, mirror := pod.Annotations[manifest.MirrorAnnotation]
	st = overAPIStatus(*sent, st, mirror)
	patch, err := statusPatch(*sent, st)
	if err != nil {
		return nil, err
	}
	if string(patch) == "{}" {
		// Nothing to write, as JSON keeps it: a status that differs from the base only by
		// what the apiserver does not store (times below the second), e.g. the informer's
		// echo of this very status taken as the base before the write's answer.
		return sent, nil
	}
	var body map[string]any
	if err := json.Unmarshal(patch, &body); err != nil {
		return nil, err
	}
	body["metadata"] = map[string]any{"uid": string(pod.UID)}
	if patch, err = json.Marshal(body); err != nil {
		return nil, err
	}
	updated, err := m.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil, nil // gone or replaced: nothing to report any more (Forbidden: see above)
	}
	if err != nil {
		return nil, fmt.Errorf("patch status of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return &updated.Status, nil
}

// statusDiffers reports whether a patch from base to st would carry anything, compared as the
// patch is computed (JSON, times to the second), so that a status the apiserver stored with
// less precision than the node's is not taken for a difference, and the pod not patched in a
// loop.
func statusDiffers(base, st v1.PodStatus) bool {
	patch, err := statusPatch(base, st)
	return err == nil && string(patch) != "{}"
}

// statusPatch is the strategic merge patch from base to st ("{}" when it carries nothing).
func statusPatch(base, st v1.PodStatus) ([]byte, error) {
	p, err := patch.TwoWay(v1.Pod{Status: base}, v1.Pod{Status: st}, patch.Pod)
	if err != nil {
		return nil, fmt.Errorf("compute status patch: %w", err)
	}
	return p, nil
}

// ownedConditions are the pod conditions the node agent computes and writes.
var ownedConditions = map[v1.PodConditionType]bool{
	v1.PodScheduled: true, v1.PodInitialized: true, v1.ContainersReady: true, v1.PodReady: true,
	v1.PodResizePending: true, v1.PodResizeInProgress: true,
}

// OwnedCondition reports whether the node agent computes and writes the pod condition t; the
// others (readiness gates, DisruptionTarget, a scheduler's) belong to other writers and are
// kept as they are.
func OwnedCondition(t v1.PodConditionType) bool { return ownedConditions[t] }

// overAPIStatus is what the node writes over the apiserver's status sent: its own status st,
// with the conditions other writers own kept and, for a pod of the API (not a mirror pod, whose
// static pod's source is a file), a terminal phase another writer set kept with its reason
// and message: a phase never goes back from Succeeded or Failed. The kubelet keeps the API's
// terminal phase the same way, and stops the pod; the pod's worker does (pods.syncRunning),
// but a status computed before it did must not write Running over that phase meanwhile.
func overAPIStatus(sent, st v1.PodStatus, mirror bool) v1.PodStatus {
	st = keepForeignConditions(sent, st)
	st = keepForeignFields(sent, st)
	if !mirror && podutil.IsTerminal(sent.Phase) && !podutil.IsTerminal(st.Phase) {
		st.Phase, st.Reason, st.Message = sent.Phase, sent.Reason, sent.Message
	}
	return st
}

// keepForeignFields sets in st the fields of a pod's status that other writers own, as the
// apiserver holds them: the scheduler's nominatedNodeName and the resource claim controller's
// statuses. The node never computes them, and a patch from the apiserver's status to one
// without them would delete them (the kubelet keeps the claim statuses the same way, in its
// status manager's mergePodStatus).
func keepForeignFields(sent, st v1.PodStatus) v1.PodStatus {
	st.NominatedNodeName = sent.NominatedNodeName
	st.ResourceClaimStatuses = sent.ResourceClaimStatuses
	st.ExtendedResourceClaimStatus = sent.ExtendedResourceClaimStatus
	st.NodeAllocatableResourceClaimStatuses = sent.NodeAllocatableResourceClaimStatuses
	return st
}

// keepForeignConditions adds to st the conditions of the apiserver's status that other writers
// own (readiness gates, DisruptionTarget) and st lacks: a patch computed against the
// apiserver's status must never delete them, even when the pod the status was computed from
// had not seen them yet.
func keepForeignConditions(sent, st v1.PodStatus) v1.PodStatus {
	var missing []v1.PodCondition
	for _, c := range sent.Conditions {
		if OwnedCondition(c.Type) {
			continue
		}
		found := false
		for _, own := range st.Conditions {
			found = found || own.Type == c.Type
		}
		if !found {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return st
	}
	st.Conditions = append(slices.Clone(st.Conditions), missing...)
	return st
}

// delete removes the API object with grace period 0 once the pod's containers are gone, as
// kubelet does to finish a graceful deletion.
func (m *Manager) delete(ctx context.Context, pod *v1.Pod) error {
	zero := int64(0)
	err := m.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// logChange writes one line when a pod's phase or a container's state changes, so that an
// operator following the log sees the pods move.
func (m *Manager) logChange(pod *v1.Pod, old, cur v1.PodStatus, first bool) {
	o, c := summary(old), summary(cur)
	if !first && o == c && old.Phase == cur.Phase {
		return
	}
	m.log.Info("pod status", "pod", pod.Namespace+"/"+pod.Name, "phase", cur.Phase, "podIP", cur.PodIP, "containers", c)
}

func summary(st v1.PodStatus) string {
	parts := make([]string, 0, len(st.ContainerStatuses))
	for _, cs := range st.ContainerStatuses {
		s := cs.Name + "="
		switch {
		case cs.State.Running != nil:
			s += "running"
		case cs.State.Terminated != nil:
			s += fmt.Sprintf("terminated(%s, exit %d)", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		case cs.State.Waiting != nil:
			s += "waiting(" + cs.State.Waiting.Reason + ")"
		}
		if cs.Ready {
			s += ",ready"
		}
		if cs.RestartCount > 0 {
			s += fmt.Sprintf(",restarts=%d", cs.RestartCount)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}
