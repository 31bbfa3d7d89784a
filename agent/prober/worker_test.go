package prober

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/holdfast-dev/holdfast/agent/events/record"
)

// The state machine is driven synchronously here: the workers' goroutines are not started
// (no Run), each test calls a worker's step with a fake clock and a scripted handler.

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// scripted answers each (container, kind) with what the test set, and counts the calls.
type scripted struct {
	mu      sync.Mutex
	outcome map[string]Outcome
	err     map[string]error
	calls   map[string]int
	during  func(t Target) // runs inside an attempt, if set
}

func newScripted() *scripted {
	return &scripted{outcome: map[string]Outcome{}, err: map[string]error{}, calls: map[string]int{}}
}

func skey(container string, k Kind) string { return container + "/" + string(k) }

func (s *scripted) set(container string, k Kind, o Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcome[skey(container, k)] = o
	delete(s.err, skey(container, k))
}

func (s *scripted) fail(container string, k Kind, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err[skey(container, k)] = err
}

func (s *scripted) count(container string, k Kind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[skey(container, k)]
}

func (s *scripted) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	s.mu.Lock()
	key := skey(t.Container.Name, t.Kind)
	s.calls[key]++
	o, err, during := s.outcome[key], s.err[key], s.during
	s.mu.Unlock()
	if during != nil {
		during(t)
	}
	if err != nil {
		return 0, "", err
	}
	if o == 0 {
		o = Success
	}
	return o, fmt.Sprintf("%s says %s", key, o), nil
}

type unhealthyCall struct {
	uid                    types.UID
	container, id, message string
}

type fixture struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	h   *scripted
	rec *record.FakeRecorder
	m   *Manager

	mu            sync.Mutex
	statusChanges int
	unhealthy     []unhealthyCall
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, clk: clocktesting.NewFakeClock(t0), h: newScripted(), rec: record.NewFakeRecorder(1000)}
	f.m = NewManager(Config{
		Handler:  f.h,
		Recorder: f.rec,
		Clock:    f.clk,
		OnStatusChange: func(types.UID) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.statusChanges++
		},
		OnContainerUnhealthy: func(uid types.UID, container, id, message string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.unhealthy = append(f.unhealthy, unhealthyCall{uid, container, id, message})
		},
	})
	return f
}

func (f *fixture) unhealthyCalls() []unhealthyCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]unhealthyCall(nil), f.unhealthy...)
}

func (f *fixture) changes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.statusChanges
}

// run reports the container instance id as running since the fake clock's now.
func (f *fixture) run(pod *v1.Pod, ids map[string]string) {
	running := map[string]ContainerInfo{}
	for name, id := range ids {
		running[name] = ContainerInfo{ID: id, StartedAt: f.clk.Now(), Pid: 42}
	}
	f.m.UpdatePod(pod, "10.0.0.7", running)
}

// step runs one worker's due attempts, as its goroutine would when woken.
func (f *fixture) step(pod *v1.Pod, container string, k Kind) time.Duration {
	f.t.Helper()
	f.m.mu.Lock()
	w := f.m.pods[pod.UID].workers[workerKey{pod.UID, container, k}]
	f.m.mu.Unlock()
	if w == nil {
		f.t.Fatalf("no %s worker for %s", k, container)
	}
	return w.step(context.Background())
}

// tick advances the clock by d and steps the workers of every kind of the container, startup
// first.
func (f *fixture) tick(pod *v1.Pod, container string, d time.Duration) {
	f.t.Helper()
	f.clk.Step(d)
	for _, k := range kinds {
		f.m.mu.Lock()
		w := f.m.pods[pod.UID].workers[workerKey{pod.UID, container, k}]
		f.m.mu.Unlock()
		if w != nil {
			w.step(context.Background())
		}
	}
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func execProbe(mod func(*v1.Probe)) *v1.Probe {
	p := &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"check"}}}}
	if mod != nil {
		mod(p)
	}
	return p
}

func testPod(containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "edge", UID: "uid-1"},
		Spec:       v1.PodSpec{Containers: containers, RestartPolicy: v1.RestartPolicyAlways},
	}
}

func periodic(sec int32) func(*v1.Probe) {
	return func(p *v1.Probe) { p.PeriodSeconds = sec }
}

