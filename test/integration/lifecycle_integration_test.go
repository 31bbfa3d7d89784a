package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

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
	// The sidecar is started (its startup probe passes) 3 s after it runs: the containers
	// after it wait for that, as kubelet makes them wait.
	sidecar := step("sidecar", "sleep 3; touch /tmp/started; exec sleep 3600")
	sidecar.RestartPolicy = &always
	sidecar.StartupProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "/tmp/started"}}}, PeriodSeconds: 1, FailureThreshold: 30}
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
	if d := second.State.Terminated.StartedAt.Sub(side.State.Running.StartedAt.Time); d < 2*time.Second {
		t.Errorf("second started %v after the sidecar: it must wait for the sidecar's startup probe (3 s)", d)
	}
}

// TestSidecarsStopLast: a deleted pod stops its app containers first and its sidecars after
// them, the later sidecar first, as kubelet orders termination; so an app container can still
// use its sidecar while it shuts down. Each container records when SIGTERM reached it (the app
// takes 2 s to finish) in a hostPath file that outlives the pod.
func TestSidecarsStopLast(t *testing.T) {
	e := startEnv(t, true, nil)
	publishRootCA(t, e, "default")
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	always := v1.ContainerRestartPolicyAlways
	report := t.TempDir()
	dirOrCreate := v1.HostPathDirectoryOrCreate
	onTerm := func(name, cleanup string) v1.Container {
		c := step(name, fmt.Sprintf(`trap '%s echo %s >> /report/order; exit 0' TERM; while true; do sleep 0.2; done`, cleanup, name))
		c.VolumeMounts = []v1.VolumeMount{{Name: "report", MountPath: "/report"}}
		return c
	}
	proxy, logs := onTerm("proxy", ""), onTerm("logs", "")
	proxy.RestartPolicy, logs.RestartPolicy = &always, &always
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sidecars"}, Spec: v1.PodSpec{
		NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](20),
		InitContainers: []v1.Container{proxy, logs},
		Containers:     []v1.Container{onTerm("app", "sleep 2;")},
		Volumes: []v1.Volume{{Name: "report", VolumeSource: v1.VolumeSource{
			HostPath: &v1.HostPathVolumeSource{Path: report, Type: &dirOrCreate}}}},
	}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "sidecars")
	if err := pods.Delete(ctx, "sidecars", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone(t, "sidecars")
	b, err := os.ReadFile(filepath.Join(report, "order"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); !slices.Equal(got, []string{"app", "logs", "proxy"}) {
		t.Errorf("containers finished in the order %v, want app, then logs, then proxy", got)
	}
}

// TestCrashLoopBackOff: a container that keeps failing is restarted with kubelet's growing
// back-off. After its Nth restart exits, it waits as CrashLoopBackOff with kubelet's message
// naming the delay, base*2^(N-1) capped at the max ("back-off 4s restarting failed
// container=main pod=crasher_default(UID)"); the next attempt starts at least that long after
// the exit (the runtime's own timestamps); lastState keeps the exit; the pod stays Running.
func TestCrashLoopBackOff(t *testing.T) {
	const base, maxDelay = 2 * time.Second, 8 * time.Second
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.Pods.BackOffBase = config.D(base)
		c.Pods.BackOffMax = config.D(maxDelay)
	})
	// The delay after the exit of attempt n (= restartCount n), n >= 1: 2s, 4s, 8s, 8s, ...
	// Attempt 0's exit is restarted at once, as kubelet does.
	delay := func(n int32) time.Duration { return min(base<<(n-1), maxDelay) }
	const lastAttempt = 5 // its start closes the gap after attempt 4, the second one at the cap
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := e.cp.Admin.CoreV1().Pods("default")
	// Every status the agent writes, from before the pod exists: no waiting period is missed.
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=crasher"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	pod := sleeperPod("crasher", true)
	pod.Spec.Containers[0] = step("main", "exit 42")
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	type span struct{ started, finished time.Time }
	attempts := map[int32]span{}     // by attempt, from the runtime's timestamps in the status
	messages := map[int32][]string{} // CrashLoopBackOff messages seen while restartCount was n
	record := func(n int32, st *v1.ContainerStateTerminated) {
		if st == nil {
			return
		}
		if st.ExitCode != 42 {
			t.Errorf("attempt %d: terminated %+v, want exit code 42", n, st)
		}
		attempts[n] = span{st.StartedAt.Time, st.FinishedAt.Time}
	}
	var lastSeen *v1.Pod
	for attempts[lastAttempt].started.IsZero() {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			t.Fatalf("attempt %d not started in time; attempts %v, back-off messages %v", lastAttempt, attempts, messages)
		}
		p, ok := ev.Object.(*v1.Pod)
		if !ok {
			t.Fatalf("watch: %+v", ev)
		}
		if len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		lastSeen = p
		cs := p.Status.ContainerStatuses[0]
		n := cs.RestartCount
		switch {
		case cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff":
			if m := cs.State.Waiting.Message; !slices.Contains(messages[n], m) {
				messages[n] = append(messages[n], m)
			}
			if cs.LastTerminationState.Terminated == nil {
				t.Errorf("restartCount %d: CrashLoopBackOff without lastState", n)
			}
			record(n, cs.LastTerminationState.Terminated)
		case cs.State.Terminated != nil:
			record(n, cs.State.Terminated)
		case cs.State.Running != nil:
			if a := attempts[n]; a.started.IsZero() {
				attempts[n] = span{started: cs.State.Running.StartedAt.Time}
			}
			if n > 0 {
				record(n-1, cs.LastTerminationState.Terminated)
			}
		}
	}

	for n := int32(1); n < lastAttempt; n++ {
		want := fmt.Sprintf("back-off %s restarting failed container=main pod=crasher_default(%s)", delay(n), created.UID)
		if got := messages[n]; len(got) != 1 || got[0] != want {
			t.Errorf("after restart %d: CrashLoopBackOff messages %q, want exactly %q", n, got, want)
		}
		// Timestamps have second resolution in the API; the delays are whole seconds, so the
		// truncated gap is still at least the delay.
		prev, next := attempts[n], attempts[n+1]
		if prev.finished.IsZero() || next.started.IsZero() {
			t.Errorf("attempt %d finish (%s) or attempt %d start (%s) not seen", n, prev.finished, n+1, next.started)
			continue
		}
		if gap := next.started.Sub(prev.finished); gap < delay(n) {
			t.Errorf("attempt %d started %s after attempt %d exited, before its back-off of %s", n+1, gap, n, delay(n))
		}
	}
	if lastSeen.Status.Phase != v1.PodRunning {
		t.Errorf("a crash-looping pod with restartPolicy Always is Running, got %s", lastSeen.Status.Phase)
	}
}

