// Command konnectivity-server builds the upstream konnectivity server (apiserver-network-proxy's
// proxy-server) at the version pinned in go.mod, for holdfast's tunnel integration test. Its main
// is upstream's cmd/server/main.go, which is package main and so cannot be imported: the same few
// lines around the importable app and options packages. It lives in a module of its own so that
// the server's dependencies never reach holdfast's go.mod.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"

	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app"
	"sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
	"sigs.k8s.io/apiserver-network-proxy/pkg/util"
)

func main() {
	proxy := &app.Proxy{}
	o := options.NewProxyRunOptions()
	command := app.NewProxyCommand(proxy, o)
	flags := command.Flags()
	flags.AddFlagSet(o.Flags())
	// klog's flags (-v, --logtostderr) on the command line, as upstream's main adds them.
	local := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(local)
	local.VisitAll(func(fl *flag.Flag) {
		fl.Name = util.Normalize(fl.Name)
		flags.AddGoFlag(fl)
	})
	if err := command.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "konnectivity-server: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
}
