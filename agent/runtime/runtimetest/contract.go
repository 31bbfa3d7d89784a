// Package runtimetest is the runtime contract (agent/runtime) as a test suite: Run asserts of a
// backend what the pod workers rely on. Each backend's package runs it on a real runtime
// (agent/runtime/containerd, agent/runtime/cri).
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Runtime is what the agent asks of a runtime backend (the agent's containerRuntime): the
// contract, exec, and its version.
type Runtime interface {
	runtime.Runtime
	Exec(ctx context.Context, id string, cmd []string, opts runtime.ExecOptions) (runtime.ExecResult, error)
	ExecStream(ctx context.Context, id string, cmd []string, s runtime.ExecStreams) (int, error)
	Version(ctx context.Context) (string, error)
	Close() error
}

// Backend is one runtime backend on a real runtime of its own, as its package's test opens it.
type Backend struct {
	// Connect makes a new instance, as an agent (re)start does; closed when the test ends
	// (Connected).
	Connect func(t *testing.T) (Runtime, runtime.Network)
	// PodLogDir is where the pods' log directories are.
	PodLogDir string
	// Reboot does to the runtime what a reboot does: every task gone, the records kept.
	Reboot func()
	// Usage measures running containers as the agent does with this backend.
	Usage func(rt Runtime) eviction.ContainerUsage
}

// Connected fails the test on a connection error and closes the runtime when it ends.
func Connected[R interface{ Close() error }](t *testing.T, rt R, err error) R {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func contractPod(uid, name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: name, Namespace: "default"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: testenv.BusyboxImage,
			TerminationMessagePath: v1.TerminationMessagePathDefault}}},
	}
}

