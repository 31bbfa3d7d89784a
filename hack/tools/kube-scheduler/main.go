// Command kube-scheduler builds the upstream kube-scheduler at the version pinned in go.mod, for
// the conformance suite, whose pods are scheduled as in a real cluster. A module of its own, like
// hack/tools/kube-apiserver, so that k8s.io/kubernetes never reaches holdfast's go.mod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
