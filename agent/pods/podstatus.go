package pods

import (
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// Waiting reasons, named as kubelet names them so that users and tools recognise them.
const (
	ReasonContainerCreating       = "ContainerCreating"
	ReasonPodInitializing         = "PodInitializing"
	ReasonCrashLoopBackOff        = "CrashLoopBackOff"
	ReasonErrImageNeverPull       = "ErrImageNeverPull"
	ReasonErrImagePull            = "ErrImagePull"
	ReasonImagePullBackOff        = "ImagePullBackOff"
	ReasonCreateContainerError    = "CreateContainerError"
	ReasonCreateContainerConfig   = "CreateContainerConfigError"
	ReasonRunContainerError       = "RunContainerError"
	ReasonCreatePodSandboxError   = "CreatePodSandboxError"
	ReasonContainersNotReady      = "ContainersNotReady"
	ReasonPodCompleted            = "PodCompleted"
	ReasonContainersNotInitialzed = "ContainersNotInitialized"
	ReasonReadinessGatesNotReady  = "ReadinessGatesNotReady"
)

// The pod's reason and message once it ran longer than spec.activeDeadlineSeconds, as kubelet
// reports them.
const (
	ReasonDeadlineExceeded  = "DeadlineExceeded"
	MessageDeadlineExceeded = "Pod was active on the node longer than the specified deadline"
)

// ReasonEvicted is the reason of a pod evicted for node pressure (see agent/eviction).
const ReasonEvicted = "Evicted"

// maxPodTerminationMessages is kubelet's MaxPodTerminationMessageLogLength: the termination
// messages of all of a pod's containers together, split evenly between them.
const maxPodTerminationMessages = 12 * 1024

// ReasonPullFailedUsingCachedImage is holdfast's own event reason (kubelet has none): with
// imagePullPolicy Always the registry could not be reached and the image present was used.
const ReasonPullFailedUsingCachedImage = "PullFailedUsingCachedImage"

// waitingInfo is why a container is not running yet, as the last sync found out.
type waitingInfo struct {
	reason, message string
}

// statusInput is everything the status of a pod is computed from.
type statusInput struct {
	pod        *v1.Pod
	observed   []runtime.Container
	waiting    map[string]waitingInfo
	backOff    map[string]time.Duration
	podIPs     []string
	hostIPs    []string
	startTime  time.Time
	terminated bool // the pod is being or has been torn down
	now        time.Time
	// ready and started are the prober's answers for the running containers; nil means no
	// prober: a running container is started and ready.
	ready, started map[string]bool
	// messages are the termination messages of exited containers, by container ID.
	messages map[string]string
	// deadlineExceeded: the pod ran longer than spec.activeDeadlineSeconds and is Failed.
	deadlineExceeded bool
	// evicted: the pod was evicted for node pressure and is Failed.
	evicted *evictionOrder
	// applied is what the running containers' cgroups hold, read back, by container ID; want
	// what each container is to run with (its allocation); nil: not read, the allocation is
	// reported. resize are the pod's resize conditions.
	applied map[string]runtime.Resources
	want    func(*v1.Container) runtime.Resources
	resize  []v1.PodCondition
	// podCgroup is what the pod's cgroup holds, read back, while the pod runs; nil: not read
	// (no pod cgroups, or the pod does not run), the allocation is reported.
	podCgroup *cgroups.Settings
}

// computeStatus derives the pod's status from observed state alone. Condition transition
// times are kept from the pod's previous status when a condition did not change, so an
// unchanged pod produces an identical status and no write.
func computeStatus(in statusInput) v1.PodStatus {
	pod := in.pod
	old := pod.Status
	byName := groupByName(in.observed)
	// As the kubelet with InPlacePodLevelResourcesVerticalScaling (beta, on by default in 1.37),
	// for every pod: its requests as allocated (summed as the scheduler counts them, the
	// pod-level ones when it has them), and its resources: a running pod's read back from its
	// cgroup, any other's the allocation's.
	resources := effectivePodResources(pod)
	allocatedRequests := resources.Requests.DeepCopy()
	if in.podCgroup != nil && old.Phase == v1.PodRunning {
		resources = runningPodResources(pod, *in.podCgroup, old.Resources)
	}
	st := v1.PodStatus{
		QOSClass:           podutil.ComputePodQOS(pod),
		AllocatedResources: allocatedRequests,
		Resources:          resources,
	}
	if !in.startTime.IsZero() {
		t := metav1.NewTime(in.startTime)
		st.StartTime = &t
	}
	if old.StartTime != nil {
		st.StartTime = old.StartTime
	}
	for _, ip := range in.hostIPs {
		st.HostIPs = append(st.HostIPs, v1.HostIP{IP: ip})
	}
	if len(in.hostIPs) > 0 {
		st.HostIP = in.hostIPs[0]
	}
	ips := podAddresses(pod, in.podIPs, in.hostIPs)
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, v1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		st.PodIP = ips[0]
	}

	var started startedFunc // nil without a prober: every running container has started
	if in.started != nil {
		started = func(name string) bool { return in.started[name] }
	}
	isInit := initialized(pod, byName, started)
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cs := containerStatus(c, byName[c.Name], in)
		if len(byName[c.Name]) == 0 && cs.State.Waiting != nil && cs.State.Waiting.Reason == ReasonContainerCreating {
			// kubelet's default waiting reason for every container of a pod with init
			// containers, its init containers included.
			cs.State.Waiting.Reason = ReasonPodInitializing
		}
		if !isSidecar(c) {
			// kubelet reports a regular init container ready once it completed, never while
			// it runs.
			cs.Ready = cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := containerStatus(c, byName[c.Name], in)
		if !isInit && len(byName[c.Name]) == 0 && cs.State.Waiting != nil && cs.State.Waiting.Reason == ReasonContainerCreating {
			cs.State.Waiting.Reason = ReasonPodInitializing
		}
		if prev := findContainerStatus(old.ContainerStatuses, c.Name); prev != nil && cs.State.Waiting != nil &&
			cs.State.Waiting.Reason == ReasonContainerCreating && prev.State.Waiting != nil {
			// Keep a more specific waiting reason from the previous status until something changes.
			cs.State.Waiting = prev.State.Waiting
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	for _, c := range ephemeralContainers(pod) {
		cs := containerStatus(c, byName[c.Name], in)
		cs.Ready = false // no readiness for ephemeral containers: they serve nothing
		st.EphemeralContainerStatuses = append(st.EphemeralContainerStatuses, cs)
	}
	st.Phase = podPhase(pod, st.ContainerStatuses, in.terminated)
	switch {
	case in.evicted != nil:
		st.Phase, st.Reason, st.Message = v1.PodFailed, ReasonEvicted, in.evicted.message
	case in.deadlineExceeded:
		st.Phase, st.Reason, st.Message = v1.PodFailed, ReasonDeadlineExceeded, MessageDeadlineExceeded
	case initFailed(pod, byName, started):
		st.Phase = v1.PodFailed
	case !isInit && !podutil.IsTerminal(st.Phase):
		st.Phase = v1.PodPending
	}
	unready := unreadyContainers(pod, st)
	allReady := len(unready) == 0 && st.Phase == v1.PodRunning
	initCond := condition(old, v1.PodInitialized, true, "", "", in.now)
	if !isInit {
		initCond = condition(old, v1.PodInitialized, false, ReasonContainersNotInitialzed, notInitializedMessage(pod, st), in.now)
	}
	st.Conditions = []v1.PodCondition{
		condition(old, v1.PodScheduled, true, "", "", in.now),
		initCond,
		containersReady(old, allReady, unready, in.now),
		readyCondition(old, pod.Spec.ReadinessGates, allReady, unready, in.now),
	}
	if podutil.IsTerminal(st.Phase) {
		st.Conditions[2] = condition(old, v1.ContainersReady, false, ReasonPodCompleted, "", in.now)
		st.Conditions[3] = condition(old, v1.PodReady, false, ReasonPodCompleted, "", in.now)
	}
	if in.evicted != nil {
		// As kubelet's eviction manager: the pod says it was disrupted by the node.
		c := condition(old, v1.DisruptionTarget, true, v1.PodReasonTerminationByKubelet, in.evicted.message, in.now)
		st.Conditions = append(st.Conditions, c)
	}
	// The status and the conditions computed here describe the spec of this generation
	// (kubelet's PodObservedGenerationTracking, GA since 1.35); the status never goes back.
	st.ObservedGeneration = max(pod.Generation, old.ObservedGeneration)
	for i := range st.Conditions {
		st.Conditions[i].ObservedGeneration = pod.Generation
	}
	// The resize conditions carry the generation of the resize they are about.
	st.Conditions = append(st.Conditions, in.resize...)
	// Conditions other writers own (DisruptionTarget, readiness gates...) are kept as they are.
	for _, oc := range old.Conditions {
		if !status.OwnedCondition(oc.Type) && !(in.evicted != nil && oc.Type == v1.DisruptionTarget) {
			st.Conditions = append(st.Conditions, oc)
		}
	}
	return st
}

func containersReady(old v1.PodStatus, ok bool, unready []string, now time.Time) v1.PodCondition {
	if ok {
		return condition(old, v1.ContainersReady, true, "", "", now)
	}
	return condition(old, v1.ContainersReady, false, ReasonContainersNotReady, notReadyMessage(unready), now)
}

// readyCondition is kubelet's GeneratePodReadyCondition: Ready once the containers are, and
// every readiness gate's condition (set by other writers, read from the pod's status) is True.
func readyCondition(old v1.PodStatus, gates []v1.PodReadinessGate, ok bool, unready []string, now time.Time) v1.PodCondition {
	if !ok {
		return condition(old, v1.PodReady, false, ReasonContainersNotReady, notReadyMessage(unready), now)
	}
	var gatesUnready []string
	for _, g := range gates {
		var gc *v1.PodCondition
		for i := range old.Conditions {
			if old.Conditions[i].Type == g.ConditionType {
				gc = &old.Conditions[i]
			}
		}
		switch {
		case gc == nil:
			gatesUnready = append(gatesUnready, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", string(g.ConditionType)))
		case gc.Status != v1.ConditionTrue:
			gatesUnready = append(gatesUnready, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", string(g.ConditionType), gc.Status))
		}
	}
	if len(gatesUnready) > 0 {
		return condition(old, v1.PodReady, false, ReasonReadinessGatesNotReady, strings.Join(gatesUnready, ", "), now)
	}
	return condition(old, v1.PodReady, true, "", "", now)
}

// notInitializedMessage names the init containers the pod's initialization waits for, as
// kubelet's GeneratePodInitializedCondition: a regular one until it succeeded (Ready), a
// sidecar until it started.
func notInitializedMessage(pod *v1.Pod, st v1.PodStatus) string {
	var names []string
	for i, cs := range st.InitContainerStatuses {
		done := cs.Ready
		if isSidecar(&pod.Spec.InitContainers[i]) {
			done = cs.Started != nil && *cs.Started
		}
		if !done {
			names = append(names, cs.Name)
		}
	}
	return fmt.Sprintf("containers with incomplete status: %v", names)
}

// unreadyContainers are the containers the pod's readiness waits for, in kubelet's order: the
// sidecars (restartable init containers), then the app containers.
func unreadyContainers(pod *v1.Pod, st v1.PodStatus) []string {
	var names []string
	for i, cs := range st.InitContainerStatuses {
		if isSidecar(&pod.Spec.InitContainers[i]) && !cs.Ready {
			names = append(names, cs.Name)
		}
	}
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready {
			names = append(names, cs.Name)
		}
	}
	return names
}

func notReadyMessage(unready []string) string {
	return fmt.Sprintf("containers with unready status: %v", unready)
}

// condition builds a condition, keeping the previous transition time if its status is the same.
func condition(old v1.PodStatus, t v1.PodConditionType, ok bool, reason, msg string, now time.Time) v1.PodCondition {
	status := v1.ConditionFalse
	if ok {
		status = v1.ConditionTrue
	}
	c := v1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}
	for _, oc := range old.Conditions {
		if oc.Type == t && oc.Status == status {
			c.LastTransitionTime = oc.LastTransitionTime
		}
	}
	return c
}

// effectivePodResources are the pod's resources as a whole, as allocated: its pod-level ones
// (claims kept), with requests and limits those of the pod (the pod-level ones, or its
// containers' added up as the scheduler adds them), as the kubelet's
// getEffectiveAllocatedResources.
func effectivePodResources(pod *v1.Pod) *v1.ResourceRequirements {
	r := pod.Spec.Resources.DeepCopy()
	if r == nil {
		r = &v1.ResourceRequirements{}
	}
	r.Requests = resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	r.Limits = resourcehelper.PodLimits(pod, resourcehelper.PodResourcesOptions{})
	return r
}

func containerStatus(c *v1.Container, attempts []runtime.Container, in statusInput) v1.ContainerStatus {
	cs := v1.ContainerStatus{Name: c.Name, Image: c.Image}
	f := false
	cs.Started = &f
	if len(attempts) == 0 {
		cs.State.Waiting = waitingState(c.Name, in)
		return cs
	}
	latest := attempts[len(attempts)-1]
	cs.RestartCount = int32(latest.Attempt)
	cs.ContainerID = "containerd://" + latest.ID
	cs.ImageID = latest.ImageRef
	// As the kubelet with in-place resize (GA): c is the container as allocated. A running
	// container reports what its cgroup holds, read back; any other its allocation; a
	// container that never ran reports neither.
	cs.Resources = c.Resources.DeepCopy()
	if got, ok := in.applied[latest.ID]; ok && latest.State == runtime.StateRunning && in.want != nil {
		cs.Resources = statusResources(c.Resources, in.want(c), got)
	}
	cs.AllocatedResources = c.Resources.Requests.DeepCopy()
	terminatedState := func(c runtime.Container) *v1.ContainerStateTerminated {
		return terminatedStateOf(c, in.messages[c.ID], messageBudget(in.pod))
	}
	if len(attempts) > 1 {
		prev := attempts[len(attempts)-2]
		if prev.State == runtime.StateExited {
			cs.LastTerminationState.Terminated = terminatedState(prev)
		}
	}
	switch latest.State {
	case runtime.StateRunning:
		started := in.started == nil || in.started[c.Name]
		cs.Started = &started
		cs.Ready = !in.terminated && started && (in.ready == nil || in.ready[c.Name])
		cs.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(latest.StartedAt)}
	case runtime.StateExited:
		if d, ok := in.backOff[c.Name]; ok && !in.terminated {
			cs.State.Waiting = &v1.ContainerStateWaiting{
				Reason:  ReasonCrashLoopBackOff,
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, c.Name, in.pod.Name, in.pod.Namespace, in.pod.UID),
			}
			cs.LastTerminationState.Terminated = terminatedState(latest)
		} else if w, ok := in.waiting[c.Name]; ok && !in.terminated {
			cs.State.Waiting = &v1.ContainerStateWaiting{Reason: w.reason, Message: w.message}
			cs.LastTerminationState.Terminated = terminatedState(latest)
		} else {
			cs.State.Terminated = terminatedState(latest)
		}
	default:
		cs.State.Waiting = waitingState(c.Name, in)
	}
	return cs
}

