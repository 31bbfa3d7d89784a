// Package kube is how the agent talks to the apiserver, in a form that links only what it
// uses (issue 31).
//
// client-go's clientset (k8s.io/client-go/kubernetes) and every one of its typed clients
// import k8s.io/client-go/kubernetes/scheme, whose init registers all API groups: the code of
// every type of k8s.io/api is then linked, about 20 MiB of a 70 MiB binary, for the five
// groups the agent speaks. Interface is the part of the clientset the agent uses, with the
// same method names and signatures, and Clientset implements it over Scheme, which registers
// those five groups alone, with a generic typed client (typed.go) that makes client-go's
// requests without k8s.io/client-go/gentype, whose package holds the fakes too.
// Tests hand a fake clientset in through kubetest.Wrap.
//
// Informer is one shared informer with the goroutine that runs it, in place of client-go's
// informer factory (k8s.io/client-go/informers), which imports an informer, a lister and a
// typed client of every group.
//
// hack/import-graph.sh check fails when the binary links the clientset again.
package kube
