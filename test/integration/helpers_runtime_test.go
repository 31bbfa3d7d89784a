// Looking into the runtime beside the agent: its containers, sandboxes, tasks and logs, as
// containerd (or the CRI plugin) holds them, to check that what the agent reports is what runs.

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/agent/runtime/cri"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// containers lists holdfast's containers in containerd, by ID: in its namespace, or those
// the CRI plugin made for it (not the sandboxes' pause containers).
func (e *env) containers(t *testing.T) map[string]runtime.Container {
	t.Helper()
	recs, err := e.cd.Client.ContainerService().List(namespaces.WithNamespace(context.Background(), e.namespace()))
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	out := map[string]runtime.Container{}
	for _, r := range recs {
		if e.cd.CRI {
			if r.Labels["io.holdfast.managed"] == "true" && r.Labels["io.cri-containerd.kind"] == "container" {
				out[r.ID] = runtime.Container{ID: r.ID, PodUID: r.Labels[cri.LabelPodUID], Name: r.Labels[cri.LabelContainerName]}
			}
			continue
		}
		out[r.ID] = runtime.Container{ID: r.ID, PodUID: r.Labels[containerd.LabelPodUID], Name: r.Labels[containerd.LabelContainerName]}
	}
	return out
}

// removeContainer removes a container (and its task) from the runtime, as crictl rm or a
// dead-container GC does.
func (e *env) removeContainer(t *testing.T, id string) {
	t.Helper()
	if e.cd.CRI {
		testenv.Crictl(t, "unix://"+e.cd.Address, "rm", "-f", id)
		return
	}
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	c, err := e.cd.Client.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("load container %s: %v", id, err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			t.Fatalf("delete the task of container %s: %v", id, err)
		}
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		t.Fatalf("delete container %s: %v", id, err)
	}
}

// containerOf returns the ID of the pod's container of that name in the runtime: what the
// runtime named it on the CRI backend, holdfast's name for it on the containerd backend.
func (e *env) containerOf(t *testing.T, uid types.UID, name string) (string, bool) {
	t.Helper()
	for id, c := range e.containers(t) {
		if c.PodUID == string(uid) && c.Name == name {
			return id, true
		}
	}
	return "", false
}

// sandboxes lists the IDs of the CRI plugin's sandboxes by pod UID (none on the containerd
// backend, which makes none).
func (e *env) sandboxes(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	if !e.cd.CRI {
		return out
	}
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	cs, err := e.cd.Client.Containers(ctx, `labels."io.cri-containerd.kind"==sandbox`)
	if err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			t.Fatalf("labels of sandbox %s: %v", c.ID(), err)
		}
		uid := labels[cri.LabelPodUID]
		out[uid] = append(out[uid], c.ID())
	}
	return out
}

// podNetNS is the path of the pod's network namespace: holdfast's own, or the CRI plugin's,
// read from the spec of the pod's sandbox container.
func (e *env) podNetNS(t *testing.T, uid types.UID) string {
	t.Helper()
	if !e.cd.CRI {
		return filepath.Join(e.agent.Config.CNI.NetNSDir, "holdfast-"+string(uid))
	}
	ids := e.sandboxes(t)[string(uid)]
	if len(ids) != 1 {
		t.Fatalf("the sandbox of pod %s: %v, want one", uid, ids)
	}
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	c, err := e.cd.Client.LoadContainer(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path != "" {
			return ns.Path
		}
	}
	t.Fatalf("the sandbox of pod %s has no network namespace of its own", uid)
	return ""
}

// exec runs a command in a running container through holdfast's own runtime package.
func (e *env) exec(containerID string, cmd ...string) (string, error) {
	ctx := context.Background()
	var rt interface {
		Exec(context.Context, string, []string, runtime.ExecOptions) (runtime.ExecResult, error)
		Close() error
	}
	var err error
	if e.cd.CRI {
		rt, err = cri.Connect(ctx, cri.Config{Endpoint: e.cd.Address}, slog.New(slog.DiscardHandler))
	} else {
		rt, err = containerd.Connect(ctx, e.cd.Address, "holdfast", slog.New(slog.DiscardHandler))
	}
	if err != nil {
		return "", err
	}
	defer rt.Close()
	res, err := rt.Exec(ctx, containerID, cmd, runtime.ExecOptions{Timeout: 10 * time.Second})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return string(res.Output), fmt.Errorf("exit code %d", res.ExitCode)
	}
	return string(res.Output), nil
}

// taskRunning reports whether the container's task runs in containerd.
func (e *env) taskRunning(t *testing.T, containerID string) bool {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	c, err := e.cd.Client.LoadContainer(ctx, containerID)
	if err != nil {
		return false
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return false
	}
	st, err := task.Status(ctx)
	return err == nil && st.Status == client.Running
}

// taskPid returns the host PID of a running container's process.
func (e *env) taskPid(t *testing.T, containerID string) int {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	c, err := e.cd.Client.LoadContainer(ctx, containerID)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return int(task.Pid())
}

// podLog returns what a container of a pod printed (attempt 0).
func (e *env) podLog(t *testing.T, p *v1.Pod, container string) string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(e.agent.Config.PodLogDir, logs.PodDirName(p.Namespace, p.Name, string(p.UID)), container, "0.log"))
	return string(b)
}

