package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/holdfast-dev/holdfast/agent/runtime"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

func step(name, script string) v1.Container {
	return v1.Container{Name: name, Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", script}}
}

// TestInitContainersAndSidecar: init containers run in order, each to success, before the app
// containers; a failing one is retried (restartCount, lastState) and the pod stays Pending
// meanwhile; a sidecar (restartPolicy Always) starts before the next init container and keeps
// running beside the app.
func TestInitContainersAndSidecar(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	always := v1.ContainerRestartPolicyAlways
	// "first" fails with exit 7 until a deadline a few seconds away, then succeeds.
	deadline := time.Now().Add(4 * time.Second).Unix()
	pod := sleeperPod("ordered", true)
	sidecar := step("sidecar", "exec sleep 3600")
	sidecar.RestartPolicy = &always
	pod.Spec.InitContainers = []v1.Container{
		step("first", fmt.Sprintf("[ $(date +%%s) -ge %d ] || exit 7", deadline)),
		sidecar,
		step("second", "true"),
	}
	pod.Spec.Containers[0] = step("app", "exec sleep 3600")
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pending while the first init container fails", func() error {
		p, err := pods.Get(ctx, "ordered", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.InitContainerStatuses) != 3 {
			return fmt.Errorf("init statuses %d", len(p.Status.InitContainerStatuses))
		}
		first := p.Status.InitContainerStatuses[0]
		last := first.LastTerminationState.Terminated
		if first.State.Terminated != nil && first.State.Terminated.ExitCode == 7 {
			last = first.State.Terminated
		}
		if last == nil || last.ExitCode != 7 {
			return fmt.Errorf("first: %+v", first)
		}
		if p.Status.Phase != v1.PodPending || hasCondition(p.Status, v1.PodInitialized, v1.ConditionTrue) {
			return fmt.Errorf("phase %s conditions %+v", p.Status.Phase, p.Status.Conditions)
		}
		if w := p.Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
			return fmt.Errorf("app waiting %+v", w)
		}
		return nil
	})
	var p *v1.Pod
	testenv.Eventually(t, 60*time.Second, "initialized and running", func() (err error) {
		if p, err = pods.Get(ctx, "ordered", metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || !hasCondition(p.Status, v1.PodInitialized, v1.ConditionTrue) || !hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
			return fmt.Errorf("phase %s conditions %+v", p.Status.Phase, p.Status.Conditions)
		}
		return nil
	})
	ics := map[string]v1.ContainerStatus{}
	for _, cs := range p.Status.InitContainerStatuses {
		ics[cs.Name] = cs
	}
	first, side, second, app := ics["first"], ics["sidecar"], ics["second"], p.Status.ContainerStatuses[0]
	if first.State.Terminated == nil || first.State.Terminated.ExitCode != 0 || first.RestartCount < 1 {
		t.Errorf("first: want a success after at least one retry, got %+v restarts %d", first.State, first.RestartCount)
	}
	if side.State.Running == nil || !side.Ready {
		t.Errorf("sidecar not running beside the app: %+v", side.State)
	}
	if second.State.Terminated == nil || second.State.Terminated.ExitCode != 0 {
		t.Fatalf("second: %+v", second.State)
	}
	// Order, from the runtime's own timestamps (second resolution in the API).
	order := []struct {
		name   string
		before time.Time
		after  time.Time
	}{
		{"first finished before the sidecar started", first.State.Terminated.FinishedAt.Time, side.State.Running.StartedAt.Time},
		{"sidecar started before second", side.State.Running.StartedAt.Time, second.State.Terminated.StartedAt.Time},
		{"second finished before the app started", second.State.Terminated.FinishedAt.Time, app.State.Running.StartedAt.Time},
	}
	for _, o := range order {
		if o.after.Before(o.before) {
			t.Errorf("%s: %s vs %s", o.name, o.before, o.after)
		}
	}
}