// TestLifecycleHooks: postStart runs after the container starts (exec) and preStop runs
// before SIGTERM on deletion (httpGet to the pod's own server and exec), within the grace
// period; a failing postStart kills the container, which is restarted.
func TestLifecycleHooks(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	pod := sleeperPod("hooked", true)
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](10)
	// The server logs every request (httpd -v) so the preStop GET shows in its log; the exec
	// hooks write where the test can see them through the server's document root.
	pod.Spec.Containers[0] = step("web", "mkdir -p /www && exec httpd -f -v -p 127.0.0.1:18080 -h /www")
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{
		// A postStart hook runs beside the entrypoint, in no order with it (as the kubelet's):
		// it waits for the entrypoint's /www. Under load (CI of 2026-12-06) it ran first.
		PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sh", "-c", "for i in $(seq 100); do [ -d /www ] && break; sleep 0.1; done; echo started > /www/poststart; echo bye > /www/prestop-called"}}},
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

// slowToStopPod is a pod that takes its whole grace period to stop: container "deaf" ignores
// SIGTERM, container "hooked" has a preStop hook that touches /prestop-started and never ends.
func slowToStopPod(name string, grace time.Duration) *v1.Pod {
	pod := sleeperPod(name, false)
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](int64(grace / time.Second))
	pod.Spec.Containers = []v1.Container{
		step("deaf", "trap '' TERM; sleep 3600"), // sh as PID 1 ignores SIGTERM explicitly
		step("hooked", "exec sleep 3600"),
	}
	pod.Spec.Containers[1].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{
		Exec: &v1.ExecAction{Command: []string{"sh", "-c", "touch /prestop-started; exec sleep 3600"}},
	}}
	return pod
}

