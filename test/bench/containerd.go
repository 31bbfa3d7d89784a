package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// floorNamespace is where the floor's containers run, apart from either agent's.
const floorNamespace = "bench-floor"

// measureFloor creates and starts the pods' container n times, one after the other,
// straight through the containerd client (startFloorContainer). Each sample runs from
// NewContainer until Start returned; the container is removed between samples, untimed.
func measureFloor(t testing.TB, cd *testenv.Containerd, n int) []time.Duration {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), floorNamespace)
	image, err := cd.Client.GetImage(ctx, testenv.BusyboxImage)
	if err != nil {
		t.Fatalf("floor: %v", err)
	}
	var out []time.Duration
	for i := range n {
		start := time.Now()
		fc, err := startFloorContainer(ctx, cd, image, fmt.Sprintf("floor-%d-%d", time.Now().UnixNano(), i), cio.NullIO)
		if err != nil {
			t.Fatalf("floor: %v", err)
		}
		out = append(out, time.Since(start))
		if err := fc.remove(ctx); err != nil {
			t.Fatalf("floor: %v", err)
		}
	}
	return out
}

// measureBurstFloor creates and starts the pods' container n times at once (one goroutine
// each, as the burst creates its pods) and returns the wall time until every Start returned.
// The containers are removed afterwards, untimed. With logDir, each container's output goes
// to a log under it through holdfast's container logger (logs.Install done by the caller), a
// process per container as holdfast runs it: the floor of a design with that logger.
func measureBurstFloor(t testing.TB, cd *testenv.Containerd, n int, logDir string) time.Duration {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), floorNamespace)
	image, err := cd.Client.GetImage(ctx, testenv.BusyboxImage)
	if err != nil {
		t.Fatalf("burst floor: %v", err)
	}
	prefix := fmt.Sprintf("burst-floor-%d", time.Now().UnixNano())
	started := make([]*floorContainer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ioc := cio.NullIO
			if logDir != "" {
				if ioc, errs[i] = containerd.TaskIO(filepath.Join(logDir, "bench_"+id+"_uid", "sleep", "0.log"), containerd.Stdio{}); errs[i] != nil {
					return
				}
			}
			started[i], errs[i] = startFloorContainer(ctx, cd, image, id, ioc)
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i, fc := range started {
		if fc != nil {
			wg.Go(func() {
				if err := fc.remove(ctx); err != nil {
					errs[i] = errors.Join(errs[i], err)
				}
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("burst floor: %v", err)
	}
	return took
}

// floorContainer is one of the floor's containers, running.
type floorContainer struct {
	ctr  client.Container
	task client.Task
}

// startFloorContainer creates and starts the pods' container as the floor runs it: busybox
// running `sleep`, a new snapshot, the image's config, a fresh set of namespaces, no
// logging unless ioc says so, no pod network. On error nothing is left behind.
func startFloorContainer(ctx context.Context, cd *testenv.Containerd, image client.Image, id string, ioc cio.Creator) (*floorContainer, error) {
	ctr, err := cd.Client.NewContainer(ctx, id,
		client.WithImage(image),
		client.WithNewSnapshot(id, image),
		client.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs(podCommand...)))
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	fc := &floorContainer{ctr: ctr}
	if fc.task, err = ctr.NewTask(ctx, ioc); err != nil {
		return nil, errors.Join(fmt.Errorf("create task: %w", err), fc.remove(ctx))
	}
	if err := fc.task.Start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("start task: %w", err), fc.remove(ctx))
	}
	return fc, nil
}

// remove kills the container's task, if any, and deletes it with its snapshot.
func (fc *floorContainer) remove(ctx context.Context) error {
	if fc.task != nil {
		if _, err := fc.task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task %s: %w", fc.ctr.ID(), err)
		}
	}
	if err := fc.ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		return fmt.Errorf("delete container %s: %w", fc.ctr.ID(), err)
	}
	return nil
}

// runningTasks maps the ID of every running task in namespace to its pid.
func runningTasks(ctx context.Context, cd *testenv.Containerd, namespace string) (map[string]uint32, error) {
	return cd.RunningTasks(ctx, namespace)
}

