package pods

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

func TestComputeStatusPhases(t *testing.T) {
	now := time.Unix(2000, 0)
	for _, tc := range []struct {
		name       string
		pod        *v1.Pod
		observed   func(*v1.Pod) []runtime.Container
		waiting    map[string]waitingInfo
		backOff    map[string]time.Duration
		terminated bool
		phase      v1.PodPhase
		ready      bool
		reason     string // waiting reason of the first container, if any
	}{
		{name: "nothing created yet", pod: testPod(v1.RestartPolicyAlways, "a"),
			observed: func(*v1.Pod) []runtime.Container { return nil }, phase: v1.PodPending, reason: ReasonContainerCreating},
		{name: "image missing", pod: testPod(v1.RestartPolicyAlways, "a"),
			observed: func(*v1.Pod) []runtime.Container { return nil },
			waiting:  map[string]waitingInfo{"a": {ReasonErrImageNeverPull, "no image"}}, phase: v1.PodPending, reason: ReasonErrImageNeverPull},
		{name: "running", pod: testPod(v1.RestartPolicyAlways, "a", "b"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateRunning, 0), ctr(p, "b", 0, runtime.StateRunning, 0)}
			}, phase: v1.PodRunning, ready: true},
		{name: "one running one creating is pending", pod: testPod(v1.RestartPolicyAlways, "a", "b"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateRunning, 0)}
			},
			phase: v1.PodPending},
		{name: "crash loop stays running", pod: testPod(v1.RestartPolicyAlways, "a"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 3, runtime.StateExited, 1)}
			},
			backOff: map[string]time.Duration{"a": 40 * time.Second}, phase: v1.PodRunning, reason: ReasonCrashLoopBackOff},
		{name: "never + failure fails", pod: testPod(v1.RestartPolicyNever, "a"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateExited, 2)}
			},
			phase: v1.PodFailed},
		{name: "onFailure + success succeeds", pod: testPod(v1.RestartPolicyOnFailure, "a"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateExited, 0)}
			},
			phase: v1.PodSucceeded},
		{name: "container Always in a Never pod keeps it running", pod: withRestart(testPod(v1.RestartPolicyNever, "a"), v1.ContainerRestartPolicyAlways),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateExited, 1)}
			},
			backOff: map[string]time.Duration{"a": 10 * time.Second}, phase: v1.PodRunning, reason: ReasonCrashLoopBackOff},
		{name: "container Never in an Always pod ends it", pod: withRestart(testPod(v1.RestartPolicyAlways, "a"), v1.ContainerRestartPolicyNever),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateExited, 1)}
			},
			phase: v1.PodFailed},
		{name: "terminated pod with always policy is final", pod: testPod(v1.RestartPolicyAlways, "a"),
			observed: func(p *v1.Pod) []runtime.Container {
				return []runtime.Container{ctr(p, "a", 0, runtime.StateExited, 137)}
			}, terminated: true, phase: v1.PodFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := computeStatus(statusInput{pod: tc.pod, observed: tc.observed(tc.pod), waiting: tc.waiting, backOff: tc.backOff,
				terminated: tc.terminated, startTime: now, now: now, podIPs: []string{"10.1.0.5"}, hostIPs: []string{"192.0.2.1"}})
			if st.Phase != tc.phase {
				t.Errorf("phase %s, want %s", st.Phase, tc.phase)
			}
			if got := hasTrue(st, v1.PodReady); got != tc.ready {
				t.Errorf("Ready %v, want %v", got, tc.ready)
			}
			if tc.reason != "" {
				w := st.ContainerStatuses[0].State.Waiting
				if w == nil || w.Reason != tc.reason {
					t.Errorf("waiting %+v, want reason %s", w, tc.reason)
				}
			}
			if st.PodIP != "10.1.0.5" || st.HostIP != "192.0.2.1" || st.StartTime == nil || st.QOSClass != v1.PodQOSBestEffort {
				t.Errorf("ips/startTime/qos: %+v", st)
			}
		})
	}
}