func TestDefaultsLivenessKillsAfterThreeFailuresTenSecondsApart(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(nil)})
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"})

	if wait := f.step(pod, "app", Liveness); wait != 10*time.Second {
		t.Fatalf("after the first attempt, next in %s, want the default period 10s", wait)
	}
	if n := f.h.count("app", Liveness); n != 1 {
		t.Fatalf("%d attempts, want 1 (the first runs at once)", n)
	}
	// Woken early (a poke): nothing runs before the period.
	f.clk.Step(9 * time.Second)
	if wait := f.step(pod, "app", Liveness); wait != time.Second || f.h.count("app", Liveness) != 1 {
		t.Fatalf("early wake-up: wait %s, %d attempts", wait, f.h.count("app", Liveness))
	}
	f.tick(pod, "app", time.Second)
	if got := f.unhealthyCalls(); len(got) != 0 {
		t.Fatalf("killed after 2 failures: %+v", got)
	}
	f.tick(pod, "app", 10*time.Second)
	got := f.unhealthyCalls()
	if len(got) != 1 {
		t.Fatalf("after 3 failures (default failureThreshold): %d callbacks, want 1", len(got))
	}
	want := unhealthyCall{"uid-1", "app", "c1", "Container app failed liveness probe, will be restarted"}
	if got[0] != want {
		t.Errorf("callback %+v, want %+v", got[0], want)
	}
	u, ok := f.m.Unhealthy(pod.UID, "app")
	if !ok || u.ContainerID != "c1" || u.Kind != Liveness || u.Message != want.message {
		t.Errorf("Unhealthy = %+v, %v", u, ok)
	}
	// The instance is on hold: no more attempts, no second callback, however long it runs.
	for range 10 {
		f.tick(pod, "app", 10*time.Second)
	}
	if n := f.h.count("app", Liveness); n != 3 {
		t.Errorf("%d attempts after the kill request, want 3", n)
	}
	if n := len(f.unhealthyCalls()); n != 1 {
		t.Errorf("%d callbacks for one failure streak, want 1", n)
	}
	// Liveness does not touch readiness: a container without a readiness probe stays ready
	// until the pod worker kills it.
	if !f.m.Ready(pod.UID, "app") {
		t.Error("Ready false: liveness must not drive readiness")
	}
	evs := f.events()
	if len(evs) != 3 || evs[0] != "Warning Unhealthy Liveness probe failed: app/Liveness says failure" {
		t.Errorf("events %q, want 3 of kubelet's form", evs)
	}
}

func TestNewInstanceResetsAndGetsItsOwnCallback(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(func(p *v1.Probe) {
		p.PeriodSeconds, p.FailureThreshold = 1, 2
	})})
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	f.step(pod, "app", Liveness)
	f.tick(pod, "app", time.Second)
	if n := len(f.unhealthyCalls()); n != 1 {
		t.Fatalf("%d callbacks, want 1", n)
	}

	// The pod worker killed c1 and started c2, which passes.
	f.run(pod, map[string]string{})
	if _, ok := f.m.Unhealthy(pod.UID, "app"); ok {
		t.Error("Unhealthy while no instance runs")
	}
	f.h.set("app", Liveness, Success)
	f.run(pod, map[string]string{"app": "c2"})
	if _, ok := f.m.Unhealthy(pod.UID, "app"); ok {
		t.Error("Unhealthy still true for the new instance")
	}
	for range 5 {
		f.tick(pod, "app", time.Second)
	}
	if n := len(f.unhealthyCalls()); n != 1 {
		t.Errorf("%d callbacks while c2 passes, want still 1", n)
	}
	if n := f.h.count("app", Liveness); n != 2+5 {
		t.Errorf("%d attempts, want 7 (probing resumed on c2)", n)
	}

	// A new failure streak on c2: its own single callback.
	f.h.set("app", Liveness, Failure)
	for range 5 {
		f.tick(pod, "app", time.Second)
	}
	got := f.unhealthyCalls()
	if len(got) != 2 || got[1].id != "c2" {
		t.Errorf("callbacks %+v, want a second one for c2", got)
	}
}

func TestSuccessBreaksAFailureStreak(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(periodic(1))})
	f.run(pod, map[string]string{"app": "c1"})
	seq := []Outcome{Failure, Failure, Success, Failure, Failure}
	for i, o := range seq {
		f.h.set("app", Liveness, o)
		if i == 0 {
			f.step(pod, "app", Liveness)
		} else {
			f.tick(pod, "app", time.Second)
		}
	}
	if n := len(f.unhealthyCalls()); n != 0 {
		t.Fatalf("killed after %v: the success broke the streak", seq)
	}
	f.tick(pod, "app", time.Second)
	if n := len(f.unhealthyCalls()); n != 1 {
		t.Fatalf("%d callbacks after three failures in a row, want 1", n)
	}
}

