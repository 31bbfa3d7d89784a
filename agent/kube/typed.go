package kube

// A typed client of one resource: the methods of client-go's gentype.Client (k8s.io/client-go
// v0.37.2, gentype/type.go, Apache License 2.0, the Kubernetes Authors) that Interface has,
// requests unchanged. gentype itself shares its package with the fakes, whose
// k8s.io/client-go/testing links managedfields, structured-merge-diff and json-iterator
// (about 1 MiB) into a binary that never runs a fake.

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// typedClient makes the requests on one resource (in one namespace, or cluster-scoped with
// ""), T its objects, L their list. Protobuf is preferred, as client-go's generated clients
// of the built-in kinds do.
type typedClient[T object, L runtime.Object] struct {
	client    rest.Interface
	resource  string
	namespace string
	newObject func() T
	newList   func() L // nil for a kind that has no list (reviews)
}

// object is an API object: a kind with a name.
type object interface {
	runtime.Object
	GetName() string
}

func newTypedClient[T object, L runtime.Object](client rest.Interface, resource, namespace string, newObject func() T, newList func() L) *typedClient[T, L] {
	return &typedClient[T, L]{client: client, resource: resource, namespace: namespace, newObject: newObject, newList: newList}
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds != nil {
		return time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return 0
}

// Get reads the object named name.
func (c *typedClient[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	result := c.newObject()
	err := c.client.Get().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).Name(name).
		VersionedParams(&opts, parameterCodec).
		Do(ctx).Into(result)
	return result, err
}

// List lists the objects the options select.
func (c *typedClient[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := c.newList()
	err := c.client.Get().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).
		VersionedParams(&opts, parameterCodec).
		Timeout(timeoutOf(opts)).
		Do(ctx).Into(list)
	return list, err
}

// Watch watches the objects the options select.
func (c *typedClient[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	timeout := timeoutOf(opts)
	opts.Watch = true
	return c.client.Get().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).
		VersionedParams(&opts, parameterCodec).
		Timeout(timeout).
		Watch(ctx)
}

// Create creates obj and returns the server's copy.
func (c *typedClient[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	result := c.newObject()
	err := c.client.Post().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).
		VersionedParams(&opts, parameterCodec).
		Body(obj).
		Do(ctx).Into(result)
	return result, err
}

// Update replaces obj (by its name) and returns the server's copy.
func (c *typedClient[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	result := c.newObject()
	err := c.client.Put().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).Name(obj.GetName()).
		VersionedParams(&opts, parameterCodec).
		Body(obj).
		Do(ctx).Into(result)
	return result, err
}

// Delete deletes the object named name.
func (c *typedClient[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.client.Delete().UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).Name(name).
		Body(&opts).
		Do(ctx).Error()
}

// Patch applies a patch of type pt to the object named name (or to its subresource).
func (c *typedClient[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	result := c.newObject()
	err := c.client.Patch(pt).UseProtobufAsDefault().
		NamespaceIfScoped(c.namespace, c.namespace != "").
		Resource(c.resource).Name(name).SubResource(subresources...).
		VersionedParams(&opts, parameterCodec).
		Body(data).
		Do(ctx).Into(result)
	return result, err
}
