// Package kube holds what the agent's parts share to talk to the apiserver and that
// client-go offers only in a form that links far more than it uses.
//
// Informer is one shared informer with the goroutine that runs it, in place of client-go's
// informer factory: the factory (k8s.io/client-go/informers) imports an informer, a lister and
// a typed client for every API group, about 3 MiB of the binary for the four resources the
// agent watches (issue 31).
package kube
