package volumes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/offline"
)

// ErrNoAPIServer: the agent runs standalone, so ConfigMaps, Secrets and service account tokens
// cannot be had.
var ErrNoAPIServer = errors.New("holdfast runs without an apiserver (standalone): pods may use emptyDir, hostPath and downwardAPI volumes only")

// ErrStaticPod: static pods may not reference API objects, as NodeRestriction requires of the
// mirror pods that represent them.
var ErrStaticPod = errors.New("static pods may not reference ConfigMaps, Secrets or service account tokens (NodeRestriction); use emptyDir, hostPath or downwardAPI volumes")

// syncWait bounds how long a lookup waits for a new watch's first list before asking the
// apiserver directly (a var for tests). A watch whose list already failed is not waited for.
var syncWait = 3 * time.Second

// apiTimeout bounds one request to the apiserver, so that an uplink that drops packets does not
// hold a pod's sync.
const apiTimeout = 10 * time.Second

// apiRetryInterval is how long after a request found the apiserver unreachable the same
// request is not tried again: while offline, every pod sync would otherwise wait apiTimeout
// for each object it references.
const apiRetryInterval = 30 * time.Second

// keptCopyWait bounds how long a lookup that has a kept copy to fall back on waits for the
// apiserver, its watch's first list and a direct request together (a var for tests). Without
// it, an offline boot behind anything that accepts connections and closes them (a load
// balancer, a tunnel, a relay) waited syncWait for each new watch and then apiTimeout for the
// request, which client-go retries on every EOF: 22 s of a 27 s boot of 30 pods. The copy is
// refreshed by the watch and the resync once the apiserver answers.
var keptCopyWait = 2 * time.Second

type objectKind string

const (
	kindConfigMap objectKind = "configmap"
	kindSecret    objectKind = "secret"
)

// objectKey names one ConfigMap or Secret.
type objectKey struct {
	kind      objectKind
	namespace string
	name      string
}

func (k objectKey) String() string { return string(k.kind) + " " + k.namespace + "/" + k.name }

// notFound is the error kubelet reports for a missing object (`secret "x" not found`);
// apierrors.IsNotFound holds for it.
func (k objectKey) notFound() error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: string(k.kind)}, k.name)
}

// objectWatch follows one object with an informer restricted to its name (metadata.name field
// selector), which is what the Node authorizer lets a node list and watch. Its store keeps the
// last object seen while the apiserver is out of reach.
type objectWatch struct {
	store   cache.Store
	synced  func() bool
	cancel  context.CancelFunc
	started time.Time
	// failed: a list or watch request of this watch failed; a lookup does not wait for its
	// first list then (an offline boot would wait syncWait for every object otherwise).
	failed atomic.Bool
}

// ConfigMap returns the ConfigMap name in pod's namespace, read with the node's identity
// through the shared per-object watch (or directly while the watch has not listed yet). A
// missing ConfigMap is an error for which apierrors.IsNotFound holds, worded as kubelet words it.
func (m *Manager) ConfigMap(ctx context.Context, pod *v1.Pod, name string) (*v1.ConfigMap, error) {
	obj, err := m.object(ctx, pod, objectKey{kindConfigMap, pod.Namespace, name})
	if err != nil {
		return nil, err
	}
	return obj.(*v1.ConfigMap), nil
}

// Secret is ConfigMap for Secrets.
func (m *Manager) Secret(ctx context.Context, pod *v1.Pod, name string) (*v1.Secret, error) {
	obj, err := m.object(ctx, pod, objectKey{kindSecret, pod.Namespace, name})
	if err != nil {
		return nil, err
	}
	return obj.(*v1.Secret), nil
}

// Allocatable returns the node's allocatable resources (resourceFieldRef's default limits), or
// nil when no source was configured.
func (m *Manager) Allocatable() v1.ResourceList {
	if m.opts.Allocatable == nil {
		return nil
	}
	return m.opts.Allocatable()
}

// apiAllowed says whether pod may reference API objects at all, and if not, why.
func (m *Manager) apiAllowed(pod *v1.Pod) error {
	if m.client == nil {
		return ErrNoAPIServer
	}
	if manifest.IsStatic(pod) {
		return ErrStaticPod
	}
	return nil
}

