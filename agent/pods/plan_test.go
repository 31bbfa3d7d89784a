package pods

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

type fakeBackoff map[string]time.Duration // key -> remaining delay (0 = none)

func (f fakeBackoff) inBackOff(key string, _ time.Time) (bool, time.Duration) {
	d, ok := f[key]
	return ok && d > 0, d
}

func testPod(policy v1.RestartPolicy, names ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}, Spec: v1.PodSpec{RestartPolicy: policy}}
	for _, n := range names {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: n, Image: "img"})
	}
	return p
}

func withRestart(p *v1.Pod, policy v1.ContainerRestartPolicy, rules ...v1.ContainerRestartRule) *v1.Pod {
	p.Spec.Containers[0].RestartPolicy = &policy
	p.Spec.Containers[0].RestartPolicyRules = rules
	return p
}

func ctr(pod *v1.Pod, name string, attempt int, state runtime.State, exit int32) runtime.Container {
	var spec *v1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			spec = &pod.Spec.Containers[i]
		}
	}
	return runtime.Container{
		ID: runtime.ContainerID(string(pod.UID), name, attempt), PodUID: string(pod.UID), Name: name,
		Attempt: attempt, State: state, ExitCode: exit, SpecHash: containerHash(spec),
	}
}

func TestComputePlan(t *testing.T) {
	always := testPod(v1.RestartPolicyAlways, "a", "b")
	onFailure := testPod(v1.RestartPolicyOnFailure, "a")
	never := testPod(v1.RestartPolicyNever, "a")
	changed := testPod(v1.RestartPolicyAlways, "a")
	// Per-container policies and rules (ContainerRestartRules) override the pod's.
	alwaysInNever := withRestart(testPod(v1.RestartPolicyNever, "a"), v1.ContainerRestartPolicyAlways)
	neverInAlways := withRestart(testPod(v1.RestartPolicyAlways, "a"), v1.ContainerRestartPolicyNever)
	rule42 := withRestart(testPod(v1.RestartPolicyNever, "a"), v1.ContainerRestartPolicyNever, v1.ContainerRestartRule{
		Action: v1.ContainerRestartRuleActionRestart, ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{42}}})
	notIn0 := withRestart(testPod(v1.RestartPolicyNever, "a"), v1.ContainerRestartPolicyNever, v1.ContainerRestartRule{
		Action: v1.ContainerRestartRuleActionRestart, ExitCodes: &v1.ContainerRestartRuleOnExitCodes{Operator: v1.ContainerRestartRuleOnExitCodesOpNotIn, Values: []int32{0}}})
	stale := ctr(changed, "a", 0, runtime.StateRunning, 0)
	stale.SpecHash = "older"

	for _, tc := range []struct {
		name      string
		pod       *v1.Pod
		observed  []runtime.Container
		backoff   fakeBackoff
		wantStart map[string]int // container -> attempt
		wantKill  int
		wantRm    int
		wantWait  []string
	}{
		{name: "nothing yet: start all at attempt 0", pod: always,
			wantStart: map[string]int{"a": 0, "b": 0}},
		{name: "all running: nothing to do", pod: always,
			observed: []runtime.Container{ctr(always, "a", 0, runtime.StateRunning, 0), ctr(always, "b", 0, runtime.StateRunning, 0)}},
		{name: "created but never started: start the same attempt", pod: always,
			observed:  []runtime.Container{ctr(always, "a", 0, runtime.StateCreated, 0), ctr(always, "b", 0, runtime.StateRunning, 0)},
			wantStart: map[string]int{"a": 0}},
		{name: "always restarts a success", pod: always,
			observed:  []runtime.Container{ctr(always, "a", 0, runtime.StateExited, 0), ctr(always, "b", 0, runtime.StateRunning, 0)},
			wantStart: map[string]int{"a": 1}},
		{name: "onFailure restarts a failure", pod: onFailure,
			observed:  []runtime.Container{ctr(onFailure, "a", 2, runtime.StateExited, 1)},
			wantStart: map[string]int{"a": 3}},
		{name: "onFailure keeps a success", pod: onFailure,
			observed: []runtime.Container{ctr(onFailure, "a", 0, runtime.StateExited, 0)}},
		{name: "never restarts nothing", pod: never,
			observed: []runtime.Container{ctr(never, "a", 0, runtime.StateExited, 137)}},
		{name: "back-off holds the restart", pod: onFailure,
			observed: []runtime.Container{ctr(onFailure, "a", 1, runtime.StateExited, 1)},
			backoff:  fakeBackoff{"uid-1/a": 20 * time.Second}, wantWait: []string{"a"}},
		{name: "older attempts removed, latest two kept", pod: always,
			observed: []runtime.Container{
				ctr(always, "a", 0, runtime.StateExited, 1), ctr(always, "a", 1, runtime.StateExited, 1),
				ctr(always, "a", 2, runtime.StateRunning, 0), ctr(always, "b", 0, runtime.StateRunning, 0)},
			wantRm: 1},
		{name: "container Always in a Never pod restarts", pod: alwaysInNever,
			observed: []runtime.Container{ctr(alwaysInNever, "a", 0, runtime.StateExited, 1)}, wantStart: map[string]int{"a": 1}},
		{name: "container Never in an Always pod stays", pod: neverInAlways,
			observed: []runtime.Container{ctr(neverInAlways, "a", 0, runtime.StateExited, 1)}},
		{name: "a matching rule restarts", pod: rule42,
			observed: []runtime.Container{ctr(rule42, "a", 0, runtime.StateExited, 42)}, wantStart: map[string]int{"a": 1}},
		{name: "no rule matches: the container's policy", pod: rule42,
			observed: []runtime.Container{ctr(rule42, "a", 0, runtime.StateExited, 1)}},
		{name: "NotIn rule restarts a failure", pod: notIn0,
			observed: []runtime.Container{ctr(notIn0, "a", 0, runtime.StateExited, 3)}, wantStart: map[string]int{"a": 1}},
		{name: "NotIn rule keeps a success", pod: notIn0,
			observed: []runtime.Container{ctr(notIn0, "a", 0, runtime.StateExited, 0)}},
		{name: "spec changed: running container killed", pod: changed,
			observed: []runtime.Container{stale}, wantKill: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bo := tc.backoff
			if bo == nil {
				bo = fakeBackoff{}
			}
			p := computePlan(tc.pod, tc.observed, bo, nil)
			got := map[string]int{}
			for _, s := range p.start {
				got[s.container.Name] = s.attempt
			}
			if len(got) != len(tc.wantStart) {
				t.Fatalf("start %v, want %v", got, tc.wantStart)
			}
			for n, a := range tc.wantStart {
				if got[n] != a {
					t.Errorf("start %s at attempt %d, want %d", n, got[n], a)
				}
			}
			if len(p.kill) != tc.wantKill || len(p.remove) != tc.wantRm || len(p.backOff) != len(tc.wantWait) {
				t.Errorf("kill %d remove %d backOff %v; want %d %d %v", len(p.kill), len(p.remove), p.backOff, tc.wantKill, tc.wantRm, tc.wantWait)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBackoff(10*time.Second, 40*time.Second, func() time.Time { return now })
	if wait, _ := b.inBackOff("k", now); wait {
		t.Fatal("first restart must not wait")
	}
	var delays []time.Duration
	for i := 0; i < 5; i++ {
		b.next("k", now.Add(-time.Second), now)
		_, d := b.inBackOff("k", now)
		delays = append(delays, d)
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second, 40 * time.Second}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("delays %v, want %v", delays, want)
		}
	}
	if wait, _ := b.inBackOff("k", now.Add(-39*time.Second)); !wait {
		t.Error("finished 39s ago with a 40s delay: must wait")
	}
	if wait, _ := b.inBackOff("k", now.Add(-41*time.Second)); wait {
		t.Error("finished 41s ago with a 40s delay: must not wait")
	}
	// A container that ran longer than 2*max resets the delay.
	b.next("k", now.Add(-90*time.Second), now)
	if _, d := b.inBackOff("k", now); d != 10*time.Second {
		t.Errorf("after a long run the delay is %s, want the base", d)
	}
	b.forget("uid")
	b.next("uid/a", time.Time{}, now)
	b.forget("uid")
	if wait, _ := b.inBackOff("uid/a", now); wait {
		t.Error("forget kept an entry")
	}
}