// criKindLabel tells, on the CRI plugin's containers, a sandbox's pause container ("sandbox")
// from a pod's container ("container").
const criKindLabel = "io.cri-containerd.kind"

// runningContainerTasks counts the running tasks in namespace that are not the CRI plugin's
// sandboxes: one per pod's container.
func runningContainerTasks(ctx context.Context, cd *testenv.Containerd, namespace string) (int, error) {
	tasks, err := runningTasks(ctx, cd, namespace)
	if err != nil {
		return 0, err
	}
	recs, err := cd.Client.ContainerService().List(namespaces.WithNamespace(ctx, namespace))
	if err != nil {
		return 0, fmt.Errorf("list containers in %s: %w", namespace, err)
	}
	n := len(tasks)
	for _, r := range recs {
		if _, ok := tasks[r.ID]; ok && r.Labels[criKindLabel] == "sandbox" {
			n--
		}
	}
	return n, nil
}

// sandboxNetNS lists the network namespaces of the CRI plugin's sandboxes in namespace (none
// in a namespace without them), from their pause containers' stored specs.
func sandboxNetNS(ctx context.Context, cd *testenv.Containerd, namespace string) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	recs, err := cd.Client.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers in %s: %w", namespace, err)
	}
	var out []string
	for _, r := range recs {
		if r.Labels[criKindLabel] != "sandbox" || r.Spec == nil {
			continue
		}
		var spec specs.Spec
		if err := json.Unmarshal(r.Spec.GetValue(), &spec); err != nil {
			return nil, fmt.Errorf("spec of sandbox %s: %w", r.ID, err)
		}
		if spec.Linux == nil {
			continue
		}
		for _, n := range spec.Linux.Namespaces {
			// A bind mount the plugin made (not a /proc path, not the host's network).
			if n.Type == specs.NetworkNamespace && n.Path != "" && !strings.HasPrefix(n.Path, "/proc/") {
				out = append(out, n.Path)
			}
		}
	}
	return out, nil
}

// removeNetNS does to network namespace bind mounts what a reboot does: unmounted, and the
// files gone. One already gone is not an error.
func removeNetNS(paths []string) error {
	var errs []error
	for _, p := range paths {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitDrained waits until namespace holds no container at all.
func waitDrained(t testing.TB, cd *testenv.Containerd, namespace string, timeout time.Duration) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), namespace)
	deadline := time.Now().Add(timeout)
	for {
		recs, err := cd.Client.ContainerService().List(ctx)
		if err == nil && len(recs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d containers left in namespace %s after %s (err %v)", len(recs), namespace, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNoTasks waits until no task runs in namespace.
func waitNoTasks(t testing.TB, cd *testenv.Containerd, namespace string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		tasks, err := runningTasks(context.Background(), cd, namespace)
		if err == nil && len(tasks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks still running in namespace %s after %s (err %v)", len(tasks), namespace, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restartedTasks counts the tasks of before that no longer run with the same pid in after:
// containers (sandboxes included) that were restarted or recreated. A recreated container
// has a new ID and is counted once, by the one it replaced.
func restartedTasks(before, after map[string]uint32) int {
	n := 0
	for id, pid := range before {
		if after[id] != pid {
			n++
		}
	}
	return n
}

// killLeftovers kills and deletes every task left in namespace, the CRI plugin's sandboxes
// last: their shim serves the pod's other containers too, and goes away with the sandbox.
func killLeftovers(ctx context.Context, cd *testenv.Containerd, namespace string) error {
	ctx = namespaces.WithNamespace(ctx, namespace)
	containers, err := cd.Client.Containers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, sandboxes := range []bool{false, true} {
		for _, c := range containers {
			labels, err := c.Labels(ctx)
			if err != nil || (labels[criKindLabel] == "sandbox") != sandboxes {
				continue
			}
			task, err := c.Task(ctx, nil)
			if err != nil {
				continue // no task
			}
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
			}
		}
	}
	return errors.Join(errs...)
}