func (m *Manager) object(ctx context.Context, pod *v1.Pod, key objectKey) (runtime.Object, error) {
	if err := m.apiAllowed(pod); err != nil {
		return nil, fmt.Errorf("couldn't get %s: %w", key, err)
	}
	m.mu.Lock()
	w := m.watches[key]
	m.mu.Unlock()
	// The kept copy is read from the Cache at most once per lookup, and only when the watch
	// cannot answer.
	kept := sync.OnceValues(func() (runtime.Object, bool) { return m.recall(key) })
	if w == nil || !w.synced() {
		if copyObj, ok := kept(); ok {
			if m.apiDownRecently() {
				return copyObj, nil // asked again once apiRetryInterval has passed
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, keptCopyWait)
			defer cancel()
		}
	}
	if w != nil && m.waitSynced(ctx, w) {
		item, exists, err := w.store.GetByKey(key.namespace + "/" + key.name)
		if err == nil {
			if !exists {
				return nil, key.notFound()
			}
			return item.(runtime.Object).DeepCopyObject(), nil
		}
	}
	return m.get(ctx, key, kept)
}

// waitSynced reports whether w has listed its object, giving a watch that just started a
// moment to do so. A watch that has never listed for longer (the apiserver is out of reach, or
// has not yet authorized the node for a new pod's objects) is not waited for.
func (m *Manager) waitSynced(ctx context.Context, w *objectWatch) bool {
	if w.synced() {
		return true
	}
	left := syncWait - m.opts.Now().Sub(w.started)
	if left <= 0 || w.failed.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	cache.WaitForCacheSync(ctx.Done(), func() bool { return w.synced() || w.failed.Load() })
	return w.synced()
}

// get reads the object straight from the apiserver, or, when it is out of reach, the copy the
// Cache kept (kept reads it).
func (m *Manager) get(ctx context.Context, key objectKey, kept func() (runtime.Object, bool)) (runtime.Object, error) {
	m.mu.Lock()
	last, failedRecently := m.unreachable[key]
	if failedRecently && m.opts.Now().Sub(last.at) >= apiRetryInterval {
		failedRecently = false
	}
	m.mu.Unlock()
	if failedRecently {
		if cached, ok := kept(); ok {
			return cached, nil
		}
		return nil, last.err
	}

	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	var obj runtime.Object
	var err error
	switch key.kind {
	case kindConfigMap:
		obj, err = m.client.CoreV1().ConfigMaps(key.namespace).Get(ctx, key.name, metav1.GetOptions{})
	case kindSecret:
		obj, err = m.client.CoreV1().Secrets(key.namespace).Get(ctx, key.name, metav1.GetOptions{})
	}
	m.noteAPIResult(key, err)
	if apierrors.IsNotFound(err) {
		m.forget(key)
		return nil, key.notFound()
	}
	if err != nil {
		err = fmt.Errorf("couldn't get %s: %w", key, err)
		if unreachable(err) {
			m.mu.Lock()
			m.unreachable[key] = failure{err: err, at: m.opts.Now()}
			m.mu.Unlock()
			if cached, ok := kept(); ok {
				m.log.Warn("apiserver unreachable; using the copy kept from before", "object", key.String(), "err", err)
				return cached, nil
			}
		}
		return nil, err
	}
	m.remember(obj)
	return obj, nil
}

// noteAPIResult records what a request for key (an objectKey or a tokenKey) learnt about the
// apiserver: the key's own failure is forgotten, and the apiserver as a whole is down, or not.
func (m *Manager) noteAPIResult(key any, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.unreachable, key)
	switch {
	case err == nil || !unreachable(err):
		m.apiDown = failure{}
	default:
		m.apiDown = failure{err: err, at: m.opts.Now()}
	}
}

