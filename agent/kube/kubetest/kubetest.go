// Package kubetest gives tests a kube.Interface over one of client-go's clientsets, a fake
// one (k8s.io/client-go/kubernetes/fake) as a rule. It imports k8s.io/client-go/kubernetes,
// which the agent's binary must not link (agent/kube); only tests import it.
package kubetest

import (
	"k8s.io/client-go/kubernetes"

	"github.com/holdfast-dev/holdfast/agent/kube"
)

// Wrap returns c as a kube.Interface. A fake clientset's lack of watch-list support is
// passed on to the informers made with it.
func Wrap(c kubernetes.Interface) kube.Interface { return wrapped{c} }

type wrapped struct{ c kubernetes.Interface }

// IsWatchListSemanticsUnSupported tells client-go's reflector what the wrapped clientset
// says, as the clientset itself would (fakes cannot serve a watch list).
func (w wrapped) IsWatchListSemanticsUnSupported() bool {
	u, ok := w.c.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}

func (w wrapped) CoreV1() kube.CoreV1Interface { return coreV1{w.c} }
func (w wrapped) CoordinationV1() kube.CoordinationV1Interface {
	return coordinationV1{w.c}
}
func (w wrapped) AuthenticationV1() kube.AuthenticationV1Interface {
	return authenticationV1{w.c}
}
func (w wrapped) AuthorizationV1() kube.AuthorizationV1Interface {
	return authorizationV1{w.c}
}
func (w wrapped) CertificatesV1() kube.CertificatesV1Interface {
	return certificatesV1{w.c}
}

type coreV1 struct{ c kubernetes.Interface }

func (w coreV1) Pods(ns string) kube.PodInterface { return w.c.CoreV1().Pods(ns) }
func (w coreV1) Nodes() kube.NodeInterface        { return w.c.CoreV1().Nodes() }
func (w coreV1) Services(ns string) kube.ServiceInterface {
	return w.c.CoreV1().Services(ns)
}
func (w coreV1) ConfigMaps(ns string) kube.ConfigMapInterface {
	return w.c.CoreV1().ConfigMaps(ns)
}
func (w coreV1) Secrets(ns string) kube.SecretInterface { return w.c.CoreV1().Secrets(ns) }
func (w coreV1) ServiceAccounts(ns string) kube.ServiceAccountInterface {
	return w.c.CoreV1().ServiceAccounts(ns)
}
func (w coreV1) Events(ns string) kube.EventInterface { return w.c.CoreV1().Events(ns) }

type coordinationV1 struct{ c kubernetes.Interface }

func (w coordinationV1) Leases(ns string) kube.LeaseInterface {
	return w.c.CoordinationV1().Leases(ns)
}

type authenticationV1 struct{ c kubernetes.Interface }

func (w authenticationV1) TokenReviews() kube.TokenReviewInterface {
	return w.c.AuthenticationV1().TokenReviews()
}

type authorizationV1 struct{ c kubernetes.Interface }

func (w authorizationV1) SubjectAccessReviews() kube.SubjectAccessReviewInterface {
	return w.c.AuthorizationV1().SubjectAccessReviews()
}

type certificatesV1 struct{ c kubernetes.Interface }

func (w certificatesV1) CertificateSigningRequests() kube.CSRInterface {
	return w.c.CertificatesV1().CertificateSigningRequests()
}
