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

// The apiserver sends every object with its managedFields (a few hundred bytes to kilobytes
// per object, a FieldsV1 tree per manager); no part of the agent reads them, and a cache of
// thirty pods held them all, live in the heap (issue 31's heap profile of 2026-12-07). The
// informer's cache, and what its handlers get, must not carry them; the rest of the object
// is untouched.
func TestInformerCacheHoldsNoManagedFields(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{
		Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:containers":{}}}`)},
	}}
	client := fake.NewSimpleClientset(&v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "mine", Labels: map[string]string{"app": "x"}, ManagedFields: managed},
		Spec:       v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "c", Image: "i"}}},
	})
	inf := NewInformer(client.CoreV1().Pods(metav1.NamespaceAll), client, &v1.Pod{}, nil)
	var handed atomic.Pointer[v1.Pod] // by the informer's goroutine
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { handed.Store(obj.(*v1.Pod)) },
		UpdateFunc: func(_, obj any) { handed.Store(obj.(*v1.Pod)) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	defer inf.Shutdown()
	defer close(stop)
	inf.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	// An update arrives through the watch, not the list.
	if _, err := client.CoreV1().Pods("a").Update(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "mine", Labels: map[string]string{"app": "y"}, ManagedFields: managed},
		Spec:       v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "c", Image: "i"}}},
	}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		if p := handed.Load(); p != nil && p.Labels["app"] == "y" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	obj, ok, _ := inf.GetStore().GetByKey("a/mine")
	if !ok {
		t.Fatal("informer's store lacks a/mine")
	}
	for what, p := range map[string]*v1.Pod{"cached": obj.(*v1.Pod), "handed to the handler": handed.Load()} {
		if p == nil || p.Labels["app"] != "y" || len(p.Spec.Containers) != 1 {
			t.Fatalf("%s pod: %+v", what, p)
		}
		if p.ManagedFields != nil {
			t.Errorf("%s pod carries managedFields: %+v", what, p.ManagedFields)
		}
	}
}
