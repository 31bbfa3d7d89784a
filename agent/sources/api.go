package sources

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/offline"
)

// ReasonNotCached is the event reason of a pod the state store could not cache.
const ReasonNotCached = "NotCached"

// PodCache is what the API source uses of the state store (offline.Store): the records of
// the pods it delivered.
type PodCache interface {
	PutPod(source offline.Source, pod *v1.Pod) error
	LoadPods() ([]offline.PodRecord, map[string]error, error)
	DeletePod(uid types.UID) error
	DeletePodSealedWithAnotherKey(uid types.UID) (deleted bool, err error)
}

// APISource delivers the pods bound to this node in the apiserver, through an informer.
// Deletions are authoritative: the informer reports a pod deleted only when the apiserver
// said so (a watch DELETED event, or absence from a complete relist), never because a list
// failed.
//
// Every pod it delivers is first written to the offline store, so the agent runs it after a
// reboot with no apiserver. Cached pods the apiserver no longer has are removed only once
// the informer has completed a full list: the list proves the deletion.
type APISource struct {
	Client   kube.Interface
	NodeName string
	Sink     Sink
	Store    PodCache
	Log      *slog.Logger
	// Recorder, if set, gets a Warning event on a pod the state store could not cache (a full
	// state file system): the one place its operator looks.
	Recorder record.EventRecorder
	// OnMirrorDeleted is told when a mirror pod disappears from the apiserver or is being
	// deleted, so that the status side deletes it for good and re-creates it while its static
	// pod runs.
	OnMirrorDeleted func(pod *v1.Pod)
	// OnStatus, if set, is given every pod and mirror pod the informer delivers, for the
	// status the apiserver has: the base of the next status patch (status.Manager.Observed).
	OnStatus func(pod *v1.Pod)
	// Orphans, if set, finds the node's mirror pods whose static pod does not run here (a
	// manifest removed while the agent or the apiserver was away) and hands each to
	// DeleteOrphan, once AllReady says every source has delivered its pods: as the kubelet
	// deletes orphaned mirror pods in its cleanups.
	Orphans *OrphanedMirrors

	synced  cache.InformerSynced
	indexer cache.Indexer

	mu sync.Mutex // protects uncached, delivered
	// delivered holds the pods handed to the sink and not removed since (restored or from the
	// informer): the reconcile after a full list removes those the list lacks, whether or not
	// the store still has their record (a record lost or quarantined while the pod ran).
	delivered map[types.UID]bool
	// uncached holds the pods the store failed to cache (a full state file system), cached
	// again every cacheRetry: a pod whose spec never changes would otherwise stay uncached.
	uncached map[types.UID]bool
}

// cacheRetry is how often caching the pods the store failed to cache is tried again.
const cacheRetry = 30 * time.Second

// Restore delivers the pods cached by earlier runs, before the apiserver is contacted: the
// boot path of an offline gateway. Records that cannot be decoded are reported and skipped.
func (s *APISource) Restore() int {
	recs, bad, err := s.Store.LoadPods()
	if err != nil {
		s.Log.Error("load cached pods", "err", err)
		return 0
	}
	for key, err := range bad {
		if errors.Is(err, offline.ErrKeyMismatch) {
			s.Log.Warn("cached pod record sealed with another state key (was the key or the TPM replaced?); the pod waits for the apiserver", "uid", key, "err", err)
			continue
		}
		s.Log.Error("cached pod record unreadable; quarantined", "key", key, "err", err)
	}
	n := 0
	for _, rec := range recs {
		if rec.Source != offline.SourceAPI || rec.Pod == nil {
			continue
		}
		s.markDelivered(rec.UID, true)
		s.Sink.Update(rec.Pod)
		n++
	}
	return n
}

// Ready reports whether the source's handler has been handed every pod of the informer's
// first complete list: not the informer's own HasSynced, which holds as soon as the list is in
// its store, before the handler has delivered it (client-go: it "doesn't tell you if an
// individual handler is synced"). Ready too early, the pods manager would take the running
// containers of pods not delivered yet for orphans.
func (s *APISource) Ready() bool { return s.synced != nil && s.synced() }

// Start registers the informer; Run runs it. They are split so that Ready can be asked
// before Run is scheduled.
func (s *APISource) Start() *kube.Informer {
	inf := kube.NewInformer(s.Client.CoreV1().Pods(metav1.NamespaceAll), s.Client, &v1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.NodeName).String()
	})
	reg, err := inf.AddEventHandler(s.handler())
	s.synced = func() bool { return false }
	if err != nil {
		// Only for an informer already stopped, which a new one is not; never ready
		// is the safe side: no container is taken for an orphan.
		s.Log.Error("register the pod source's handler", "err", err)
	} else {
		s.synced = reg.HasSynced
	}
	s.indexer = inf.GetIndexer()
	return inf
}

