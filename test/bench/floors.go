package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	gocni "github.com/containerd/go-cni"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// measureNetworkFloor does n times what a pod's network needs from CNI, with the configuration
// the agents use (cni's directory: the loopback network, then the bridge conflist), loaded as
// holdfast loads it: a fresh network namespace (untimed), CNI ADD (timed), CNI DEL (timed),
// the namespace removed. No agent, no containerd, no record of the setup on disk.
func measureNetworkFloor(t testing.TB, cni *testenv.CNINetwork, n int) (add, del []time.Duration) {
	t.Helper()
	c, err := network.LoadCNI(cni.ConfDir, []string{cni.BinDir})
	if err != nil {
		t.Fatalf("network floor: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	for i := range n {
		id := fmt.Sprintf("netfloor-%d-%d", time.Now().UnixNano(), i)
		path := filepath.Join(dir, id)
		if err := network.CreateNetNS(path); err != nil {
			t.Fatalf("network floor: %v", err)
		}
		start := time.Now()
		if _, err := c.Setup(ctx, id, path); err != nil {
			t.Fatalf("network floor: CNI ADD: %v", errors.Join(err, network.RemoveNetNS(path)))
		}
		add = append(add, time.Since(start))
		start = time.Now()
		if err := c.Remove(ctx, id, path); err != nil {
			t.Fatalf("network floor: CNI DEL: %v", errors.Join(err, network.RemoveNetNS(path)))
		}
		del = append(del, time.Since(start))
		if err := network.RemoveNetNS(path); err != nil {
			t.Fatalf("network floor: %v", err)
		}
	}
	return add, del
}

// bootFloor is what measureBootFloor started: the pod networks it set up, to be torn down.
type bootFloor struct {
	cni      gocni.CNI
	networks map[string]string // netns path -> CNI container ID
	tasks    int
}

// measureBootFloor is the least any agent could do after a reboot to run again the pods whose
// containers are still recorded in containerd's namespace ns: a minimal loop that lists the
// containers, reads their stored OCI specs and, for each pod network namespace the specs name
// (at once, one goroutine each), creates the namespace, runs CNI ADD with the agents'
// configuration and creates and starts the containers' tasks (no logging). It returns the
// wall time from its start until every task was started. It writes nothing else: the volumes
// stay as the reboot left them (a token volume empty, for instance), which an agent must fill
// again. Call it on a freshly started containerd after a reboot, and bootFloor.teardown after.
func measureBootFloor(t testing.TB, cd *testenv.Containerd, cni *testenv.CNINetwork, ns string) (time.Duration, *bootFloor) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	start := time.Now()
	c, err := network.LoadCNI(cni.ConfDir, []string{cni.BinDir})
	if err != nil {
		t.Fatalf("boot floor: %v", err)
	}
	containers, err := cd.Client.Containers(ctx)
	if err != nil {
		t.Fatalf("boot floor: list containers: %v", err)
	}
	pods := map[string][]client.Container{} // netns path ("": the host's) -> its containers
	for _, ctr := range containers {
		spec, err := ctr.Spec(ctx)
		if err != nil {
			t.Fatalf("boot floor: spec of %s: %v", ctr.ID(), err)
		}
		path := ""
		if spec.Linux != nil {
			for _, n := range spec.Linux.Namespaces {
				if n.Type == specs.NetworkNamespace {
					path = n.Path
				}
			}
		}
		pods[path] = append(pods[path], ctr)
	}
	bf := &bootFloor{cni: c, networks: map[string]string{}}
	var mu sync.Mutex // protects bf.networks and bf.tasks
	var wg sync.WaitGroup
	var errs []error
	for path, ctrs := range pods {
		wg.Go(func() {
			err := func() error {
				if path != "" {
					id := "bootfloor-" + ctrs[0].ID()
					if err := network.CreateNetNS(path); err != nil {
						return err
					}
					mu.Lock()
					bf.networks[path] = id
					mu.Unlock()
					if _, err := c.Setup(ctx, id, path); err != nil {
						return fmt.Errorf("CNI ADD for %s: %w", ctrs[0].ID(), err)
					}
				}
				for _, ctr := range ctrs {
					task, err := ctr.NewTask(ctx, cio.NullIO)
					if err != nil {
						return fmt.Errorf("create task %s: %w", ctr.ID(), err)
					}
					if err := task.Start(ctx); err != nil {
						return fmt.Errorf("start task %s: %w", ctr.ID(), err)
					}
					mu.Lock()
					bf.tasks++
					mu.Unlock()
				}
				return nil
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		t.Errorf("boot floor: %v", err)
		if terr := bf.teardown(context.Background()); terr != nil {
			t.Errorf("boot floor: %v", terr)
		}
		t.FailNow()
	}
	return took, bf
}

// teardown runs CNI DEL for every network the floor set up, so that IPAM gets its addresses
// back. The tasks and the namespaces go with the reboot that follows.
func (bf *bootFloor) teardown(ctx context.Context) error {
	var errs []error
	for path, id := range bf.networks {
		if err := bf.cni.Remove(ctx, id, path); err != nil {
			errs = append(errs, fmt.Errorf("CNI DEL of %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
