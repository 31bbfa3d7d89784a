package kube

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func TestInformerListsWithTheTweakAndShutdownWaits(t *testing.T) {
	client := fake.NewSimpleClientset(
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "mine"}, Spec: v1.PodSpec{NodeName: "gw"}},
	)
	var tweaked atomic.Int32 // by the informer's goroutine
	inf := NewInformer(client.CoreV1().Pods(metav1.NamespaceAll), client, &v1.Pod{}, func(o *metav1.ListOptions) {
		tweaked.Add(1)
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "gw").String()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	inf.Start(stop)
	inf.Start(stop) // a second Start is a no-op
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if _, ok, _ := inf.GetStore().GetByKey("a/mine"); !ok {
		t.Fatalf("informer's store lacks a/mine: %v", inf.GetStore().ListKeys())
	}
	if keys, err := inf.GetIndexer().IndexKeys(cache.NamespaceIndex, "a"); err != nil || len(keys) != 1 {
		t.Fatalf("namespace index of a: %v, %v", keys, err)
	}
	if tweaked.Load() == 0 {
		t.Fatal("the list options were not tweaked")
	}
	close(stop)
	done := make(chan struct{})
	go func() { inf.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Shutdown did not return after stop closed")
	}
}

func TestInformerShutdownBeforeStart(t *testing.T) {
	client := fake.NewSimpleClientset()
	inf := NewInformer(client.CoreV1().Pods(metav1.NamespaceAll), client, &v1.Pod{}, nil)
	inf.Shutdown()
	inf.Start(make(chan struct{})) // never closed: a started informer would outlive the test
	if inf.HasSynced() {
		t.Fatal("an informer shut down before Start ran")
	}
}