func withInit(pod *v1.Pod, sidecar bool, names ...string) *v1.Pod {
	for _, n := range names {
		c := v1.Container{Name: n, Image: "img"}
		if sidecar {
			always := v1.ContainerRestartPolicyAlways
			c.RestartPolicy = &always
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
	}
	return pod
}

func TestComputePlanInitContainers(t *testing.T) {
	mk := func(policy v1.RestartPolicy) *v1.Pod {
		p := withInit(testPod(policy, "app"), false, "init-1", "init-2")
		return p
	}
	starts := func(p plan) []string {
		var out []string
		for _, s := range p.start {
			out = append(out, s.container.Name)
		}
		return out
	}
	pod := mk(v1.RestartPolicyAlways)
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		observed []runtime.Container
		want     []string
		failed   bool
	}{
		{"first init container first, alone", pod, nil, []string{"init-1"}, false},
		{"second after the first succeeded", pod, []runtime.Container{ctr(initSpec(pod), "init-1", 0, runtime.StateExited, 0)}, []string{"init-2"}, false},
		{"nothing while one runs", pod, []runtime.Container{ctr(initSpec(pod), "init-1", 0, runtime.StateRunning, 0)}, nil, false},
		{"failed init retried", pod, []runtime.Container{ctr(initSpec(pod), "init-1", 0, runtime.StateExited, 1)}, []string{"init-1"}, false},
		{"apps after all init", pod, []runtime.Container{ctr(initSpec(pod), "init-1", 0, runtime.StateExited, 0), ctr(initSpec(pod), "init-2", 0, runtime.StateExited, 0)}, []string{"app"}, false},
		{"never: failed init is final", mk(v1.RestartPolicyNever), []runtime.Container{ctr(initSpec(mk(v1.RestartPolicyNever)), "init-1", 0, runtime.StateExited, 1)}, nil, true},
		{"init not rerun once apps exist", pod, []runtime.Container{ctr(pod, "app", 0, runtime.StateRunning, 0)}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := computePlan(tc.pod, tc.observed, fakeBackoff{}, nil)
			if got := starts(p); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("starts %v, want %v", got, tc.want)
			}
			if got := initFailed(tc.pod, groupByName(tc.observed), nil); got != tc.failed {
				t.Errorf("initFailed %v, want %v", got, tc.failed)
			}
		})
	}

	side := withInit(testPod(v1.RestartPolicyAlways, "app"), true, "proxy")
	sideSpec := initSpec(side)
	if got := starts(computePlan(side, []runtime.Container{ctr(sideSpec, "proxy", 0, runtime.StateRunning, 0)}, fakeBackoff{}, nil)); fmt.Sprint(got) != "[app]" {
		t.Errorf("app must start once the sidecar runs: %v", got)
	}
	// A sidecar with a startup probe holds the containers after it until the probe passed.
	notStarted := func(string) bool { return false }
	if got := starts(computePlan(side, []runtime.Container{ctr(sideSpec, "proxy", 0, runtime.StateRunning, 0)}, fakeBackoff{}, notStarted)); len(got) != 0 {
		t.Errorf("app started before its sidecar's startup probe passed: %v", got)
	}
	exited := []runtime.Container{ctr(sideSpec, "proxy", 0, runtime.StateExited, 0), ctr(side, "app", 0, runtime.StateRunning, 0)}
	if got := starts(computePlan(side, exited, fakeBackoff{}, nil)); fmt.Sprint(got) != "[proxy]" {
		t.Errorf("an exited sidecar is restarted beside the app: %v", got)
	}
}

