// Command kubemark builds upstream's hollow node (k8s.io/kubernetes/cmd/kubemark) at the
// version pinned in go.mod: a real kubelet with a fake container runtime and cAdvisor, the
// anchor `make fleet` measures hollow holdfast nodes against (test/fleet/, docs/fleet.md). It lives
// in a module of its own, like hack/tools/kubelet, so that k8s.io/kubernetes and its replace
// directives never reach holdfast's go.mod. hack/build-kubemark.sh builds it; `make test`
// never does.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream's main
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as upstream's main
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream's main
	"k8s.io/kubernetes/cmd/kubemark/app"
)

func main() {
	os.Exit(cli.Run(app.NewHollowNodeCommand()))
}
