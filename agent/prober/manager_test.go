package prober

import (
	"context"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	hfruntime "github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/test/poll"
)

func runtimeContainers() []hfruntime.Container {
	return []hfruntime.Container{
		{ID: "a0", Name: "app", Attempt: 0, State: hfruntime.StateExited},
		{ID: "a2", Name: "app", Attempt: 2, State: hfruntime.StateRunning, Pid: 7},
		{ID: "a1", Name: "app", Attempt: 1, State: hfruntime.StateExited},
		{ID: "b0", Name: "other", Attempt: 0, State: hfruntime.StateCreated},
	}
}

// TestRunDrivesWorkersOnTheClock runs the real goroutines on a fake clock: a liveness probe
// failing every period produces exactly one callback; readiness follows its probe.
func TestRunDrivesWorkersOnTheClock(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		LivenessProbe:  execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 2, 3 }),
		ReadinessProbe: execProbe(periodic(2)),
	})
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"}) // before Run: started by Run

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.m.Run(ctx) }()

	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "ready after the first readiness attempt", func() bool { return f.m.Ready(pod.UID, "app") })
	for i := 2; i <= 3; i++ {
		poll.UntilTrue(t, 5*time.Second, time.Millisecond, "both workers waiting on the clock", func() bool { return f.clk.Waiters() == 2 })
		f.clk.Step(2 * time.Second)
		poll.UntilTrue(t, 5*time.Second, time.Millisecond, "liveness attempt", func() bool { return f.h.count("app", Liveness) == i })
	}
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "the unhealthy callback", func() bool { return len(f.unhealthyCalls()) == 1 })
	for range 5 {
		poll.UntilTrue(t, 5*time.Second, time.Millisecond, "readiness waiting on the clock", func() bool { return f.clk.Waiters() >= 1 })
		f.clk.Step(2 * time.Second)
	}
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "readiness keeps probing", func() bool { return f.h.count("app", Readiness) >= 6 })
	if n, c := f.h.count("app", Liveness), len(f.unhealthyCalls()); n != 3 || c != 1 {
		t.Errorf("%d liveness attempts and %d callbacks; want 3 and 1 (on hold after the streak)", n, c)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
}

// TestRemovePodAndRunOwnTheirGoroutines: RemovePod ends the pod's workers (and the attempt in
// flight), Run returns only once every worker has, and nothing is left behind.
func TestRemovePodAndRunOwnTheirGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	clk := clocktesting.NewFakeClock(t0)
	inFlight := make(chan struct{}, 10)
	blocking := HandlerFunc(func(ctx context.Context, tg Target) (Outcome, string, error) {
		inFlight <- struct{}{}
		<-ctx.Done() // an exec that hangs: only the cancellation ends it
		return Failure, "cancelled", nil
	})
	m := NewManager(Config{Handler: blocking, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	pods := []*v1.Pod{testPod(v1.Container{Name: "app", LivenessProbe: execProbe(func(p *v1.Probe) { p.TimeoutSeconds = 3600 })})}
	other := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(func(p *v1.Probe) { p.TimeoutSeconds = 3600 })})
	other.UID = "uid-2"
	pods = append(pods, other)
	for _, p := range pods {
		m.UpdatePod(p, "10.0.0.7", map[string]ContainerInfo{"app": {ID: string(p.UID) + "-c", StartedAt: t0}})
	}
	for range pods {
		select {
		case <-inFlight:
		case <-time.After(5 * time.Second):
			t.Fatal("attempts did not start")
		}
	}
	m.RemovePod("uid-1")
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "the removed pod's worker gone", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.pods["uid-1"] == nil
	})

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return: a worker is stuck")
	}
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, "no goroutine left", func() bool { return runtime.NumGoroutine() <= before })
	// After Run, updates start nothing.
	m.UpdatePod(testPod(v1.Container{Name: "x", LivenessProbe: execProbe(nil)}), "", map[string]ContainerInfo{"x": {ID: "x1"}})
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Run returned, %d before", n, before)
	}
}

func TestRunRequiresAHandler(t *testing.T) {
	m := NewManager(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Run(ctx); err == nil {
		t.Error("Run without a handler must fail")
	}
}

func TestCallbacksDefaultToNothing(t *testing.T) {
	m := NewManager(Config{Handler: HandlerFunc(func(context.Context, Target) (Outcome, string, error) { return Failure, "", nil })})
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(func(p *v1.Probe) { p.FailureThreshold = 1 })})
	m.UpdatePod(pod, "", map[string]ContainerInfo{"app": {ID: "c1"}})
	m.mu.Lock()
	w := m.pods[pod.UID].workers[workerKey{pod.UID, "app", Liveness}]
	m.mu.Unlock()
	w.step(context.Background()) // must not panic on nil callbacks or recorder
	if _, ok := m.Unhealthy(types.UID("uid-1"), "app"); !ok {
		t.Error("not unhealthy")
	}
}