func hasTrue(st v1.PodStatus, t v1.PodConditionType) bool {
	for _, c := range st.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// An unchanged pod computes an identical status (so nothing is written), and a restart keeps
// the previous termination as lastState with the restart count.
func TestComputeStatusStableAndLastState(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	first := ctr(pod, "a", 0, runtime.StateExited, 1)
	first.Reason, first.FinishedAt = runtime.ReasonError, time.Unix(1500, 0)
	obs := []runtime.Container{first, ctr(pod, "a", 1, runtime.StateRunning, 0)}
	in := statusInput{pod: pod, observed: obs, startTime: time.Unix(1000, 0), now: time.Unix(2000, 0)}
	st := computeStatus(in)
	cs := st.ContainerStatuses[0]
	if cs.RestartCount != 1 || cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 1 {
		t.Fatalf("restart count / lastState: %+v", cs)
	}
	pod.Status = st
	in.now = time.Unix(3000, 0)
	again := computeStatus(in)
	for i := range again.Conditions {
		if !again.Conditions[i].LastTransitionTime.Equal(&st.Conditions[i].LastTransitionTime) {
			t.Errorf("condition %s moved its transition time without changing", again.Conditions[i].Type)
		}
	}
	// Conditions owned by others are kept.
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: "DisruptionTarget", Status: v1.ConditionTrue, LastTransitionTime: metav1.Now()})
	if got := computeStatus(in); len(got.Conditions) != 5 {
		t.Errorf("foreign condition dropped: %+v", got.Conditions)
	}
}

// Ready needs every readiness gate's condition True in the pod's status, with kubelet's
// reason and message naming the gates that are not; ContainersReady does not look at gates.
func TestComputeStatusReadinessGates(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	pod.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: "example.com/lb"}, {ConditionType: "example.com/dns"}}
	in := statusInput{pod: pod, observed: []runtime.Container{ctr(pod, "a", 0, runtime.StateRunning, 0)}, now: time.Unix(2000, 0)}
	ready := func(st v1.PodStatus) v1.PodCondition {
		for _, c := range st.Conditions {
			if c.Type == v1.PodReady {
				return c
			}
		}
		t.Fatalf("no Ready condition in %+v", st.Conditions)
		return v1.PodCondition{}
	}
	st := computeStatus(in)
	want := `corresponding condition of pod readiness gate "example.com/lb" does not exist., corresponding condition of pod readiness gate "example.com/dns" does not exist.`
	if c := ready(st); c.Status != v1.ConditionFalse || c.Reason != ReasonReadinessGatesNotReady || c.Message != want {
		t.Errorf("no gate condition: Ready %+v", c)
	}
	if !hasTrue(st, v1.ContainersReady) {
		t.Errorf("ContainersReady must not wait for readiness gates: %+v", st.Conditions)
	}
	pod.Status.Conditions = []v1.PodCondition{{Type: "example.com/lb", Status: v1.ConditionTrue}, {Type: "example.com/dns", Status: v1.ConditionFalse}}
	if c := ready(computeStatus(in)); c.Status != v1.ConditionFalse || c.Message != `the status of pod readiness gate "example.com/dns" is not "True", but False` {
		t.Errorf("one gate False: Ready %+v", c)
	}
	pod.Status.Conditions[1].Status = v1.ConditionTrue
	st = computeStatus(in)
	if c := ready(st); c.Status != v1.ConditionTrue {
		t.Errorf("every gate True: Ready %+v", c)
	}
	if len(st.Conditions) != 6 {
		t.Errorf("the gates' conditions must be kept as their writers set them: %+v", st.Conditions)
	}
}

// A pod past its activeDeadlineSeconds is Failed with kubelet's reason and message.
func TestComputeStatusDeadlineExceeded(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	st := computeStatus(statusInput{pod: pod, observed: []runtime.Container{ctr(pod, "a", 0, runtime.StateExited, 137)},
		deadlineExceeded: true, now: time.Unix(2000, 0)})
	if st.Phase != v1.PodFailed || st.Reason != "DeadlineExceeded" || st.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("status %s %q %q", st.Phase, st.Reason, st.Message)
	}
	if hasTrue(st, v1.PodReady) {
		t.Error("a failed pod is not Ready")
	}
}

// An evicted pod is Failed with reason Evicted, the eviction's message, and kubelet's
// DisruptionTarget condition.
func TestComputeStatusEvicted(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	const msg = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
	st := computeStatus(statusInput{pod: pod, observed: []runtime.Container{ctr(pod, "a", 0, runtime.StateExited, 137)},
		evicted: &evictionOrder{grace: time.Second, message: msg}, now: time.Unix(2000, 0)})
	if st.Phase != v1.PodFailed || st.Reason != "Evicted" || st.Message != msg {
		t.Errorf("status %s %q %q", st.Phase, st.Reason, st.Message)
	}
	if !hasTrue(st, v1.DisruptionTarget) || hasTrue(st, v1.PodReady) {
		t.Errorf("want DisruptionTarget True and not Ready: %+v", st.Conditions)
	}
}

