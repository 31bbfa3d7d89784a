// Command kube-controller-manager builds the upstream kube-controller-manager at the version
// pinned in go.mod, for the tests that need a cluster's controllers: the conformance suite
// (namespace deletion, service accounts and their tokens) and TLS bootstrap (CSR approval and
// signing). A module of its own, like hack/tools/kube-apiserver, so that k8s.io/kubernetes and
// its replace directives never reach holdfast's go.mod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
