package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