func TestInitialDelayCountsFromContainerStart(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(func(p *v1.Probe) {
		p.InitialDelaySeconds, p.PeriodSeconds = 5, 2
	})})
	f.m.UpdatePod(pod, "10.0.0.7", map[string]ContainerInfo{"app": {ID: "c1", StartedAt: t0.Add(-2 * time.Second)}})
	if wait := f.step(pod, "app", Readiness); wait != 3*time.Second {
		t.Fatalf("wait %s, want 3s (5s from a start 2s ago)", wait)
	}
	if n := f.h.count("app", Readiness); n != 0 {
		t.Fatalf("probed during the initial delay")
	}
	f.tick(pod, "app", 3*time.Second)
	if n := f.h.count("app", Readiness); n != 1 {
		t.Fatalf("%d attempts once the delay passed, want 1", n)
	}
}

func TestReadinessThresholdsAndStatusCallbacks(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(func(p *v1.Probe) {
		p.PeriodSeconds, p.SuccessThreshold, p.FailureThreshold = 1, 2, 2
	})})
	f.run(pod, map[string]string{"app": "c1"})
	if f.m.Ready(pod.UID, "app") {
		t.Fatal("ready before any readiness attempt (kubelet: not ready until it passes)")
	}
	if !f.m.Started(pod.UID, "app") {
		t.Fatal("not started: a container without a startup probe starts when it runs")
	}
	f.h.set("app", Readiness, Success)
	f.step(pod, "app", Readiness)
	if f.m.Ready(pod.UID, "app") || f.changes() != 0 {
		t.Fatal("ready after 1 success with successThreshold 2")
	}
	f.tick(pod, "app", time.Second)
	if !f.m.Ready(pod.UID, "app") || f.changes() != 1 {
		t.Fatalf("ready %v, %d status changes after 2 successes; want true, 1", f.m.Ready(pod.UID, "app"), f.changes())
	}
	f.h.set("app", Readiness, Failure)
	f.tick(pod, "app", time.Second)
	if !f.m.Ready(pod.UID, "app") {
		t.Fatal("unready after 1 failure with failureThreshold 2")
	}
	f.tick(pod, "app", time.Second)
	if f.m.Ready(pod.UID, "app") || f.changes() != 2 {
		t.Fatalf("ready %v, %d status changes after 2 failures; want false, 2", f.m.Ready(pod.UID, "app"), f.changes())
	}
	// More failures change nothing: no callback, readiness never kills.
	f.tick(pod, "app", time.Second)
	if f.changes() != 2 || len(f.unhealthyCalls()) != 0 {
		t.Errorf("%d status changes, %d kills", f.changes(), len(f.unhealthyCalls()))
	}
	// A new instance starts not ready, at once, before any attempt.
	f.h.set("app", Readiness, Success)
	f.tick(pod, "app", time.Second)
	f.tick(pod, "app", time.Second)
	if !f.m.Ready(pod.UID, "app") {
		t.Fatal("not ready again")
	}
	f.run(pod, map[string]string{"app": "c2"})
	if f.m.Ready(pod.UID, "app") {
		t.Error("a restarted container inherited its predecessor's readiness")
	}
	// Not running: not ready.
	f.run(pod, map[string]string{})
	if f.m.Ready(pod.UID, "app") || f.m.Started(pod.UID, "app") {
		t.Error("ready or started while not running")
	}
}

func TestNoProbes(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app"}, v1.Container{Name: "side"})
	f.run(pod, map[string]string{"app": "c1"})
	if !f.m.Ready(pod.UID, "app") || !f.m.Started(pod.UID, "app") {
		t.Error("a running container without probes is ready and started")
	}
	if f.m.Ready(pod.UID, "side") || f.m.Started(pod.UID, "side") {
		t.Error("a container that does not run is neither ready nor started")
	}
	if f.m.Ready("other", "app") {
		t.Error("a pod never updated is ready")
	}
}