// TestShorterGracePeriodCutsTerminationShort: a pod terminating with a ten-minute grace period
// (SIGTERM ignored, preStop hook never ending) is deleted again with a 2s grace period, as
// `kubectl delete --grace-period=2` does: the termination in progress is cut short, and the
// pod is gone long before its original grace period.
func TestShorterGracePeriodCutsTerminationShort(t *testing.T) {
	const grace = 10 * time.Minute
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, slowToStopPod("slow", grace), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := e.waitAPIRunning(t, "slow")["slow"]
	uid := p.UID
	var hooked string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "hooked" {
			hooked = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if err := pods.Delete(ctx, "slow", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the preStop hook running", func() error {
		_, err := e.exec(hooked, "sh", "-c", "test -e /prestop-started")
		return err
	})
	if err := pods.Delete(ctx, "slow", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](2)}); err != nil {
		t.Fatal(err)
	}
	shortened := time.Now()
	// Far less than the ten minutes the first deletion asked for.
	testenv.Eventually(t, 2*time.Minute, "the pod gone after the shorter grace period", func() error {
		if _, err := pods.Get(ctx, "slow", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still in the API (err %v)", err)
		}
		for id, c := range e.containers(t) {
			if c.PodUID == string(uid) {
				return fmt.Errorf("container %s still in containerd", id)
			}
		}
		return nil
	})
	t.Logf("pod gone %s after the deletion with the shorter grace period", time.Since(shortened).Round(time.Millisecond))
	if !strings.Contains(e.agent.Log(), "grace period shortened; terminating again") {
		t.Error("the agent's log does not say the grace period was shortened")
	}
}

// TestTerminationDoesNotBlockOtherPods: while a pod takes its whole grace period to stop (one
// container ignores SIGTERM, the other has a preStop hook that outlasts the grace period), a
// new pod starts and becomes Ready and another pod is deleted to the end, with the slow pod's
// containers still running; the slow pod then goes, SIGKILLed no earlier than its grace period.
func TestTerminationDoesNotBlockOtherPods(t *testing.T) {
	const grace = 30 * time.Second
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	slow := slowToStopPod("slow", grace)
	for _, p := range []*v1.Pod{slow, sleeperPod("doomed", true)} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAPIRunning(t, "doomed")
	var slowIDs []string
	testenv.Eventually(t, 90*time.Second, "both containers of the slow pod running", func() error {
		p, err := pods.Get(ctx, "slow", metav1.GetOptions{})
		if err != nil {
			return err
		}
		slowIDs = nil
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return fmt.Errorf("%s: %+v", cs.Name, cs.State)
			}
			slowIDs = append(slowIDs, strings.TrimPrefix(cs.ContainerID, "containerd://"))
		}
		if len(slowIDs) != 2 {
			return fmt.Errorf("statuses %+v", p.Status.ContainerStatuses)
		}
		return nil
	})

	if err := pods.Delete(ctx, "slow", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// Its termination is under way: the preStop hook runs (and will for the whole grace period).
	testenv.Eventually(t, 30*time.Second, "the slow pod's preStop hook running", func() error {
		_, err := e.exec(slowIDs[1], "sh", "-c", "test -e /prestop-started")
		return err
	})

	// Meanwhile a new pod (with its own network) starts and becomes Ready...
	if _, err := pods.Create(ctx, sleeperPod("newcomer", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the new pod Running and Ready", func() error {
		p, err := pods.Get(ctx, "newcomer", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || !hasCondition(p.Status, v1.PodReady, v1.ConditionTrue) {
			return fmt.Errorf("phase %s conditions %+v", p.Status.Phase, p.Status.Conditions)
		}
		return nil
	})
	// ...and another pod is deleted to the end: containers gone, object deleted by the agent.
	doomedUID := mustUID(t, e, "doomed")
	if err := pods.Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the other deleted pod gone", func() error {
		if _, err := pods.Get(ctx, "doomed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still in the API (err %v)", err)
		}
		for id, c := range e.containers(t) {
			if c.PodUID == doomedUID {
				return fmt.Errorf("container %s still in containerd", id)
			}
		}
		return nil
	})

	// All of that happened while the slow pod was still terminating.
	if p, err := pods.Get(ctx, "slow", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("the slow pod must still be terminating %s after its deletion (grace %s), once the others are done: %v",
			time.Since(deleted).Round(time.Millisecond), grace, err)
	}
	for _, id := range slowIDs {
		if !e.taskRunning(t, id) {
			t.Fatalf("container %s of the slow pod stopped %s after its deletion, before the others were done (grace %s)",
				id, time.Since(deleted).Round(time.Millisecond), grace)
		}
	}
	t.Logf("new pod Ready and other pod gone %s after the slow pod's deletion", time.Since(deleted).Round(time.Millisecond))

	testenv.Eventually(t, grace+60*time.Second, "the slow pod gone", func() error {
		if _, err := pods.Get(ctx, "slow", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still in the API (err %v)", err)
		}
		return nil
	})
	// Neither container gave up before the grace period: SIGTERM is ignored and the preStop
	// hook never ends, so only the SIGKILL at its end stopped them.
	if took := time.Since(deleted); took < grace {
		t.Errorf("the slow pod was gone %s after its deletion, before its grace period of %s", took, grace)
	}
	for id := range e.containers(t) {
		if slices.Contains(slowIDs, id) {
			t.Errorf("container %s of the slow pod left in containerd", id)
		}
	}
}