func waitingState(name string, in statusInput) *v1.ContainerStateWaiting {
	if w, ok := in.waiting[name]; ok {
		return &v1.ContainerStateWaiting{Reason: w.reason, Message: w.message}
	}
	return &v1.ContainerStateWaiting{Reason: ReasonContainerCreating}
}

// terminatedStateOf reports an exited container. Its termination message (read from its
// terminationMessagePath or its log) follows the runtime's own message as in kubelet, and the
// whole is cut to the container's share of the pod's budget, as kubelet's status manager does.
func terminatedStateOf(c runtime.Container, termMessage string, budget int) *v1.ContainerStateTerminated {
	msg := c.Message
	if termMessage != "" {
		if msg != "" {
			msg += ": "
		}
		msg += termMessage
	}
	if len(msg) > budget {
		msg = msg[:budget]
	}
	return &v1.ContainerStateTerminated{
		ExitCode:    c.ExitCode,
		Reason:      c.Reason,
		Message:     msg,
		StartedAt:   metav1.NewTime(c.StartedAt),
		FinishedAt:  metav1.NewTime(c.FinishedAt),
		ContainerID: "containerd://" + c.ID,
	}
}

// podPhase follows kubelet's getPhase (with ContainerRestartRules) for the app containers
// (statuses, in spec order): a container waiting to restart counts as stopped, one that never
// ran as waiting. Stopped containers keep the pod Running while one of them will be
// restarted (shouldRestart). A pod being torn down whose containers have all stopped is
// terminal whatever its restart policy.
func podPhase(pod *v1.Pod, statuses []v1.ContainerStatus, terminated bool) v1.PodPhase {
	var running, waiting, stopped, failed, restarting int
	for i, cs := range statuses {
		last := cs.State.Terminated
		if last == nil && cs.State.Running == nil {
			last = cs.LastTerminationState.Terminated
		}
		switch {
		case cs.State.Running != nil:
			running++
		case last != nil:
			stopped++
			if last.ExitCode != 0 {
				failed++
			}
			if shouldRestart(&pod.Spec.Containers[i], pod.Spec.RestartPolicy, last.ExitCode) {
				restarting++
			}
		default:
			waiting++
		}
	}
	switch {
	case terminated && running == 0 && stopped > 0:
		if failed > 0 {
			return v1.PodFailed
		}
		return v1.PodSucceeded
	case waiting > 0:
		return v1.PodPending
	case running > 0:
		return v1.PodRunning
	case restarting > 0:
		return v1.PodRunning
	case stopped > 0 && failed > 0:
		return v1.PodFailed
	case stopped > 0:
		return v1.PodSucceeded
	}
	return v1.PodPending
}