// Termination messages land in state.terminated and lastState.terminated, each cut to its
// container's share of kubelet's 12 KiB per pod.
func TestComputeStatusTerminationMessages(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a", "b", "c", "d")
	var obs []runtime.Container
	msgs := map[string]string{}
	for _, name := range []string{"a", "b", "c", "d"} {
		old := ctr(pod, name, 0, runtime.StateExited, 1)
		old.ID = name + "-0"
		cur := ctr(pod, name, 1, runtime.StateExited, 2)
		cur.ID = name + "-1"
		obs = append(obs, old, cur)
		msgs[old.ID] = "first " + name
		msgs[cur.ID] = strings.Repeat(name, 4096)
	}
	st := computeStatus(statusInput{pod: pod, observed: obs, messages: msgs, now: time.Unix(2000, 0)})
	for _, cs := range st.ContainerStatuses {
		if got := cs.LastTerminationState.Terminated.Message; got != "first "+cs.Name {
			t.Errorf("%s lastState message %q", cs.Name, got)
		}
		if got := cs.State.Terminated.Message; got != strings.Repeat(cs.Name, 3072) {
			t.Errorf("%s message of %d bytes, want its 3072-byte share", cs.Name, len(got))
		}
	}
}

// A container that ran reports its resources and allocated requests as the kubelet does (the
// conformance suite's resize tests read them); one that never ran reports neither.
func TestComputeStatusContainerResources(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a", "b")
	want := v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("128Mi")},
	}
	pod.Spec.Containers[0].Resources = want
	pod.Spec.Containers[1].Resources = want
	st := computeStatus(statusInput{pod: pod, observed: []runtime.Container{ctr(pod, "a", 0, runtime.StateRunning, 0)},
		startTime: time.Unix(1000, 0), now: time.Unix(2000, 0)})
	a, b := st.ContainerStatuses[0], st.ContainerStatuses[1]
	if a.Resources == nil || !equality.Semantic.DeepEqual(*a.Resources, want) || !equality.Semantic.DeepEqual(a.AllocatedResources, want.Requests) {
		t.Errorf("running container: resources %+v allocated %+v, want %+v", a.Resources, a.AllocatedResources, want)
	}
	if b.Resources != nil || b.AllocatedResources != nil {
		t.Errorf("container that never ran: resources %+v allocated %+v, want none", b.Resources, b.AllocatedResources)
	}
	// A copy: the status never shares maps with the spec it was computed from.
	a.Resources.Requests[v1.ResourceCPU] = resource.MustParse("1")
	if q := pod.Spec.Containers[0].Resources.Requests[v1.ResourceCPU]; q.String() != "100m" {
		t.Errorf("the status aliases the spec: spec cpu now %s", q.String())
	}
}

// A pod whose first init container fails reports every container not yet created as waiting
// in PodInitializing, the init containers after it included, as kubelet does (the upstream
// test "should not start app containers if init containers fail on a RestartAlways pod").
func TestComputeStatusInitContainersNotStarted(t *testing.T) {
	now := time.Unix(2000, 0)
	pod := testPod(v1.RestartPolicyAlways, "run1")
	pod.Spec.InitContainers = []v1.Container{{Name: "init1", Image: "img"}, {Name: "init2", Image: "img"}}
	failed := runtime.Container{
		ID: runtime.ContainerID(string(pod.UID), "init1", 0), PodUID: string(pod.UID), Name: "init1",
		State: runtime.StateExited, ExitCode: 1, SpecHash: containerHash(&pod.Spec.InitContainers[0]),
	}
	st := computeStatus(statusInput{pod: pod, observed: []runtime.Container{failed}, startTime: now, now: now})
	for _, cs := range append(st.InitContainerStatuses[1:], st.ContainerStatuses...) {
		if w := cs.State.Waiting; w == nil || w.Reason != ReasonPodInitializing {
			t.Errorf("container %s: state %+v, want waiting in %s", cs.Name, cs.State, ReasonPodInitializing)
		}
	}
	if st.Phase != v1.PodPending {
		t.Errorf("phase %s, want Pending", st.Phase)
	}
	// init1 is retried: running again, it is still incomplete (kubelet counts a regular init
	// container complete once it succeeded, a sidecar once it started).
	retry := failed
	retry.ID, retry.Attempt, retry.State = runtime.ContainerID(string(pod.UID), "init1", 1), 1, runtime.StateRunning
	st = computeStatus(statusInput{pod: pod, observed: []runtime.Container{failed, retry}, startTime: now, now: now})
	for _, c := range st.Conditions {
		if c.Type == v1.PodInitialized && c.Message != "containers with incomplete status: [init1 init2]" {
			t.Errorf("Initialized %+v, want both init containers incomplete", c)
		}
	}
}