func TestStartupGatesLivenessAndReadiness(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		StartupProbe:   execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 30 }),
		LivenessProbe:  execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 1 }),
		ReadinessProbe: execProbe(periodic(1)),
	})
	f.h.set("app", Startup, Failure)
	f.h.set("app", Liveness, Failure) // would kill at once if it ran
	f.run(pod, map[string]string{"app": "c1"})
	for range 10 {
		f.tick(pod, "app", time.Second)
	}
	if n := f.h.count("app", Startup); n != 10 {
		t.Errorf("%d startup attempts, want 10", n)
	}
	if l, r := f.h.count("app", Liveness), f.h.count("app", Readiness); l+r != 0 {
		t.Fatalf("liveness ran %d times, readiness %d times before startup passed", l, r)
	}
	if f.m.Started(pod.UID, "app") || f.m.Ready(pod.UID, "app") || len(f.unhealthyCalls()) != 0 {
		t.Fatal("started, ready or killed before the startup probe passed")
	}

	f.h.set("app", Startup, Success)
	f.h.set("app", Liveness, Success)
	before := f.changes()
	f.clk.Step(time.Second)
	f.step(pod, "app", Startup)
	if !f.m.Started(pod.UID, "app") || f.changes() != before+1 {
		t.Fatal("startup passed: started, and the status must be reported again")
	}
	// Its success woke liveness and readiness, which run at once.
	for _, k := range []Kind{Liveness, Readiness} {
		f.m.mu.Lock()
		w := f.m.pods[pod.UID].workers[workerKey{pod.UID, "app", k}]
		f.m.mu.Unlock()
		select {
		case <-w.trigger:
		default:
			t.Errorf("%s worker not poked when startup passed", k)
		}
		f.step(pod, "app", k)
	}
	if l, r := f.h.count("app", Liveness), f.h.count("app", Readiness); l != 1 || r != 1 {
		t.Errorf("after startup passed: %d liveness, %d readiness attempts; want 1 each", l, r)
	}
	if !f.m.Ready(pod.UID, "app") {
		t.Error("not ready after readiness passed")
	}
	// Startup is done for this instance.
	for range 5 {
		f.tick(pod, "app", time.Second)
	}
	if n := f.h.count("app", Startup); n != 11 {
		t.Errorf("%d startup attempts, want 11: it stops once passed", n)
	}
	// A new instance is gated again.
	f.h.set("app", Startup, Failure)
	f.run(pod, map[string]string{"app": "c2"})
	if f.m.Started(pod.UID, "app") || f.m.Ready(pod.UID, "app") {
		t.Error("the new instance inherited started/ready")
	}
	l := f.h.count("app", Liveness)
	f.tick(pod, "app", time.Second)
	if f.h.count("app", Liveness) != l {
		t.Error("liveness ran on a new instance before its startup probe passed")
	}
}

func TestStartupFailureKills(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", StartupProbe: execProbe(func(p *v1.Probe) {
		p.PeriodSeconds, p.FailureThreshold = 1, 2
		grace := int64(7)
		p.TerminationGracePeriodSeconds = &grace
	})})
	f.h.set("app", Startup, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	f.step(pod, "app", Startup)
	f.tick(pod, "app", time.Second)
	f.tick(pod, "app", time.Second)
	got := f.unhealthyCalls()
	if len(got) != 1 || got[0].message != "Container app failed startup probe, will be restarted" {
		t.Fatalf("callbacks %+v", got)
	}
	u, ok := f.m.Unhealthy(pod.UID, "app")
	if !ok || u.Kind != Startup || u.GracePeriodSeconds == nil || *u.GracePeriodSeconds != 7 {
		t.Errorf("Unhealthy = %+v, %v; want startup with the probe's grace period", u, ok)
	}
	if n := f.h.count("app", Startup); n != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
}

func TestRestartPolicyNeverMessage(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(func(p *v1.Probe) { p.FailureThreshold = 1 })})
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	f.step(pod, "app", Liveness)
	if got := f.unhealthyCalls(); len(got) != 1 || got[0].message != "Container app failed liveness probe" {
		t.Errorf("callbacks %+v; kubelet says no more than that when it will not restart", got)
	}
}

func TestErroredAttemptsCountNeitherWay(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		LivenessProbe:  execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 1 }),
		ReadinessProbe: execProbe(periodic(1)),
	})
	f.h.fail("app", Liveness, errors.New("containerd unreachable"))
	f.h.fail("app", Readiness, errors.New("containerd unreachable"))
	f.run(pod, map[string]string{"app": "c1"})
	for range 5 {
		f.tick(pod, "app", time.Second)
	}
	if len(f.unhealthyCalls()) != 0 || f.m.Ready(pod.UID, "app") || f.changes() != 0 {
		t.Fatalf("errored attempts changed something: kills %v, ready %v", f.unhealthyCalls(), f.m.Ready(pod.UID, "app"))
	}
	evs := f.events()
	if len(evs) == 0 || !strings.HasPrefix(evs[0], "Warning Unhealthy ") || !strings.Contains(evs[0], "probe errored: containerd unreachable") {
		t.Errorf("events %q", evs)
	}
	// An errored attempt does not break a streak either (kubelet throws the result away).
	f.h.set("app", Readiness, Success)
	f.tick(pod, "app", time.Second)
	if !f.m.Ready(pod.UID, "app") {
		t.Error("not ready after the first success")
	}
}

