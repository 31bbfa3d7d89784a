package containerd_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/agent/runtime/runtimetest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

var _ runtime.Runtime = (*containerd.Runtime)(nil)

// TestRuntimeContract: the containerd backend, in holdfast's namespace with holdfast's CNI,
// keeps the runtime contract.
func TestRuntimeContract(t *testing.T) {
	testenv.RequireIntegration(t)
	cni := testenv.CNI(t)
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	cd.ImportTestImages(context.Background(), "holdfast")
	dir := t.TempDir()
	runtimetest.Run(t, "containerd", runtimetest.Backend{
		Connect: func(t *testing.T) (runtimetest.Runtime, runtime.Network) {
			rt, err := containerd.Connect(context.Background(), cd.Address, "holdfast", slog.New(slog.DiscardHandler))
			return runtimetest.Connected(t, rt, err), network.NewManager(cni.ConfDir, []string{cni.BinDir}, filepath.Join(dir, "netns"), dir)
		},
		PodLogDir: filepath.Join(dir, "pods"),
		Reboot:    func() { cd.Stop(); cd.Start() },
		Usage: func(runtimetest.Runtime) eviction.ContainerUsage {
			return eviction.CgroupUsage{Cgroups: cgroups.Host()}
		},
	})
}