// apiDownRecently: a request found the apiserver unreachable less than apiRetryInterval ago,
// and none reached it since.
func (m *Manager) apiDownRecently() bool {
	if m.opts.APIDown != nil && m.opts.APIDown() {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.apiDown.at.IsZero() && m.opts.Now().Sub(m.apiDown.at) < apiRetryInterval
}

// failure is a request that found the apiserver unreachable.
type failure struct {
	err error
	at  time.Time
}

// unreachable: the apiserver did not answer (as opposed to answering no).
func unreachable(err error) bool {
	return !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && !apierrors.IsNotFound(err) &&
		!apierrors.IsBadRequest(err) && !apierrors.IsInvalid(err)
}

// Cache keeps the ConfigMaps (and, with Options.PersistSecrets, the Secrets and service account
// tokens) that pods reference across agent restarts and reboots, so that a gateway that boots
// with no apiserver can still project them. Writes of an unchanged object must cost nothing.
// offline.Store satisfies it (encrypting Secrets and tokens with the state key).
type Cache interface {
	PutConfigMap(cm *v1.ConfigMap) error
	GetConfigMap(namespace, name string) (*v1.ConfigMap, error)
	DeleteConfigMap(namespace, name string) error
	PutSecret(s *v1.Secret) error
	GetSecret(namespace, name string) (*v1.Secret, error)
	DeleteSecret(namespace, name string) error
	PutToken(uid types.UID, name string, t offline.Token) error
	GetToken(uid types.UID, name string) (offline.Token, error)
}

// remember writes an object read from the apiserver to the Cache.
func (m *Manager) remember(obj any) {
	if m.opts.Cache == nil {
		return
	}
	var err error
	switch o := obj.(type) {
	case *v1.ConfigMap:
		c := o.DeepCopy()
		c.ManagedFields = nil // changes with every write; only costs flash
		err = m.opts.Cache.PutConfigMap(c)
	case *v1.Secret:
		if !m.opts.PersistSecrets {
			return
		}
		c := o.DeepCopy()
		c.ManagedFields = nil
		err = m.opts.Cache.PutSecret(c)
	}
	if err != nil {
		m.log.Warn("keep a copy of an object for offline use", "err", err)
	}
}

// forget removes an object the apiserver says is gone from the Cache.
func (m *Manager) forget(key objectKey) {
	if m.opts.Cache == nil {
		return
	}
	var err error
	switch key.kind {
	case kindConfigMap:
		err = m.opts.Cache.DeleteConfigMap(key.namespace, key.name)
	case kindSecret:
		err = m.opts.Cache.DeleteSecret(key.namespace, key.name)
	}
	if err != nil {
		m.log.Warn("drop the offline copy of a deleted object", "object", key.String(), "err", err)
	}
}

// recall returns the Cache's copy of an object, if it has one. A copy that cannot be read (a
// corrupt record, quarantined by the store, or a Secret sealed with another state key) counts
// as missing, and says so.
func (m *Manager) recall(key objectKey) (runtime.Object, bool) {
	if m.opts.Cache == nil {
		return nil, false
	}
	var obj runtime.Object
	var err error
	switch key.kind {
	case kindConfigMap:
		var cm *v1.ConfigMap
		if cm, err = m.opts.Cache.GetConfigMap(key.namespace, key.name); err == nil && cm != nil {
			obj = cm
		}
	case kindSecret:
		if !m.opts.PersistSecrets {
			return nil, false
		}
		var s *v1.Secret
		if s, err = m.opts.Cache.GetSecret(key.namespace, key.name); err == nil && s != nil {
			obj = s
		}
	}
	m.reportUnreadableCopy(key.String(), err)
	return obj, obj != nil
}

// reportUnreadableCopy logs why a kept copy could not be used, unless there was none.
func (m *Manager) reportUnreadableCopy(what string, err error) {
	switch {
	case err == nil, errors.Is(err, offline.ErrNotFound):
	case errors.Is(err, offline.ErrKeyMismatch):
		m.log.Warn("the offline copy was encrypted with another state key (was the key file replaced?); treating it as missing until the apiserver answers",
			"object", what, "err", err)
	default:
		m.log.Warn("the offline copy is unreadable; treating it as missing until the apiserver answers", "object", what, "err", err)
	}
}

// listWatcher is a typed client of one kind of object in one namespace.
type listWatcher[L runtime.Object] interface {
	List(context.Context, metav1.ListOptions) (L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}

// selectedListWatch lists and watches the objects of api that match the field selector.
func selectedListWatch[L runtime.Object](api listWatcher[L], selector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return api.Watch(ctx, o)
		},
	}
}