func TestWarningIsASuccessWithAnEvent(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(nil)})
	f.h.set("app", Readiness, Warning)
	f.run(pod, map[string]string{"app": "c1"})
	f.step(pod, "app", Readiness)
	if !f.m.Ready(pod.UID, "app") {
		t.Error("a warning is a success")
	}
	if evs := f.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning ProbeWarning Readiness probe warning: ") {
		t.Errorf("events %q", evs)
	}
}

func TestDeletionStopsLivenessNotReadiness(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		LivenessProbe:  execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 1 }),
		ReadinessProbe: execProbe(periodic(1)),
	})
	now := metav1.NewTime(t0)
	pod.DeletionTimestamp = &now
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	for range 3 {
		f.tick(pod, "app", time.Second)
	}
	if n := f.h.count("app", Liveness); n != 0 || len(f.unhealthyCalls()) != 0 {
		t.Errorf("liveness ran %d times on a pod being deleted", n)
	}
	if n := f.h.count("app", Readiness); n != 3 {
		t.Errorf("readiness ran %d times, want 3: it keeps running while the pod terminates", n)
	}
}

func TestReportedStatusKeepsReadinessAcrossAgentRestart(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		StartupProbe:   execProbe(periodic(1)),
		ReadinessProbe: execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 2 }),
	})
	yes := true
	pod.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "app", ContainerID: "containerd://c1", Ready: true, Started: &yes}}
	f.h.set("app", Readiness, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	if !f.m.Ready(pod.UID, "app") || !f.m.Started(pod.UID, "app") {
		t.Fatal("the instance the pod's status reports ready lost its readiness on a fresh manager")
	}
	f.tick(pod, "app", 0)
	if n := f.h.count("app", Startup); n != 0 {
		t.Errorf("startup probed again on an instance reported started")
	}
	if !f.m.Ready(pod.UID, "app") {
		t.Error("one failure under failureThreshold 2 made it unready")
	}
	f.tick(pod, "app", time.Second)
	if f.m.Ready(pod.UID, "app") {
		t.Error("the probe says otherwise: must be unready now")
	}
	// Another instance is not seeded from the status of the first.
	f.run(pod, map[string]string{"app": "c2"})
	if f.m.Ready(pod.UID, "app") || f.m.Started(pod.UID, "app") {
		t.Error("c2 seeded from c1's reported status")
	}
}

func TestStaleAttemptIsDiscarded(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(nil)})
	f.run(pod, map[string]string{"app": "c1"})
	// The container restarts while the attempt on c1 is in flight.
	f.h.during = func(Target) {
		f.h.during = nil // called with f.h.mu released; the next attempt is c2's own
		f.h.set("app", Readiness, Failure)
		f.run(pod, map[string]string{"app": "c2"})
	}
	f.h.set("app", Readiness, Success)
	f.step(pod, "app", Readiness)
	if f.m.Ready(pod.UID, "app") {
		t.Error("c1's success made c2 ready")
	}
	if n := f.h.count("app", Readiness); n != 2 {
		t.Errorf("%d attempts, want 2: c2 is probed at once", n)
	}
}

func TestUpdatePodStopsWorkersOfRemovedOrChangedProbes(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{Name: "app", LivenessProbe: execProbe(nil), ReadinessProbe: execProbe(nil)})
	f.run(pod, map[string]string{"app": "c1"})
	f.m.mu.Lock()
	old := f.m.pods[pod.UID].workers[workerKey{pod.UID, "app", Readiness}]
	f.m.mu.Unlock()

	changed := testPod(v1.Container{Name: "app", ReadinessProbe: execProbe(periodic(3))})
	f.run(changed, map[string]string{"app": "c1"})
	f.m.mu.Lock()
	ws := f.m.pods[pod.UID].workers
	_, hasLiveness := ws[workerKey{pod.UID, "app", Liveness}]
	replaced := ws[workerKey{pod.UID, "app", Readiness}]
	f.m.mu.Unlock()
	if hasLiveness {
		t.Error("the liveness worker outlived its probe")
	}
	if replaced == old || !old.stopped || replaced.probe.PeriodSeconds != 3 {
		t.Error("a changed probe must get a new worker and stop the old one")
	}

	f.m.RemovePod(pod.UID)
	if !replaced.stopped || f.m.Ready(pod.UID, "app") {
		t.Error("RemovePod left a worker running or state behind")
	}
}