// initSpec returns a pod whose app containers are its init containers, so ctr() finds their
// spec hash.
func initSpec(pod *v1.Pod) *v1.Pod {
	c := pod.DeepCopy()
	c.Spec.Containers = c.Spec.InitContainers
	return c
}

// Ephemeral containers start once, before the init containers are done, and are never
// restarted; one with a target waits for it to run and joins its PID namespace.
func TestComputePlanEphemeral(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "app")
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "img"}}
	pod.Spec.EphemeralContainers = []v1.EphemeralContainer{
		{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debug", Image: "img"}},
		{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "peek", Image: "img"}, TargetContainerName: "app"},
	}
	named := func(name string, attempt int, state runtime.State, pid uint32) runtime.Container {
		return runtime.Container{ID: runtime.ContainerID(string(pod.UID), name, attempt), PodUID: string(pod.UID), Name: name,
			Attempt: attempt, State: state, Pid: pid}
	}
	starts := func(p plan) map[string]startAction {
		m := map[string]startAction{}
		for _, s := range p.start {
			m[s.container.Name] = s
		}
		return m
	}
	// Init not done: debug starts beside the init container; peek waits for app.
	got := starts(computePlan(pod, nil, fakeBackoff{}, nil))
	if _, ok := got["debug"]; !ok {
		t.Errorf("debug not started before the init containers are done: %v", got)
	}
	if _, ok := got["peek"]; ok {
		t.Errorf("peek started before its target runs")
	}
	// Initialized, app running: peek joins app's PID namespace; debug, exited, stays exited.
	observed := []runtime.Container{named("init", 0, runtime.StateExited, 0), named("app", 0, runtime.StateRunning, 4242),
		named("debug", 0, runtime.StateExited, 0)}
	for i := range observed {
		if observed[i].Name == "app" {
			observed[i].SpecHash = containerHash(&pod.Spec.Containers[0])
		}
	}
	got = starts(computePlan(pod, observed, fakeBackoff{}, nil))
	if s, ok := got["peek"]; !ok || s.pidNamespaceOf != 4242 {
		t.Errorf("peek: %+v, want started in the PID namespace of pid 4242", s)
	}
	if _, ok := got["debug"]; ok || len(got) != 1 {
		t.Errorf("starts %v: an exited ephemeral container is never restarted", got)
	}
}

