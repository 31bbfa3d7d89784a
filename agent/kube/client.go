package kube

import (
	"context"
	"fmt"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Scheme knows the API groups the agent speaks, and only those: client-go's
// kubernetes/scheme, which every generated typed client imports, registers all of them and
// so links the code of every type of k8s.io/api.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{
		v1.AddToScheme, coordinationv1.AddToScheme, authenticationv1.AddToScheme,
		authorizationv1.AddToScheme, certificatesv1.AddToScheme,
	} {
		if err := add(Scheme); err != nil {
			panic(err)
		}
	}
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}

// Interface is the part of client-go's kubernetes.Interface the agent uses: the same
// methods, so that a test may hand it a fake clientset through kubetest.Wrap.
type Interface interface {
	CoreV1() CoreV1Interface
	CoordinationV1() CoordinationV1Interface
	AuthenticationV1() AuthenticationV1Interface
	AuthorizationV1() AuthorizationV1Interface
	CertificatesV1() CertificatesV1Interface
}

// CoreV1Interface is the part of the core/v1 group the agent uses.
type CoreV1Interface interface {
	Pods(namespace string) PodInterface
	Nodes() NodeInterface
	Services(namespace string) ServiceInterface
	ConfigMaps(namespace string) ConfigMapInterface
	Secrets(namespace string) SecretInterface
	ServiceAccounts(namespace string) ServiceAccountInterface
	Events(namespace string) EventInterface
}

