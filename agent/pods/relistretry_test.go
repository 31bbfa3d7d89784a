package pods_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// downRuntime is a runtime whose List fails, as containerd's while it is down, and counts
// the calls.
type downRuntime struct {
	*hollow.Runtime
	lists atomic.Int64
}

func (r *downRuntime) List(context.Context) ([]runtime.Container, error) {
	r.lists.Add(1)
	return nil, errors.New("connection refused")
}

// With the runtime down and the sources ready, a failed relist is tried again every second,
// not at once: before, each failure's own retry request woke the loop, which took the sources'
// readiness for news and relisted at once, hundreds of times a millisecond (a gateway's CPU
// burnt for as long as containerd is down).
func TestFailedRelistRetriedEverySecond(t *testing.T) {
	rt := &downRuntime{Runtime: hollow.NewRuntime()}
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	mgr := pods.NewManager(pods.Config{
		StateDir: filepath.Join(dir, "state"), PodLogDir: filepath.Join(dir, "logs"), RelistPeriod: time.Minute, NodeName: "gw",
		Volumes:        volumes.NewManager(filepath.Join(dir, "state", "pods"), nil, nil, log, volumes.Options{PlainDirs: true}),
		HostResolvConf: filepath.Join(dir, "resolv.conf"), HostsFile: filepath.Join(dir, "hosts"),
	}, rt, hollow.NewNetwork("gw"), status.NewManager(nil, offline.NewMemStore(nil), "gw", log), nil, log)
	mgr.SetSourcesReady(func() bool { return true })
	mgr.SetStaticSourceReady(func() bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- mgr.Run(ctx) }()
	const window = 2500 * time.Millisecond
	time.Sleep(window) // the retries are on a timer: the window is what is measured
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// One at the start, then one a second: 3 or 4 in 2.5 s; a few more if the manager lists
	// beside the relist at its start.
	if n := rt.lists.Load(); n > 8 {
		t.Errorf("the runtime was listed %d times in %v while it was down; want about one a second", n, window)
	}
}
