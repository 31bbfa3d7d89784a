// Command kube-apiserver builds the upstream kube-apiserver at the version pinned in go.mod,
// for holdfast's integration tests. It lives in a module of its own so that k8s.io/kubernetes
// and its replace directives never reach holdfast's go.mod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