// A sidecar (restartable init container) counts in ContainersReady and Ready as kubelet counts
// it: a pod whose sidecar's readiness probe has not passed is not Ready.
func TestComputeStatusSidecarReadiness(t *testing.T) {
	now := time.Unix(2000, 0)
	pod := testPod(v1.RestartPolicyAlways, "main")
	always := v1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []v1.Container{{Name: "web", Image: "img", RestartPolicy: &always}}
	sidecar := runtime.Container{
		ID: runtime.ContainerID(string(pod.UID), "web", 0), PodUID: string(pod.UID), Name: "web",
		State: runtime.StateRunning, SpecHash: containerHash(&pod.Spec.InitContainers[0]),
	}
	in := statusInput{pod: pod, observed: []runtime.Container{sidecar, ctr(pod, "main", 0, runtime.StateRunning, 0)}, now: now,
		ready: map[string]bool{"web": false, "main": true}, started: map[string]bool{"web": true, "main": true}}
	st := computeStatus(in)
	for _, ct := range []v1.PodConditionType{v1.ContainersReady, v1.PodReady} {
		for _, c := range st.Conditions {
			if c.Type == ct && (c.Status != v1.ConditionFalse || c.Message != "containers with unready status: [web]") {
				t.Errorf("sidecar not ready: %s %+v", ct, c)
			}
		}
	}
	in.ready["web"] = true
	if st := computeStatus(in); !hasTrue(st, v1.PodReady) || !hasTrue(st, v1.ContainersReady) {
		t.Errorf("every container ready, the pod is not: %+v", st.Conditions)
	}
}

// Every pod reports its allocated requests and effective resources as a whole, as the kubelet
// does with InPlacePodLevelResourcesVerticalScaling (on by default in 1.37), and as the upstream
// pod-level resize tests check: the pod-level requests when the pod has them, its containers'
// added up otherwise (an init container counting as the scheduler counts it).
func TestPodLevelStatusResources(t *testing.T) {
	rl := func(cpu, mem string) v1.ResourceList {
		return v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}
	}
	containers := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}, Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: rl("500m", "16Mi")}}},
		Containers: []v1.Container{
			{Name: "a", Resources: v1.ResourceRequirements{Requests: rl("100m", "32Mi"), Limits: rl("200m", "64Mi")}},
			{Name: "b", Resources: v1.ResourceRequirements{Requests: rl("150m", "32Mi"), Limits: rl("300m", "64Mi")}},
		},
	}}
	st := computeStatus(statusInput{pod: containers})
	if got, want := st.AllocatedResources, rl("500m", "64Mi"); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("allocatedResources of a pod without pod-level resources %v, want %v (the init container's CPU, the containers' memory)", got, want)
	}
	if got, want := st.Resources, (&v1.ResourceRequirements{Requests: rl("500m", "64Mi"), Limits: rl("500m", "128Mi")}); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("resources of a pod without pod-level resources %v, want %v", got, want)
	}

	podLevel := containers.DeepCopy()
	podLevel.Spec.Resources = &v1.ResourceRequirements{Requests: rl("1", "256Mi"), Limits: rl("2", "512Mi")}
	st = computeStatus(statusInput{pod: podLevel})
	if got, want := st.AllocatedResources, rl("1", "256Mi"); !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("allocatedResources of a pod with pod-level resources %v, want its pod-level requests %v", got, want)
	}
	if got, want := st.Resources, podLevel.Spec.Resources; !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("resources of a pod with pod-level resources %v, want %v", got, want)
	}
}