// A container is made anew only when what needs a new container changes: its image. A resize
// is not a restart (the apiserver requires resizePolicy NotRequired in a Never pod). A field a newer apiserver
// defaults, or any other field the API would never let change on a running pod but a
// re-applied static manifest or a restored record may carry differently, restarts nothing: a
// control-plane upgrade must not restart every container of every gateway. A container an
// older holdfast made (a hash of its whole spec) is compared by image, so that upgrading the
// agent restarts nothing either.
func TestOnlyWhatNeedsANewContainerRestartsIt(t *testing.T) {
	base := testPod(v1.RestartPolicyAlways, "a")
	running := ctr(base, "a", 0, runtime.StateRunning, 0)
	running.Image = "img"
	for _, tc := range []struct {
		name     string
		change   func(c *v1.Container)
		observed func(c runtime.Container) runtime.Container
		wantKill bool
	}{
		{name: "a field a newer apiserver defaults", change: func(c *v1.Container) {
			c.TerminationMessagePolicy = v1.TerminationMessageReadFile
			c.ImagePullPolicy = v1.PullIfNotPresent
			c.ResizePolicy = []v1.ContainerResizePolicy{{ResourceName: v1.ResourceCPU, RestartPolicy: v1.NotRequired}}
		}},
		{name: "env and probes", change: func(c *v1.Container) {
			c.Env = []v1.EnvVar{{Name: "X", Value: "1"}}
			c.ReadinessProbe = &v1.Probe{PeriodSeconds: 3}
		}},
		{name: "the image", change: func(c *v1.Container) { c.Image = "img:2" }, wantKill: true},
		{name: "the resources (a resize: never a restart its resizePolicy did not ask for)", change: func(c *v1.Container) {
			c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
		}},
		{name: "an older holdfast's container, same image, a defaulted field", change: func(c *v1.Container) {
			c.TerminationMessagePolicy = v1.TerminationMessageReadFile
		}, observed: func(o runtime.Container) runtime.Container { o.SpecHash = "0123456789abcdef"; return o }},
		{name: "an older holdfast's container, another image", change: func(c *v1.Container) { c.Image = "img:2" },
			observed: func(o runtime.Container) runtime.Container { o.SpecHash = "0123456789abcdef"; return o }, wantKill: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := base.DeepCopy()
			tc.change(&pod.Spec.Containers[0])
			observed := running
			if tc.observed != nil {
				observed = tc.observed(observed)
			}
			p := computePlan(pod, []runtime.Container{observed}, fakeBackoff{}, nil)
			if killed := len(p.kill) == 1; killed != tc.wantKill {
				t.Errorf("container killed: %v, want %v (plan %+v)", killed, tc.wantKill, p)
			}
		})
	}
	// A container that completed in a Never pod is not run again because its image changed.
	never := testPod(v1.RestartPolicyNever, "a")
	done := ctr(never, "a", 0, runtime.StateExited, 0)
	never.Spec.Containers[0].Image = "img:2"
	if p := computePlan(never, []runtime.Container{done}, fakeBackoff{}, nil); len(p.start) != 0 {
		t.Errorf("a completed container of a Never pod started again for a new image: %+v", p.start)
	}
}