// ResourceInterface is the verbs of a typed client of T, listed as L (no UpdateStatus: the
// agent writes statuses by patch, and kinds without a status have none).
type ResourceInterface[T runtime.Object, L runtime.Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

type (
	PodInterface       = ResourceInterface[*v1.Pod, *v1.PodList]
	ServiceInterface   = ResourceInterface[*v1.Service, *v1.ServiceList]
	ConfigMapInterface = ResourceInterface[*v1.ConfigMap, *v1.ConfigMapList]
	SecretInterface    = ResourceInterface[*v1.Secret, *v1.SecretList]
	LeaseInterface     = ResourceInterface[*coordinationv1.Lease, *coordinationv1.LeaseList]
	CSRInterface       = ResourceInterface[*certificatesv1.CertificateSigningRequest, *certificatesv1.CertificateSigningRequestList]
)

// NodeInterface is the verbs on Nodes, and PatchStatus.
type NodeInterface interface {
	ResourceInterface[*v1.Node, *v1.NodeList]
	PatchStatus(ctx context.Context, nodeName string, data []byte) (*v1.Node, error)
}

// ServiceAccountInterface is the token request of a service account (projected tokens).
type ServiceAccountInterface interface {
	CreateToken(ctx context.Context, serviceAccountName string, tokenRequest *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error)
}

// EventInterface is what record's event sink needs: events written to their own namespace.
type EventInterface interface {
	CreateWithEventNamespace(event *v1.Event) (*v1.Event, error)
	UpdateWithEventNamespace(event *v1.Event) (*v1.Event, error)
	PatchWithEventNamespace(event *v1.Event, data []byte) (*v1.Event, error)
}

// CoordinationV1Interface is the Leases of coordination.k8s.io/v1.
type CoordinationV1Interface interface {
	Leases(namespace string) LeaseInterface
}

// AuthenticationV1Interface is the TokenReviews of authentication.k8s.io/v1.
type AuthenticationV1Interface interface {
	TokenReviews() TokenReviewInterface
}

// TokenReviewInterface creates token reviews.
type TokenReviewInterface interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// AuthorizationV1Interface is the SubjectAccessReviews of authorization.k8s.io/v1.
type AuthorizationV1Interface interface {
	SubjectAccessReviews() SubjectAccessReviewInterface
}

// SubjectAccessReviewInterface creates subject access reviews.
type SubjectAccessReviewInterface interface {
	Create(ctx context.Context, review *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// CertificatesV1Interface is the CertificateSigningRequests of certificates.k8s.io/v1.
type CertificatesV1Interface interface {
	CertificateSigningRequests() CSRInterface
}

// Clientset is Interface over the apiserver: one REST client per group, sharing an HTTP
// client and a rate limiter, as client-go's Clientset.
type Clientset struct {
	core, coordination, authentication, authorization, certificates *rest.RESTClient
}

// NewForConfig makes a Clientset with an HTTP client of its own made from c.
func NewForConfig(c *rest.Config) (*Clientset, error) {
	httpClient, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, err
	}
	return NewForConfigAndClient(c, httpClient)
}

// NewForConfigAndClient makes a Clientset whose requests go through httpClient, as
// kubernetes.NewForConfigAndClient does.
func NewForConfigAndClient(c *rest.Config, httpClient *http.Client) (*Clientset, error) {
	cfg := *c
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	var cs Clientset
	for _, g := range []struct {
		client  **rest.RESTClient
		gv      schema.GroupVersion
		apiPath string
	}{
		{&cs.core, v1.SchemeGroupVersion, "/api"},
		{&cs.coordination, coordinationv1.SchemeGroupVersion, "/apis"},
		{&cs.authentication, authenticationv1.SchemeGroupVersion, "/apis"},
		{&cs.authorization, authorizationv1.SchemeGroupVersion, "/apis"},
		{&cs.certificates, certificatesv1.SchemeGroupVersion, "/apis"},
	} {
		gcfg := cfg
		gv := g.gv
		gcfg.GroupVersion = &gv
		gcfg.APIPath = g.apiPath
		// JSON and protobuf only: client-go's rest.CodecFactoryForGeneratedClient would add
		// CBOR when the alpha client gate KUBE_FEATURE_ClientsAllowCBOR is set, and so links
		// apimachinery's CBOR serializer and what of fxamacker/cbor only it reaches, 0.07 MiB
		// of the agent (issue 31), for an encoding the agent never asks for.
		gcfg.NegotiatedSerializer = codecs.WithoutConversion()
		if gcfg.UserAgent == "" {
			gcfg.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(&gcfg, httpClient)
		if err != nil {
			return nil, err
		}
		*g.client = rc
	}
	return &cs, nil
}

func (c *Clientset) CoreV1() CoreV1Interface                 { return coreV1{c.core} }
func (c *Clientset) CoordinationV1() CoordinationV1Interface { return coordinationV1{c.coordination} }
func (c *Clientset) AuthenticationV1() AuthenticationV1Interface {
	return authenticationV1{c.authentication}
}
func (c *Clientset) AuthorizationV1() AuthorizationV1Interface {
	return authorizationV1{c.authorization}
}
func (c *Clientset) CertificatesV1() CertificatesV1Interface { return certificatesV1{c.certificates} }

// resource makes the typed client of a kind, E its object and LE its list.
func resource[E, LE any, T interface {
	*E
	object
}, L interface {
	*LE
	runtime.Object
}](client rest.Interface, name, namespace string) *typedClient[T, L] {
	return newTypedClient(client, name, namespace, func() T { return new(E) }, func() L { return new(LE) })
}

type coreV1 struct{ client *rest.RESTClient }

func (c coreV1) Pods(ns string) PodInterface {
	return resource[v1.Pod, v1.PodList](c.client, "pods", ns)
}
func (c coreV1) Nodes() NodeInterface {
	return nodes{resource[v1.Node, v1.NodeList](c.client, "nodes", "")}
}
func (c coreV1) Services(ns string) ServiceInterface {
	return resource[v1.Service, v1.ServiceList](c.client, "services", ns)
}
func (c coreV1) ConfigMaps(ns string) ConfigMapInterface {
	return resource[v1.ConfigMap, v1.ConfigMapList](c.client, "configmaps", ns)
}
func (c coreV1) Secrets(ns string) SecretInterface {
	return resource[v1.Secret, v1.SecretList](c.client, "secrets", ns)
}
func (c coreV1) ServiceAccounts(ns string) ServiceAccountInterface {
	return serviceAccounts{c.client, ns}
}
func (c coreV1) Events(ns string) EventInterface { return events{c.client, ns} }

type nodes struct {
	*typedClient[*v1.Node, *v1.NodeList]
}

// PatchStatus applies a strategic merge patch to the node's status, as client-go's.
func (n nodes) PatchStatus(ctx context.Context, nodeName string, data []byte) (*v1.Node, error) {
	result := &v1.Node{}
	err := n.client.Patch(types.StrategicMergePatchType).
		Resource("nodes").Name(nodeName).SubResource("status").
		Body(data).Do(ctx).Into(result)
	return result, err
}

type serviceAccounts struct {
	client    rest.Interface
	namespace string
}

// CreateToken requests a token of the service account, as client-go's.
func (s serviceAccounts) CreateToken(ctx context.Context, name string, req *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error) {
	result := &authenticationv1.TokenRequest{}
	err := s.client.Post().UseProtobufAsDefault().
		Namespace(s.namespace).Resource("serviceaccounts").Name(name).SubResource("token").
		VersionedParams(&opts, parameterCodec).
		Body(req).Do(ctx).Into(result)
	return result, err
}

type events struct {
	client    rest.Interface
	namespace string
}

func (e events) checkNamespace(verb string, event *v1.Event) error {
	if e.namespace != "" && event.Namespace != e.namespace {
		return fmt.Errorf("can't %s an event with namespace '%v' in namespace '%v'", verb, event.Namespace, e.namespace)
	}
	return nil
}

// CreateWithEventNamespace, UpdateWithEventNamespace and PatchWithEventNamespace write the
// event in its own namespace, as client-go's.
func (e events) CreateWithEventNamespace(event *v1.Event) (*v1.Event, error) {
	if err := e.checkNamespace("create", event); err != nil {
		return nil, err
	}
	result := &v1.Event{}
	err := e.client.Post().NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").Body(event).Do(context.Background()).Into(result)
	return result, err
}

func (e events) UpdateWithEventNamespace(event *v1.Event) (*v1.Event, error) {
	if err := e.checkNamespace("update", event); err != nil {
		return nil, err
	}
	result := &v1.Event{}
	err := e.client.Put().NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").Name(event.Name).Body(event).Do(context.Background()).Into(result)
	return result, err
}

func (e events) PatchWithEventNamespace(event *v1.Event, data []byte) (*v1.Event, error) {
	if err := e.checkNamespace("patch", event); err != nil {
		return nil, err
	}
	result := &v1.Event{}
	err := e.client.Patch(types.StrategicMergePatchType).NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").Name(event.Name).Body(data).Do(context.Background()).Into(result)
	return result, err
}

// EventSink is record.EventSink over an EventInterface, as client-go's EventSinkImpl.
type EventSink struct{ Interface EventInterface }

func (s *EventSink) Create(event *v1.Event) (*v1.Event, error) {
	return s.Interface.CreateWithEventNamespace(event)
}

func (s *EventSink) Update(event *v1.Event) (*v1.Event, error) {
	return s.Interface.UpdateWithEventNamespace(event)
}

func (s *EventSink) Patch(event *v1.Event, data []byte) (*v1.Event, error) {
	return s.Interface.PatchWithEventNamespace(event, data)
}

type coordinationV1 struct{ client *rest.RESTClient }

func (c coordinationV1) Leases(ns string) LeaseInterface {
	return resource[coordinationv1.Lease, coordinationv1.LeaseList](c.client, "leases", ns)
}

type authenticationV1 struct{ client *rest.RESTClient }

func (c authenticationV1) TokenReviews() TokenReviewInterface {
	return newTypedClient[*authenticationv1.TokenReview, runtime.Object](c.client, "tokenreviews", "",
		func() *authenticationv1.TokenReview { return &authenticationv1.TokenReview{} }, nil)
}

type authorizationV1 struct{ client *rest.RESTClient }

func (c authorizationV1) SubjectAccessReviews() SubjectAccessReviewInterface {
	return newTypedClient[*authorizationv1.SubjectAccessReview, runtime.Object](c.client, "subjectaccessreviews", "",
		func() *authorizationv1.SubjectAccessReview { return &authorizationv1.SubjectAccessReview{} }, nil)
}

type certificatesV1 struct{ client *rest.RESTClient }

func (c certificatesV1) CertificateSigningRequests() CSRInterface {
	return resource[certificatesv1.CertificateSigningRequest, certificatesv1.CertificateSigningRequestList](
		c.client, "certificatesigningrequests", "")
}

var _ Interface = (*Clientset)(nil)