// requireEachCreatedOnce waits for the named pods (one container each) to run in the API and
// checks that nothing ran twice and nothing was lost: each has exactly one container that ran,
// its first attempt, whose task runs, and its status names that container with restartCount 0.
//
// On the CRI backend, one more attempt is allowed per start the agent's death cut off: the
// runtime ends a StartContainer whose client went away and records it as never started
// (StartError), as the kubelet's would be, and the attempt after it is the one that runs,
// counted as a restart. Still each pod has one sandbox and one container that ever ran, and
// every other record left is a start cut off.
func (e *env) requireEachCreatedOnce(t *testing.T, names []string) {
	t.Helper()
	ctx := context.Background()
	running := e.waitAPIRunning(t, names...)
	tasks, err := e.cd.RunningTasks(ctx, e.namespace())
	if err != nil {
		t.Fatal(err)
	}
	records := map[string][]string{} // pod UID -> its container records' IDs
	for id, c := range e.containers(t) {
		records[c.PodUID] = append(records[c.PodUID], id)
	}
	sandboxes := e.sandboxes(t)
	for _, name := range names {
		p := running[name]
		if e.cd.CRI && len(sandboxes[string(p.UID)]) != 1 {
			t.Errorf("%s: %d sandboxes %v, want 1: a sandbox made twice", name, len(sandboxes[string(p.UID)]), sandboxes[string(p.UID)])
		}
		ids := records[string(p.UID)]
		ran, neverStarted := ids, 0
		if e.cd.CRI {
			ran = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return e.startCutOff(t, id) })
			if neverStarted = len(ids) - len(ran); neverStarted > 0 {
				t.Logf("%s: %d start(s) cut off by the agent's death, then the container ran", name, neverStarted)
			}
		}
		if len(ran) != 1 {
			t.Errorf("%s: %d container records %v (%d never started), want 1 that ran: a container created twice%s", name, len(ids), ids, neverStarted, e.runtimeView(t, ids))
			continue
		}
		if _, ok := tasks[ran[0]]; !ok {
			t.Errorf("%s: its container %s does not run", name, ran[0])
		}
		// Restarts: none, or on CRI one per start cut off, which is the attempt of the one that
		// ran (the records of the oldest cut-off attempts are collected, as any attempt's
		// older than the last two).
		restarts := 0
		if e.cd.CRI {
			restarts = e.criStatus(t, ran[0]).Metadata.Attempt
		}
		cs := p.Status.ContainerStatuses
		if len(cs) != 1 || int(cs[0].RestartCount) != restarts || restarts < neverStarted || cs[0].ContainerID != "containerd://"+ran[0] {
			t.Errorf("%s: status %+v, want the one container %s, restarted %d times (by %d starts cut off)%s", name, cs, ran[0], restarts, neverStarted, e.runtimeView(t, ids))
		}
		if p.Status.Phase != v1.PodRunning {
			t.Errorf("%s: phase %s", name, p.Status.Phase)
		}
	}
}

// containerEnvFromLog reads the KEY=VALUE lines a container printed (`env`) from its log file,
// in the CRI format (TIMESTAMP STREAM P|F MESSAGE) or as plain lines.
func containerEnvFromLog(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 && (f[1] == "stdout" || f[1] == "stderr") && (f[2] == "F" || f[2] == "P") {
			line = f[3]
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out, nil
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// containerOutput is what a container printed, read from its CRI-format log file.
func containerOutput(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 {
			out.WriteString(f[3])
			if f[2] == "F" {
				out.WriteString("\n")
			}
		}
	}
	return out.String(), nil
}

// runtimeView is what the CRI runtime says of each container, for a failure's message (nothing
// on the containerd backend).
func (e *env) runtimeView(t *testing.T, ids []string) string {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		if e.cd.CRI {
			st := e.criStatus(t, id)
			fmt.Fprintf(&b, "\n\t%s: %s %s (exit %d, attempt %d): %s", id, st.State, st.Reason, st.ExitCode, st.Metadata.Attempt, st.Message)
		}
	}
	return b.String()
}

// criStatus is the container's status as crictl inspect shows it.
func (e *env) criStatus(t *testing.T, id string) criContainerStatus {
	t.Helper()
	var inspect struct{ Status criContainerStatus }
	if err := json.Unmarshal([]byte(testenv.Crictl(t, "unix://"+e.cd.Address, "inspect", id)), &inspect); err != nil {
		t.Fatalf("crictl inspect %s: %v", id, err)
	}
	return inspect.Status
}

// criContainerStatus is what crictl inspect says of a container.
type criContainerStatus struct {
	State, Reason, Message string
	ExitCode               int
	Metadata               struct{ Attempt int }
}

// startCutOff reports whether the CRI runtime recorded the container's start as failed
// (StartError): the container never ran. The tests that call this run plain sleepers, whose
// starts fail only when the agent's death cuts them off; how the runtime says so depends on
// where the cut fell ("failed to create shim task: context canceled", "failed to start shim:
// ... signal: killed").
func (e *env) startCutOff(t *testing.T, id string) bool {
	t.Helper()
	st := e.criStatus(t, id)
	return st.State == "CONTAINER_EXITED" && st.Reason == "StartError"
}
