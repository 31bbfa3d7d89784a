package sources

import (
	"context"
	"log/slog"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/manifest"
)

// APISource delivers the pods bound to this node in the apiserver, through an informer.
// Deletions are authoritative: the informer reports a pod deleted only when the apiserver
// said so (a watch DELETED event, or absence from a complete relist), never because a list
// failed.
type APISource struct {
	Client   kubernetes.Interface
	NodeName string
	Sink     Sink
	Log      *slog.Logger

	synced cache.InformerSynced
}

// Ready reports whether the informer has delivered the complete list of the node's pods.
func (s *APISource) Ready() bool { return s.synced != nil && s.synced() }

// Start registers the informer; Run runs it. They are split so that Ready can be asked
// before Run is scheduled.
func (s *APISource) Start() informers.SharedInformerFactory {
	factory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.NodeName).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.update(obj) },
		UpdateFunc: func(_, obj any) { s.update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			pod, ok := obj.(*v1.Pod)
			if !ok || isMirror(pod) {
				return
			}
			s.Sink.Remove(pod.UID, "pod deleted in the API")
		},
	})
	s.synced = inf.HasSynced
	return factory
}

func (s *APISource) update(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok || isMirror(pod) {
		return
	}
	s.Sink.Update(pod)
}

// Run runs the informer until ctx ends.
func (s *APISource) Run(ctx context.Context, factory informers.SharedInformerFactory) error {
	factory.Start(ctx.Done())
	start := time.Now()
	if cache.WaitForCacheSync(ctx.Done(), s.synced) {
		s.Log.Info("apiserver pod source synced", "after", time.Since(start).Round(time.Millisecond))
	}
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// isMirror: mirror pods are this agent's reflection of its static pods, not pods to run.
func isMirror(pod *v1.Pod) bool {
	_, ok := pod.Annotations[manifest.MirrorAnnotation]
	return ok
}