// handler merges the informer's events by pod UID, as the kubelet merges its sources.
func (s *APISource) handler() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: s.update,
		UpdateFunc: func(oldObj, obj any) {
			// The informer keys pods by namespace/name. A pod deleted and created again under
			// its name while the watch was away (a StatefulSet's pod, a bare pod re-applied;
			// offline past the compaction window, the relist after a 410) comes back as an
			// update of the old object into the new one: the old UID is gone from the API.
			// Delivered as an update of the new pod alone, the old one kept running beside it,
			// counted in admission, and its record revived it at an offline reboot.
			old, ok1 := oldObj.(*v1.Pod)
			pod, ok2 := obj.(*v1.Pod)
			if ok1 && ok2 && old.UID != pod.UID {
				s.deleted(old, "pod deleted in the API and another created under its name")
			}
			s.update(obj)
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				s.deleted(pod, "pod deleted in the API")
			}
		},
	}
}

// deleted hands over a pod the API no longer has: its record goes, and its worker stops it.
func (s *APISource) deleted(pod *v1.Pod, reason string) {
	if isMirror(pod) {
		if s.OnMirrorDeleted != nil {
			s.OnMirrorDeleted(pod)
		}
		return
	}
	s.forget(pod.UID)
	s.markDelivered(pod.UID, false)
	s.Sink.Remove(pod.UID, reason)
}

func (s *APISource) markDelivered(uid types.UID, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delivered == nil {
		s.delivered = map[types.UID]bool{}
	}
	if on {
		s.delivered[uid] = true
	} else {
		delete(s.delivered, uid)
	}
}

func (s *APISource) update(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if s.OnStatus != nil {
		s.OnStatus(pod)
	}
	if isMirror(pod) {
		// A mirror pod someone deleted gracefully (kubectl delete) would stay Terminating:
		// nothing runs it to report its end. As the kubelet, the node deletes it for good and
		// makes it again while its static pod runs.
		if pod.DeletionTimestamp != nil && s.OnMirrorDeleted != nil {
			s.OnMirrorDeleted(pod)
		}
		return
	}
	if pod.Annotations[manifest.ConfigSourceAnnotation] != manifest.SourceAPI {
		// As the kubelet marks every pod with its source: a pod author's
		// kubernetes.io/config.source: file would make an API pod pass for a static pod
		// (critical: never evicted, admitted under pressure; no status reported). The
		// informer's object is shared, so a copy is marked.
		pod = pod.DeepCopy()
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[manifest.ConfigSourceAnnotation] = manifest.SourceAPI
	}
	s.cache(pod)
	s.markDelivered(pod.UID, true)
	s.Sink.Update(pod)
}

// cache writes the pod to the store. A pod the store cannot take still runs: losing the cache
// entry only matters after a reboot while offline. It is said in the pod's events and tried
// again until it is cached.
func (s *APISource) cache(pod *v1.Pod) {
	err := s.Store.PutPod(offline.SourceAPI, forCache(pod))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if s.uncached[pod.UID] {
			delete(s.uncached, pod.UID)
			s.Log.Info("pod cached after all", "pod", pod.Namespace+"/"+pod.Name)
		}
		return
	}
	if s.uncached == nil {
		s.uncached = map[types.UID]bool{}
	}
	if !s.uncached[pod.UID] {
		s.uncached[pod.UID] = true
		s.Log.Error("cache pod; it will not survive a reboot without the apiserver until it is cached", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		if s.Recorder != nil {
			s.Recorder.Eventf(pod, v1.EventTypeWarning, ReasonNotCached,
				"the pod runs, but the node could not cache it for offline restarts (a reboot without the apiserver will not start it until it is): %v", err)
		}
	}
}

// retryUncached caches again the pods the store failed to cache, as the informer has them now.
func (s *APISource) retryUncached() {
	s.mu.Lock()
	uids := make([]types.UID, 0, len(s.uncached))
	for uid := range s.uncached {
		uids = append(uids, uid)
	}
	s.mu.Unlock()
	for _, uid := range uids {
		pod := s.byUID(uid)
		if pod == nil {
			s.mu.Lock()
			delete(s.uncached, uid) // gone from the apiserver meanwhile
			s.mu.Unlock()
			continue
		}
		s.cache(pod)
	}
}

// byUID is the informer's pod with the UID, nil if it has none.
func (s *APISource) byUID(uid types.UID) *v1.Pod {
	for _, obj := range s.indexer.List() {
		if p, ok := obj.(*v1.Pod); ok && p.UID == uid {
			return p
		}
	}
	return nil
}

func (s *APISource) forget(uid types.UID) {
	s.mu.Lock()
	delete(s.uncached, uid)
	s.mu.Unlock()
	if err := s.Store.DeletePod(uid); err != nil && !errors.Is(err, offline.ErrNotFound) {
		s.Log.Error("remove cached pod", "uid", uid, "err", err)
	}
}

// forCache strips bookkeeping that changes on every write (managedFields, resourceVersion),
// so that only a change of the pod's spec or metadata costs a flash write. The store keeps no
// status in the record either: the apiserver's echo of each status the node patched would
// rewrite the whole pod. What an offline reboot needs of the status (startTime, condition
// transition times, the reason of a pod that finished) is the latest the node computed, which
// the store's outbox keeps and gives back with the record.
func forCache(pod *v1.Pod) *v1.Pod {
	c := pod.DeepCopy()
	c.ManagedFields = nil
	c.ResourceVersion = ""
	return c
}

