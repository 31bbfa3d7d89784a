// Command kubelet builds the upstream kubelet at the version pinned in go.mod, for holdfast's
// side-by-side benchmarks (test/bench/, `make bench`). It lives in a module of its own, like
// hack/tools/kube-apiserver, so that k8s.io/kubernetes and its replace directives never reach
// holdfast's go.mod. hack/build-kubelet.sh builds it; `make test` never does.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream's main
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as upstream's main
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream's main
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