// startWatchLocked starts following key under ctx (Run's). Each change pokes the resync loop,
// so that files follow the object within about a second.
func (m *Manager) startWatchLocked(ctx context.Context, key objectKey) {
	selector := fields.OneTermEqualSelector("metadata.name", key.name).String()
	var lw *cache.ListWatch
	var objType runtime.Object
	switch key.kind {
	case kindConfigMap:
		objType, lw = &v1.ConfigMap{}, selectedListWatch(m.client.CoreV1().ConfigMaps(key.namespace), selector)
	case kindSecret:
		objType, lw = &v1.Secret{}, selectedListWatch(m.client.CoreV1().Secrets(key.namespace), selector)
	}
	w := &objectWatch{started: m.opts.Now()}
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		if err != nil {
			w.failed.Store(true)
		}
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		wi, err := watchFn(ctx, o)
		if err != nil {
			w.failed.Store(true)
		}
		return wi, err
	}
	store, ctl := cache.NewInformerWithOptions(cache.InformerOptions{
		// The client says whether it speaks watch-list (an apiserver does; fakes do not).
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, m.client),
		ObjectType:    objType,
		Transform:     kube.StripManagedFields,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				m.remember(obj)
				m.poke()
			},
			UpdateFunc: func(_, obj any) {
				m.remember(obj)
				m.poke()
			},
			DeleteFunc: func(any) {
				m.forget(key) // the apiserver says it is gone
				m.poke()
			},
		},
	})
	wctx, cancel := context.WithCancel(ctx)
	w.store, w.synced, w.cancel = store, ctl.HasSynced, cancel
	m.watches[key] = w
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctl.RunWithContext(wctx)
	}()
}

// syncWatchesLocked follows exactly the objects some registered pod references: new references
// start a watch (if Run runs), objects no pod references any more stop being watched.
func (m *Manager) syncWatchesLocked() {
	want := map[objectKey]bool{}
	for _, ps := range m.pods {
		for k := range ps.refs {
			want[k] = true
		}
	}
	for k, w := range m.watches {
		if !want[k] {
			w.cancel()
			delete(m.watches, k)
		}
	}
	if m.runCtx == nil || m.runCtx.Err() != nil {
		return
	}
	for k := range want {
		if _, ok := m.watches[k]; !ok {
			m.startWatchLocked(m.runCtx, k)
		}
	}
}

// references lists the ConfigMaps and Secrets pod refers to, in volumes and in env, so that
// they are watched while the pod lives. Pods that may not reference API objects have none.
func (m *Manager) references(pod *v1.Pod) map[objectKey]bool {
	refs := map[objectKey]bool{}
	if m.apiAllowed(pod) != nil {
		return refs
	}
	add := func(kind objectKind, name string) {
		if name != "" {
			refs[objectKey{kind, pod.Namespace, name}] = true
		}
	}
	for _, vol := range pod.Spec.Volumes {
		switch {
		case vol.ConfigMap != nil:
			add(kindConfigMap, vol.ConfigMap.Name)
		case vol.Secret != nil:
			add(kindSecret, vol.Secret.SecretName)
		case vol.Projected != nil:
			for _, src := range vol.Projected.Sources {
				if src.ConfigMap != nil {
					add(kindConfigMap, src.ConfigMap.Name)
				}
				if src.Secret != nil {
					add(kindSecret, src.Secret.Name)
				}
			}
		}
	}
	visit := func(env []v1.EnvVar, envFrom []v1.EnvFromSource) {
		for _, e := range env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add(kindConfigMap, r.Name)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add(kindSecret, r.Name)
			}
		}
		for _, ef := range envFrom {
			if ef.ConfigMapRef != nil {
				add(kindConfigMap, ef.ConfigMapRef.Name)
			}
			if ef.SecretRef != nil {
				add(kindSecret, ef.SecretRef.Name)
			}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		visit(c.Env, c.EnvFrom)
	}
	for _, c := range pod.Spec.Containers {
		visit(c.Env, c.EnvFrom)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		visit(c.Env, c.EnvFrom)
	}
	return refs
}
