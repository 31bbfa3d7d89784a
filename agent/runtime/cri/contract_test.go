package cri_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/cri"
	"github.com/holdfast-dev/holdfast/agent/runtime/runtimetest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

var (
	_ runtime.Runtime = (*cri.Runtime)(nil)
	_ runtime.Network = (*cri.Network)(nil)
)

// TestRuntimeContract: the CRI backend, on containerd's CRI plugin, keeps the runtime contract.
func TestRuntimeContract(t *testing.T) {
	testenv.RequireIntegration(t)
	cni := testenv.CNI(t)
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{EnableCRI: true, CNI: cni})
	cd.ImportTestImages(context.Background(), "k8s.io")
	logDir := t.TempDir()
	runtimetest.Run(t, "cri", runtimetest.Backend{
		Connect: func(t *testing.T) (runtimetest.Runtime, runtime.Network) {
			rt, err := cri.Connect(context.Background(), cri.Config{Endpoint: cd.Address, PodLogDir: logDir,
				ClusterDomain: "cluster.local", EventPoll: 200 * time.Millisecond}, slog.New(slog.DiscardHandler))
			rt = runtimetest.Connected(t, rt, err)
			return rt, rt.Network()
		},
		PodLogDir: logDir,
		Reboot:    func() { cd.Stop(); cd.Start() },
		Usage:     func(rt runtimetest.Runtime) eviction.ContainerUsage { return rt.(*cri.Runtime) },
	})
}
