// Command kubectl builds the upstream kubectl from k8s.io/kubectl at the version pinned in
// go.mod, for holdfast's node API integration tests: they drive holdfast the way an operator
// does (kubectl logs, exec, attach, port-forward, get --raw) through a real apiserver. It is
// upstream's cmd/kubectl/kubectl.go, in a module of its own so that kubectl's dependencies
// never reach holdfast's go.mod.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error code, as upstream's kubectl does.
		util.CheckErr(err)
	}
}