func messageBudget(pod *v1.Pod) int {
	if n := len(pod.Spec.Containers) + len(pod.Spec.InitContainers); n > 0 {
		return maxPodTerminationMessages / n
	}
	return maxPodTerminationMessages
}

func findContainerStatus(list []v1.ContainerStatus, name string) *v1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

// The kubelet's floors below which a pod cgroup's CPU read back is not reported over the
// allocation (cm.MinShares, cm.MinMilliCPULimit).
const (
	minReportedShares    = podcgroups.MinShares
	minReportedMilliCPUs = 10
)

// runningPodResources are a running pod's resources as its pod cgroup holds them (got, read
// back), as the kubelet's convertToAPIPodLevelResourcesStatus gives them: the pod-level
// resources as allocated, with the CPU request from the cgroup's shares, the CPU limit from
// its CFS quota and the memory limit from its limit, where the cgroup has them (a pod's
// resize not yet applied shows, and a pod whose containers are not all limited has no pod
// limit); the memory request is the pod's requests added up. Where the cgroup holds the
// allocation (the shares of its CPU request, its memory limit rounded down to a page) the
// allocation's value is kept, as the kubelet keeps a CPU request through cgroup v2's rounding.
// A limit the cgroup does not have keeps the previous status's (old) value, as the kubelet's.
func runningPodResources(pod *v1.Pod, got cgroups.Settings, old *v1.ResourceRequirements) *v1.ResourceRequirements {
	r := pod.Spec.Resources.DeepCopy()
	if r == nil {
		r = &v1.ResourceRequirements{}
	}
	if r.Requests == nil {
		r.Requests = v1.ResourceList{}
	}
	if r.Limits == nil {
		r.Limits = v1.ResourceList{}
	}
	if old == nil {
		old = &v1.ResourceRequirements{}
	}
	keepOld := func(name v1.ResourceName, from, to v1.ResourceList) {
		if q, ok := from[name]; ok {
			to[name] = q.DeepCopy()
		}
	}
	if got.CPUShares > 0 {
		milli := podcgroups.SharesToMilliCPU(got.CPUShares)
		allocated := r.Requests.Cpu().MilliValue()
		if (milli > minReportedShares || allocated > minReportedShares) && !podcgroups.SharesMatch(podcgroups.MilliCPUToShares(allocated), got.CPUShares) {
			r.Requests[v1.ResourceCPU] = *resourceMilli(milli)
		}
	} else {
		keepOld(v1.ResourceCPU, old.Requests, r.Requests)
	}
	if _, ok := r.Requests[v1.ResourceMemory]; !ok {
		if q, ok := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})[v1.ResourceMemory]; ok {
			r.Requests[v1.ResourceMemory] = q
		}
	}
	if got.CPUQuota > 0 && got.CPUPeriod > 0 {
		if milli := got.CPUQuota * podcgroups.MilliCPUToCPU / got.CPUPeriod; milli > minReportedMilliCPUs || r.Limits.Cpu().MilliValue() > minReportedMilliCPUs {
			r.Limits[v1.ResourceCPU] = *resourceMilli(milli)
		}
	} else {
		keepOld(v1.ResourceCPU, old.Limits, r.Limits)
	}
	if got.MemoryLimit > 0 {
		if q, ok := r.Limits[v1.ResourceMemory]; !ok || !podcgroups.MemoryMatches(q.Value(), got.MemoryLimit) {
			r.Limits[v1.ResourceMemory] = *resourceBytes(got.MemoryLimit)
		}
	} else {
		keepOld(v1.ResourceMemory, old.Limits, r.Limits)
	}
	return r
}