// Run asserts of backend be what the pod workers rely on: images per pull policy, a pod's
// network, idempotent creates, states and exits as the kubelet names them, exec, events,
// adoption by a new instance, a reboot, and removal. name names the pod it makes.
func Run(t *testing.T, name string, be Backend) {
	testenv.RequireIntegration(t)
	ctx := context.Background()
	rt, net := be.Connect(t)
	pod := contractPod("contract-"+name, "contract")

	if v, err := rt.Version(ctx); err != nil || !strings.HasPrefix(v, "containerd://") {
		t.Errorf("Version %q, %v", v, err)
	}
	img, err := rt.EnsureImage(ctx, testenv.BusyboxImage, v1.PullIfNotPresent, nil)
	if err != nil || img.Digest == "" || img.Pulled {
		t.Errorf("EnsureImage of a preloaded image: %+v, %v", img, err)
	}
	if _, err := rt.EnsureImage(ctx, "docker.io/holdfast/absent:1", v1.PullNever, nil); !errors.Is(err, runtime.ErrImageNeverPull) {
		t.Errorf("EnsureImage Never of an absent image: %v, want ErrImageNeverPull", err)
	}

	pn, err := net.Setup(ctx, pod)
	if err != nil {
		t.Fatalf("network setup: %v", err)
	}
	if len(pn.IPs) == 0 {
		t.Errorf("pod network without an address: %+v", pn)
	}
	again, err := net.Setup(ctx, pod)
	if err != nil || len(again.IPs) == 0 || again.IPs[0] != pn.IPs[0] {
		t.Errorf("second Setup: %+v, %v; want the same address %v", again, err, pn.IPs)
	}

	config := func(name string, attempt int, cmd ...string) runtime.ContainerConfig {
		return runtime.ContainerConfig{
			PodUID: string(pod.UID), PodName: pod.Name, PodNamespace: pod.Namespace, Name: name, Attempt: attempt,
			SpecHash: "hash-" + name, Image: testenv.BusyboxImage, Command: cmd, Env: []string{"GREETING=hello"},
			NetNSPath: pn.NetNSPath, Hostname: pod.Name,
			LogPath:                filepath.Join(be.PodLogDir, logs.PodDirName(pod.Namespace, pod.Name, string(pod.UID)), name, "0.log"),
			Resources:              runtime.Resources{CPUShares: 2, OOMScoreAdj: 1000},
			TerminationMessagePath: pod.Spec.Containers[0].TerminationMessagePath,
			Pod:                    pod,
		}
	}
	cfg := config("app", 0, "sh", "-c", "echo started; exec sleep 3600")
	cfg.Static = true // read back: the container says it is a static pod's without the state store
	cfg.MemoryRequest = 96 << 20
	id, err := rt.CreateContainer(ctx, cfg)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if again, err := rt.CreateContainer(ctx, cfg); err != nil || again != id {
		t.Errorf("create of the same attempt: %q, %v; want %q", again, err, id)
	}
	c := find(t, rt, pod, id)
	if c.State != runtime.StateCreated || c.Name != "app" || c.Attempt != 0 || c.SpecHash != "hash-app" || c.PodUID != string(pod.UID) ||
		c.PodName != pod.Name || c.PodNamespace != pod.Namespace || !c.Static || c.MemoryRequest == nil || *c.MemoryRequest != 96<<20 {
		t.Errorf("created container %+v", c)
	}
	if err := rt.StartContainer(ctx, id); err != nil {
		t.Fatalf("start: %v", err)
	}
	c = find(t, rt, pod, id)
	if c.State != runtime.StateRunning || c.Pid == 0 || c.StartedAt.IsZero() {
		t.Errorf("started container %+v", c)
	}
	if uid, err := rt.PodOf(ctx, id); err != nil || uid != string(pod.UID) {
		t.Errorf("PodOf: %q, %v", uid, err)
	}

	res, err := rt.Exec(ctx, id, []string{"sh", "-c", "echo $GREETING; exit 3"}, runtime.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || res.ExitCode != 3 || string(res.Output) != "hello\n" {
		t.Errorf("Exec: %+v (%q), %v", res, res.Output, err)
	}
	if _, err := rt.Exec(ctx, id, []string{"sleep", "30"}, runtime.ExecOptions{Timeout: time.Second}); !errors.Is(err, runtime.ErrExecTimeout) {
		t.Errorf("Exec past its timeout: %v, want ErrExecTimeout", err)
	}
	// A cancelled exec (its pod deleted, a grace period shortened) ends with the
	// cancellation, not at its timeout: a preStop hook must not outlast them.
	execCtx, cancelExec := context.WithCancel(ctx)
	cancelLater := time.AfterFunc(time.Second, cancelExec)
	began := time.Now()
	_, err = rt.Exec(execCtx, id, []string{"sleep", "300"}, runtime.ExecOptions{Timeout: 2 * time.Minute})
	cancelLater.Stop()
	cancelExec()
	if !errors.Is(err, context.Canceled) || time.Since(began) >= time.Minute {
		t.Errorf("Exec cancelled after 1s: %v after %s, want context.Canceled long before its 2m timeout", err, time.Since(began).Round(time.Second))
	}
	res, err = rt.Exec(ctx, id, []string{"sh", "-c", "yes | head -c 100000"}, runtime.ExecOptions{OutputLimit: 1000})
	if err != nil || len(res.Output) != 1000 || !res.Truncated {
		t.Errorf("Exec output limit: %d bytes, truncated %v, %v", len(res.Output), res.Truncated, err)
	}
	var out strings.Builder
	code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "echo streamed; exit 4"}, runtime.ExecStreams{Stdout: &out, Stderr: &out})
	if err != nil || code != 4 || out.String() != "streamed\n" {
		t.Errorf("ExecStream: exit %d (%q), %v", code, out.String(), err)
	}

	// Its usage, as the node API's stats and eviction read it: the execs above ran in
	// its cgroups, its shell waits in them. Listed after PodOf, which reads its status
	// with no verbose info: its pid must still be known.
	u, err := be.Usage(rt).Usage(ctx, find(t, rt, pod, id))
	if err != nil || u.CPUUsageNanos == 0 || u.MemoryUsage == 0 || u.MemoryWorkingSet == 0 || u.PIDs == 0 {
		t.Errorf("usage of a running container: %+v, %v", u, err)
	}

	// A container that exits by itself, seen by the event subscription.
	events := make(chan runtime.TaskEvent, 16)
	subCtx, cancelSub := context.WithCancel(ctx)
	subscribed := make(chan struct{})
	subDone := make(chan error, 1)
	go func() {
		subDone <- rt.SubscribeTaskEvents(subCtx, func() { close(subscribed) }, func(ev runtime.TaskEvent) { events <- ev })
	}()
	defer func() { cancelSub(); <-subDone }()
	select {
	case <-subscribed:
	case err := <-subDone:
		t.Fatalf("subscribe: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no subscription")
	}
	done, err := rt.CreateContainer(ctx, config("done", 0, "sh", "-c", "exit 0"))
	if err == nil {
		err = rt.StartContainer(ctx, done)
	}
	if err != nil {
		t.Fatalf("run a container that exits: %v", err)
	}
	waitEvent(t, events, done)
	c = exited(t, ctx, rt, pod, done)
	if c.ExitCode != 0 || c.Reason != runtime.ReasonCompleted || c.FinishedAt.IsZero() {
		t.Errorf("exited by itself: %+v", c)
	}

	// A resize in place: the running container's cgroup changed, its process going on.
	checkResize(t, ctx, rt, find(t, rt, pod, id), done)

	if err := rt.StopContainer(ctx, id, 2*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	c = exited(t, ctx, rt, pod, id)
	if c.ExitCode != 137 && c.ExitCode != 143 || c.Reason != runtime.ReasonError {
		t.Errorf("stopped: %+v", c)
	}
	if err := rt.StopContainer(ctx, id, time.Second); err != nil {
		t.Errorf("stop of a stopped container: %v", err)
	}

	testenv.Eventually(t, 10*time.Second, "the container's output in its log", func() error {
		b, err := os.ReadFile(cfg.LogPath)
		if err != nil || !strings.Contains(string(b), "started") {
			return fmt.Errorf("log %s: %q, %v", cfg.LogPath, b, err)
		}
		return nil
	})

	// A new instance (the agent restarted) finds everything as it was.
	before, err := rt.List(ctx)
	if err != nil || len(before) != 2 {
		t.Fatalf("List: %d containers, %v", len(before), err)
	}
	rt2, net2 := be.Connect(t)
	after, err := rt2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := func(cs []runtime.Container) map[string]runtime.Container {
		m := map[string]runtime.Container{}
		for _, c := range cs {
			c.Pid = 0 // read again or not: not part of what is adopted
			m[c.ID] = c
		}
		return m
	}
	if b, a := byID(before), byID(after); !reflect.DeepEqual(b, a) {
		t.Errorf("a new instance lists\n%+v\nwant\n%+v", a, b)
	}
	if pn2, err := net2.Setup(ctx, pod); err != nil || len(pn2.IPs) == 0 || pn2.IPs[0] != pn.IPs[0] {
		t.Errorf("Setup by a new instance: %+v, %v; want the pod's network %v as it is", pn2, err, pn.IPs)
	}

	// A reboot: the pod's network is made again, the container that ran is reported
	// exited and failed (lost: the kubelet's exit code 255, reason Unknown; or killed,
	// where the runtime saw its process die before it stopped: the test's reboot kills
	// the processes first), nothing runs by itself, and a new attempt starts beside the
	// old ones.
	next, err := rt.CreateContainer(ctx, config("app", 1, "sleep", "3600"))
	if err == nil {
		err = rt.StartContainer(ctx, next)
	}
	if err != nil {
		t.Fatalf("attempt 1 before the reboot: %v", err)
	}
	be.Reboot()
	// The runtime answers once it has recovered its state (the CRI plugin: "server is
	// not initialized yet" until then).
	testenv.Eventually(t, 30*time.Second, "the runtime answering after the reboot", func() error {
		_, err := rt2.ListPod(ctx, string(pod.UID))
		return err
	})
	lost := exited(t, ctx, rt2, pod, next)
	if lost.ExitCode == 0 || lost.Reason == runtime.ReasonCompleted {
		t.Errorf("a container lost in a reboot: %+v, want a failure", lost)
	}
	pn3, err := net2.Setup(ctx, pod)
	if err != nil || len(pn3.IPs) == 0 {
		t.Fatalf("network setup after the reboot: %+v, %v", pn3, err)
	}
	after2, err := rt2.CreateContainer(ctx, config("app", 2, "sleep", "3600"))
	if err == nil {
		err = rt2.StartContainer(ctx, after2)
	}
	if err != nil {
		t.Fatalf("attempt 2 after the reboot: %v", err)
	}
	if c := find(t, rt2, pod, after2); c.State != runtime.StateRunning {
		t.Errorf("attempt 2 after the reboot: %+v", c)
	}
	rt, net = rt2, net2

	// The pod finishes: its network is released, and its exited containers stay, so
	// that its status is still reported until it is deleted.
	if err := rt.StopContainer(ctx, after2, time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := net.Teardown(ctx, string(pod.UID), pod.Namespace, pod.Name); err != nil {
		t.Errorf("teardown of a finished pod: %v", err)
	}
	if pn := net.Get(string(pod.UID)); pn != nil {
		t.Errorf("network of a finished pod after teardown: %+v", pn)
	}
	if cs, err := rt.ListPod(ctx, string(pod.UID)); err != nil || len(cs) != 4 {
		t.Errorf("containers of a finished pod after teardown: %+v, %v; want its 4 containers, exited", cs, err)
	}
	if c := exited(t, ctx, rt, pod, after2); c.FinishedAt.IsZero() {
		t.Errorf("a finished pod's container after teardown: %+v", c)
	}

	for _, cid := range []string{next, after2} {
		if err := rt.RemoveContainer(ctx, cid); err != nil {
			t.Errorf("remove: %v", err)
		}
	}

	for _, cid := range []string{id, done} {
		if err := rt.RemoveContainer(ctx, cid); err != nil {
			t.Errorf("remove: %v", err)
		}
		if err := rt.RemoveContainer(ctx, cid); err != nil {
			t.Errorf("remove of a removed container: %v", err)
		}
	}
	if cs, err := rt.ListPod(ctx, string(pod.UID)); err != nil || len(cs) != 0 {
		t.Errorf("after removal: %+v, %v", cs, err)
	}
	// An event may name a container removed since: PodOf says so with ErrNotFound, which the
	// relist's event handler takes for nothing to do.
	if _, err := rt.PodOf(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("PodOf a removed container: %v, want ErrNotFound", err)
	}
	if err := net.Teardown(ctx, string(pod.UID), pod.Namespace, pod.Name); err != nil {
		t.Errorf("teardown: %v", err)
	}
	if pn := net.Get(string(pod.UID)); pn != nil {
		t.Errorf("network after teardown: %+v", pn)
	}
	if err := net.Teardown(ctx, string(pod.UID), pod.Namespace, pod.Name); err != nil {
		t.Errorf("second teardown: %v", err)
	}
}

// find returns container id of the pod as ListPod has it.
func find(t *testing.T, rt Runtime, pod *v1.Pod, id string) runtime.Container {
	t.Helper()
	cs, err := rt.ListPod(context.Background(), string(pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("container %s not in %+v", id, cs)
	return runtime.Container{}
}

// exited waits for container id to be exited, records its exit as the pod worker does, and
// returns it as listed then.
func exited(t *testing.T, ctx context.Context, rt Runtime, pod *v1.Pod, id string) runtime.Container {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "container "+id+" exited", func() error {
		if c := find(t, rt, pod, id); c.State != runtime.StateExited {
			return fmt.Errorf("state %s", c.State)
		}
		return nil
	})
	if c := find(t, rt, pod, id); !c.Recorded {
		if _, err := rt.RecordExit(ctx, id); err != nil {
			t.Fatalf("record exit: %v", err)
		}
	}
	c := find(t, rt, pod, id)
	if !c.Recorded {
		t.Errorf("exit not recorded: %+v", c)
	}
	return c
}

func waitEvent(t *testing.T, events <-chan runtime.TaskEvent, id string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.ContainerID == id {
				return
			}
		case <-timeout:
			t.Fatalf("no event for the exit of %s", id)
		}
	}
}