// TestCrashLoopBackOff: a container that keeps failing is restarted with a growing back-off,
// shown as CrashLoopBackOff with kubelet's message, its lastState keeping the exit.
func TestCrashLoopBackOff(t *testing.T) {
	e := startEnv(t, true, quickBackoff) // back-off 1s doubling to 2s
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := sleeperPod("crasher", true)
	pod.Spec.Containers[0] = step("main", "exit 42")
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sawBackOff := false
	testenv.Eventually(t, 90*time.Second, "crash loop with back-off", func() error {
		p, err := pods.Get(ctx, "crasher", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status yet (%v)", err)
		}
		cs := p.Status.ContainerStatuses[0]
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			if !strings.HasPrefix(w.Message, "back-off ") || !strings.Contains(w.Message, "restarting failed container=main pod=crasher_default(") {
				return fmt.Errorf("message %q", w.Message)
			}
			if cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 42 {
				return fmt.Errorf("lastState %+v", cs.LastTerminationState)
			}
			sawBackOff = true
		}
		if !sawBackOff || cs.RestartCount < 3 {
			return fmt.Errorf("restartCount %d, back-off seen %v", cs.RestartCount, sawBackOff)
		}
		if p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("a crash-looping pod with restartPolicy Always is Running, got %s", p.Status.Phase)
		}
		return nil
	})
}

// TestLifecycleHooks: postStart runs after the container starts (exec) and preStop runs
// before SIGTERM on deletion (httpGet to the pod's own server and exec), within the grace
// period; a failing postStart kills the container, which is restarted.
func TestLifecycleHooks(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := sleeperPod("hooked", true)
	pod.Spec.TerminationGracePeriodSeconds = int64p(10)
	// The server logs every request (httpd -v) so the preStop GET shows in its log; the exec
	// hooks write where the test can see them through the server's document root.
	pod.Spec.Containers[0] = step("web", "mkdir -p /www && exec httpd -f -v -p 127.0.0.1:18080 -h /www")
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{
		PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sh", "-c", "echo started > /www/poststart; echo bye > /www/prestop-called"}}},
		PreStop:   &v1.LifecycleHandler{HTTPGet: &v1.HTTPGetAction{Path: "/prestop-called", Port: intstrFrom(18080), Host: "127.0.0.1"}},
	}
	failing := sleeperPod("badhook", true)
	failing.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sh", "-c", "exit 3"}}}}
	for _, p := range []*v1.Pod{pod, failing} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, "hooked")["hooked"]
	id := strings.TrimPrefix(containerIDOf(running), "containerd://")
	testenv.Eventually(t, 30*time.Second, "postStart ran inside the container", func() error {
		res, err := e.exec(id, "cat", "/www/poststart")
		if err != nil || !strings.Contains(res, "started") {
			return fmt.Errorf("%q %v", res, err)
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "failing postStart restarts its container", func() error {
		p, err := pods.Get(ctx, "badhook", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("no status (%v)", err)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc < 1 {
			return fmt.Errorf("restartCount %d", rc)
		}
		return nil
	})
	if err := pods.Delete(ctx, "hooked", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "preStop GET reached the server before it stopped", func() error {
		// httpd -v logs one line per request; nothing but the preStop hook calls it, and the
		// 200 says it asked for the path the postStart hook created.
		if !strings.Contains(e.podLog(t, running, "web"), "response:200") {
			return fmt.Errorf("server log: %q", e.podLog(t, running, "web"))
		}
		return nil
	})
}

func intstrFrom(port int) intstr.IntOrString { return intstr.FromInt32(int32(port)) }

// exec runs a command in a running container through holdfast's own runtime package.
func (e *env) exec(containerID string, cmd ...string) (string, error) {
	ctx := context.Background()
	rt, err := runtime.Connect(ctx, e.cd.Address, "holdfast", slog.New(slog.DiscardHandler))
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
