package cri_test

import (
	"context"
	v1 "k8s.io/api/core/v1"
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
	// The CRI plugin learns of imported images from containerd's events, a moment after the
	// import: a sandbox made before it knows the pause image pulls it (and fails offline).
	probe, err := cri.Connect(context.Background(), cri.Config{Endpoint: cd.Address, PodLogDir: logDir}, slog.New(slog.DiscardHandler))
	probe = runtimetest.Connected(t, probe, err)
	testenv.Eventually(t, 30*time.Second, "the CRI plugin knowing the imported pause image", func() error {
		_, err := probe.EnsureImage(context.Background(), testenv.PauseImage, v1.PullNever, nil)
		return err
	})
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
