package kube

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// ListWatcher is what an informer needs of a typed client (a typed client's resource
// interface, such as CoreV1().Pods(namespace), has both methods).
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Informer is a shared index informer and the goroutine that runs it, with the lifecycle of
// client-go's informer factory: Start runs it once, Shutdown waits for it to stop.
type Informer struct {
	cache.SharedIndexInformer

	mu           sync.Mutex // guards started and shuttingDown
	started      bool
	shuttingDown bool
	wg           sync.WaitGroup // the goroutine running the informer
}

// NewInformer makes an informer of obj's type (a *v1.Pod, say) listing and watching through
// lw, each request's options first given to tweak (if not nil), with no resync and a
// namespace index, as the factory makes them. client is the clientset lw comes from: a fake
// clientset says through it that it cannot serve a watch list.
func NewInformer[L runtime.Object](lw ListWatcher[L], client any, obj runtime.Object, tweak func(*metav1.ListOptions)) *Informer {
	opts := func(o metav1.ListOptions) metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return o
	}
	listWatch := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return lw.List(ctx, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return lw.Watch(ctx, opts(o))
		},
	}
	inf := cache.NewSharedIndexInformer(
		cache.ToListWatcherWithWatchListSemantics(listWatch, client), obj, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// Cannot fail: the informer has not started.
	_ = inf.SetTransform(StripManagedFields)
	return &Informer{SharedIndexInformer: inf}
}

// StripManagedFields is the transform of the agent's informers: it drops an object's
// managedFields before the cache stores it and the handlers see it. The apiserver sends them
// with every object (a FieldsV1 tree per field manager, often larger than the rest of the
// metadata); nothing in the agent reads them, and a cache of pods kept them all in the heap.
// The object is the informer's own, fresh from the decoder, so it is changed in place.
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil && a.GetManagedFields() != nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// Start runs the informer until stop is closed, unless it was started before or is shutting
// down.
func (i *Informer) Start(stop <-chan struct{}) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.started || i.shuttingDown {
		return
	}
	i.started = true
	i.wg.Go(func() { i.Run(stop) })
}

// Shutdown waits for the informer started by Start to stop (stop closed); an informer never
// started returns at once and will not start.
func (i *Informer) Shutdown() {
	i.mu.Lock()
	i.shuttingDown = true
	i.mu.Unlock()
	i.wg.Wait()
}