// reconcileCache removes the cached pods that a complete list from the apiserver does not
// have: they were deleted while the node was away.
func (s *APISource) reconcileCache() {
	recs, bad, err := s.Store.LoadPods()
	if err != nil {
		s.Log.Error("load cached pods", "err", err)
		return
	}
	// The pods delivered, taken before the informer's pods: the indexer has a pod before
	// its handler delivers it, so a pod delivered meanwhile is in both (taken after, a pod
	// created just after the list would be taken for one the list lacks).
	s.mu.Lock()
	delivered := make([]types.UID, 0, len(s.delivered))
	for uid := range s.delivered {
		delivered = append(delivered, uid)
	}
	s.mu.Unlock()
	present := map[types.UID]bool{}
	for _, obj := range s.indexer.List() {
		if pod, ok := obj.(*v1.Pod); ok {
			present[pod.UID] = true
		}
	}
	// What to stop: the pods of the records (delivered at a restore, or not delivered yet),
	// and the pods delivered whose record is gone (lost, or quarantined while they ran): no
	// record says they are here, but they run, and the list proves them deleted.
	gone := map[types.UID]string{}
	for _, rec := range recs {
		if rec.Source == offline.SourceAPI && !present[rec.UID] {
			gone[rec.UID] = "?"
			if rec.Pod != nil {
				gone[rec.UID] = rec.Pod.Namespace + "/" + rec.Pod.Name
			}
		}
	}
	for _, uid := range delivered {
		if _, ok := gone[uid]; !ok && !present[uid] {
			gone[uid] = "(record lost)"
		}
	}
	for uid, name := range gone {
		s.Log.Info("cached pod is gone from the apiserver; stopping it", "pod", name, "uid", uid)
		s.forget(uid)
		s.markDelivered(uid, false)
		s.Sink.Remove(uid, "pod was deleted in the API while the node was disconnected")
	}
	// Records sealed with another state key were never restored, so no worker will delete
	// them: those the list does not have are deleted here, or they would stay for good. A
	// record the list has was written again, sealed with this key, when its pod came; one a
	// static pod's worker wrote again meanwhile is no longer sealed with another key, which
	// the store checks in the deleting transaction.
	for key, err := range bad {
		uid := types.UID(key)
		if !errors.Is(err, offline.ErrKeyMismatch) || present[uid] {
			continue
		}
		deleted, err := s.Store.DeletePodSealedWithAnotherKey(uid)
		if err != nil {
			s.Log.Warn("delete a cached pod record sealed with another state key", "uid", uid, "err", err)
			continue
		}
		if deleted {
			s.Log.Info("cached pod record sealed with another state key deleted: the apiserver no longer has the pod", "uid", uid)
		}
	}
}

// Run runs the informer until ctx ends.
func (s *APISource) Run(ctx context.Context, inf *kube.Informer) error {
	inf.Start(ctx.Done())
	start := time.Now()
	if cache.WaitForCacheSync(ctx.Done(), s.synced) {
		s.Log.Info("apiserver pod source synced", "after", time.Since(start).Round(time.Millisecond))
		s.reconcileCache()
		s.deleteOrphanedMirrors(ctx)
	}
	retry := time.NewTicker(cacheRetry)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			inf.Shutdown()
			return nil
		case <-retry.C:
			s.retryUncached()
			s.deleteOrphanedMirrors(ctx)
		}
	}
}

// OrphanedMirrors says which mirror pods have lost their static pod, and deletes them.
type OrphanedMirrors struct {
	// AllReady reports whether every source has delivered its pods: before, a static pod
	// not delivered yet would look gone.
	AllReady func() bool
	// StaticPodRuns reports whether a static pod of that namespace and name runs here.
	StaticPodRuns func(namespace, name string) bool
	// DeleteOrphan deletes a mirror pod, if it is still that one (its UID).
	DeleteOrphan func(ctx context.Context, mirror *v1.Pod) error
}

// deleteOrphanedMirrors deletes the mirror pods of the informer's view whose static pod does
// not run here.
func (s *APISource) deleteOrphanedMirrors(ctx context.Context) {
	o := s.Orphans
	if o == nil || s.indexer == nil || !o.AllReady() {
		return
	}
	for _, obj := range s.indexer.List() {
		pod, ok := obj.(*v1.Pod)
		if !ok || !isMirror(pod) || o.StaticPodRuns(pod.Namespace, pod.Name) {
			continue
		}
		if err := o.DeleteOrphan(ctx, pod); err != nil {
			s.Log.Warn("delete orphaned mirror pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			continue
		}
		s.Log.Info("orphaned mirror pod deleted: its static pod does not run here", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
	}
}

// isMirror: mirror pods are this agent's reflection of its static pods, not pods to run.
func isMirror(pod *v1.Pod) bool {
	_, ok := pod.Annotations[manifest.MirrorAnnotation]
	return ok
}