func TestSidecarProbesRun(t *testing.T) {
	f := newFixture(t)
	always := v1.ContainerRestartPolicyAlways
	pod := testPod(v1.Container{Name: "app"})
	pod.Spec.InitContainers = []v1.Container{
		{Name: "side", RestartPolicy: &always, ReadinessProbe: execProbe(nil)},
		{Name: "setup", ReadinessProbe: execProbe(nil)}, // ignored, as kubelet does
	}
	f.run(pod, map[string]string{"side": "s1", "app": "c1"})
	f.step(pod, "side", Readiness)
	if !f.m.Ready(pod.UID, "side") {
		t.Error("sidecar readiness not probed")
	}
	f.m.mu.Lock()
	_, setup := f.m.pods[pod.UID].workers[workerKey{pod.UID, "setup", Readiness}]
	f.m.mu.Unlock()
	if setup {
		t.Error("a plain init container got a probe worker")
	}
	if evs := f.events(); len(evs) != 0 {
		t.Errorf("events %q", evs)
	}
}

func TestProbeDefaults(t *testing.T) {
	p := &v1.Probe{}
	if period(p) != 10*time.Second || timeout(p) != time.Second || failureThreshold(p) != 3 || successThreshold(p, Readiness) != 1 {
		t.Errorf("defaults: period %s timeout %s failure %d success %d", period(p), timeout(p), failureThreshold(p), successThreshold(p, Readiness))
	}
	p.SuccessThreshold = 3
	if successThreshold(p, Liveness) != 1 || successThreshold(p, Readiness) != 3 {
		t.Error("successThreshold is 1 for liveness, the spec's for readiness")
	}
}

func TestRunningContainersPicksTheLatestRunningAttempt(t *testing.T) {
	got := RunningContainers(runtimeContainers())
	if len(got) != 1 || got["app"].ID != "a2" || got["app"].Pid != 7 {
		t.Errorf("RunningContainers = %+v", got)
	}
}

// TestStopLivenessAndStartup: once the pod's containers are being stopped, its liveness and
// startup probes end and an UpdatePod (the pod worker reports each observation) does not
// start them again; readiness goes on, no longer gated by the startup probe that had not
// passed (the kubelet sets its result to success), so the pod's readiness follows its probe
// while it drains.
func TestStopLivenessAndStartup(t *testing.T) {
	f := newFixture(t)
	pod := testPod(v1.Container{
		Name:           "app",
		StartupProbe:   execProbe(periodic(1)),
		LivenessProbe:  execProbe(func(p *v1.Probe) { p.PeriodSeconds, p.FailureThreshold = 1, 1 }),
		ReadinessProbe: execProbe(periodic(1)),
	})
	f.h.set("app", Startup, Failure)
	f.h.set("app", Liveness, Failure)
	f.run(pod, map[string]string{"app": "c1"})
	f.tick(pod, "app", time.Second)
	if f.h.count("app", Readiness) != 0 {
		t.Fatal("readiness ran before the startup probe passed")
	}

	f.m.StopLivenessAndStartup(pod.UID)
	f.run(pod, map[string]string{"app": "c1"})
	f.m.mu.Lock()
	for key := range f.m.pods[pod.UID].workers {
		if key.kind != Readiness {
			t.Errorf("a %s worker runs after StopLivenessAndStartup", key.kind)
		}
	}
	f.m.mu.Unlock()
	for range 3 {
		f.tick(pod, "app", time.Second)
	}
	if n, u := f.h.count("app", Liveness), len(f.unhealthyCalls()); n != 0 || u != 0 {
		t.Errorf("liveness ran %d times (%d kills) after StopLivenessAndStartup", n, u)
	}
	if n := f.h.count("app", Readiness); n != 3 {
		t.Errorf("readiness ran %d times, want 3", n)
	}
	if !f.m.Ready(pod.UID, "app") {
		t.Error("not ready while its readiness probe passes")
	}
	f.h.set("app", Readiness, Failure)
	for range 3 { // the default failureThreshold
		f.tick(pod, "app", time.Second)
	}
	if f.m.Ready(pod.UID, "app") {
		t.Error("ready after its readiness probe failed while draining")
	}
}
