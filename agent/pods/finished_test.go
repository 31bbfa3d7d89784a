package pods_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// hollowNode runs a pods manager on the hollow runtime, its statuses kept in memory.
type hollowNode struct {
	rt     *hollow.Runtime
	store  *offline.MemStore
	mgr    *pods.Manager
	status *status.Manager
	stop   func()
	// ready and staticReady are what the manager is told of its sources.
	ready, staticReady atomic.Bool
	// usage measures containers for the manager (nil: none).
	usage pods.ContainerUsage
	// records is the store as the manager sees it (nil: store itself): a test wraps it to
	// hold a call at the moment it is about.
	records pods.Records
	// recorder receives the manager's events (nil: none are recorded).
	recorder record.EventRecorder
	// probes, when set, runs the pods' probes (a prober the node starts with the manager);
	// nil: no prober.
	probes prober.Handler
	// wrap, when set, is the runtime the manager is given in place of rt (a test changes what
	// some of its calls answer).
	wrap func(*hollow.Runtime) runtime.Runtime
	// stateDir is the manager's state directory of the current run (pod directories below).
	stateDir string
}

func startHollowNode(t *testing.T) *hollowNode { return startHollowNodeWith(t, nil) }

// startHollowNodeWith starts a ready node (its static pods read) whose admission is admitter.
func startHollowNodeWith(t *testing.T, admitter pods.Admitter) *hollowNode {
	t.Helper()
	return startReady(t, &hollowNode{rt: hollow.NewRuntime()}, admitter)
}

// startReady starts n, a node a test set up (its probes, a wrapped runtime), ready and its
// static pods read, with a store in memory unless it has one.
func startReady(t *testing.T, n *hollowNode, admitter pods.Admitter) *hollowNode {
	t.Helper()
	if n.store == nil {
		n.store = offline.NewMemStore(nil)
	}
	n.ready.Store(true)
	n.staticReady.Store(true)
	n.start(t, admitter)
	return n
}

// start starts (again, after stop: an agent restart on the same runtime and store) the
// manager, with admitter as its admission chain.
func (n *hollowNode) start(t *testing.T, admitter pods.Admitter) {
	t.Helper()
	dir := t.TempDir()
	n.stateDir = filepath.Join(dir, "state")
	log := slog.New(slog.DiscardHandler)
	n.status = status.NewManager(nil, n.store, "gw", log)
	n.mgr = pods.NewManager(pods.Config{
		StateDir: filepath.Join(dir, "state"), PodLogDir: filepath.Join(dir, "logs"), RelistPeriod: 50 * time.Millisecond, NodeName: "gw",
		Volumes:        volumes.NewManager(filepath.Join(dir, "state", "pods"), nil, nil, log, volumes.Options{PlainDirs: true}),
		HostResolvConf: filepath.Join(dir, "resolv.conf"), HostsFile: filepath.Join(dir, "hosts"),
		Usage: n.usage,
	}, n.runtime(), hollow.NewNetwork("gw"), n.status, n.recorder, log)
	var records pods.Records = n.store
	if n.records != nil {
		records = n.records
	}
	n.mgr.SetAdmission(admitter, records)
	if ra, ok := admitter.(pods.ResizeAdmitter); ok {
		n.mgr.SetResizeAdmission(ra)
	}
	n.mgr.SetSourcesReady(n.ready.Load)
	n.mgr.SetStaticSourceReady(n.staticReady.Load)
	ctx, cancel := context.WithCancel(context.Background())
	var probing chan error
	if n.probes != nil {
		mgr := n.mgr
		pm := prober.NewManager(prober.Config{Handler: n.probes, OnStatusChange: mgr.Resync,
			OnContainerUnhealthy: func(uid types.UID, _, _, _ string) { mgr.Resync(uid) }})
		n.mgr.SetProber(pm, nil)
		probing = make(chan error, 1)
		go func() { probing <- pm.Run(ctx) }()
	}
	done := make(chan error)
	go func() { done <- n.mgr.Run(ctx) }()
	stopped := false
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if probing != nil {
			<-probing
		}
	}
	t.Cleanup(n.stop)
}

// runtime is the runtime the manager is given.
func (n *hollowNode) runtime() runtime.Runtime {
	if n.wrap != nil {
		return n.wrap(n.rt)
	}
	return n.rt
}

// running is the pod UIDs with a running container.
func (n *hollowNode) running(t *testing.T) map[types.UID]bool {
	t.Helper()
	cs, err := n.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]bool{}
	for _, c := range cs {
		if c.State == runtime.StateRunning {
			out[types.UID(c.PodUID)] = true
		}
	}
	return out
}

// eventually waits until ok holds.
func eventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// staticPod is a static pod of the manifest at path, its one container running command.
func staticPod(t *testing.T, name, path string, command ...string) *v1.Pod {
	t.Helper()
	pod := &v1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "busybox", Command: command}}}}
	if err := manifest.MakeStatic(pod, "gw", path); err != nil {
		t.Fatal(err)
	}
	return pod
}

// waitStatus waits until the pod's status satisfies ok.
func (n *hollowNode) waitStatus(t *testing.T, pod *v1.Pod, what string, ok func(v1.PodStatus) bool) v1.PodStatus {
	t.Helper()
	var st v1.PodStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var found bool
		if st, found = n.status.Get(pod.UID); found && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: status %+v", what, st)
		}
	}
}

func jobPod(uid string, command ...string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "job-" + uid, UID: types.UID(uid)},
		Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyNever, NodeName: "gw",
			Containers: []v1.Container{{Name: "work", Image: "busybox", Command: command}}},
	}
}

// A pod whose status in its source says it finished (a Job's pod that Succeeded, reported
// before an agent restart or a reboot that lost its containers, or an offline boot from its
// record) is never started again, and its status stays what it was: as the kubelet. Before,
// the worker found no container and ran the Job's work a second time.
func TestPodFinishedInItsSourceNotStartedAgain(t *testing.T) {
	n := startHollowNode(t)
	pod := jobPod("done", "sleep", "3600")
	pod.Status = v1.PodStatus{Phase: v1.PodSucceeded, Reason: "", Message: "ran before"}
	n.mgr.Update(pod)
	st := n.waitStatus(t, pod, "the finished pod's status", func(v1.PodStatus) bool { return true })
	time.Sleep(300 * time.Millisecond) // some relists and syncs
	if cs, _ := n.rt.List(context.Background()); len(cs) != 0 {
		t.Errorf("a pod that finished before was run again: %d containers", len(cs))
	}
	if st, _ = n.status.Get(pod.UID); st.Phase != v1.PodSucceeded || st.Message != "ran before" {
		t.Errorf("status = %s %q, want Succeeded as its source had it", st.Phase, st.Message)
	}
}

// A pod that finished on its own (Succeeded) is past its activeDeadlineSeconds' reach: when the
// deadline passes it stays Succeeded. Before, the worker kept counting and reported it Failed,
// DeadlineExceeded, once the deadline was past.
func TestDeadlineDoesNotFailAFinishedPod(t *testing.T) {
	n := startHollowNode(t)
	pod := jobPod("quick", "true")
	deadline := int64(1)
	pod.Spec.ActiveDeadlineSeconds = &deadline
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "the pod succeeding", func(st v1.PodStatus) bool { return st.Phase == v1.PodSucceeded })
	time.Sleep(1500 * time.Millisecond) // past the deadline
	relabelled := pod.DeepCopy()
	relabelled.Labels = map[string]string{"seen": "after the deadline"}
	n.mgr.Update(relabelled) // a sync after the deadline
	time.Sleep(300 * time.Millisecond)
	if st, _ := n.status.Get(pod.UID); st.Phase != v1.PodSucceeded {
		t.Errorf("after its deadline a pod that had succeeded is %s (%s): %s", st.Phase, st.Reason, st.Message)
	}
}

// rejectAll refuses every pod, as a node out of CPU would.
type rejectAll struct{}

func (rejectAll) Admit(context.Context, *v1.Pod, []*v1.Pod) admission.Result {
	return admission.Result{Reason: "OutOfcpu", Message: "no cpu"}
}

// A pod finished in its source is never admitted, not at a later sync either: a rejection then
// turned its Succeeded into Failed, OutOfcpu (found by a review of c7a6eb5).
func TestFinishedPodNeverAdmittedLater(t *testing.T) {
	n := &hollowNode{rt: hollow.NewRuntime(), store: offline.NewMemStore(nil)}
	n.ready.Store(true)
	n.staticReady.Store(true)
	n.start(t, rejectAll{})
	pod := jobPod("done", "sleep", "3600")
	pod.Status = v1.PodStatus{Phase: v1.PodSucceeded}
	n.mgr.Update(pod)
	n.waitStatus(t, pod, "the finished pod's status", func(v1.PodStatus) bool { return true })
	relabelled := pod.DeepCopy()
	relabelled.Labels = map[string]string{"sync": "again"}
	n.mgr.Update(relabelled)
	time.Sleep(300 * time.Millisecond)
	if st, _ := n.status.Get(pod.UID); st.Phase != v1.PodSucceeded {
		t.Errorf("after a later sync the finished pod is %s (%s)", st.Phase, st.Reason)
	}
}

// An API pod that happens to have a static pod's namespace and name is no previous version of
// it: the static pod starts (before, it waited for the API pod for good), and offline, with the
// API pod's record lost, the API pod is not torn down as a static orphan (found by a review).
func TestAPIPodOfAStaticPodsNameIsNoPreviousVersion(t *testing.T) {
	n := startHollowNode(t)
	static := staticPod(t, "sensor", filepath.Join(t.TempDir(), "sensor.yaml"), "sleep", "3600")
	api := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: static.Namespace, Name: static.Name, UID: "api-1"},
		Spec: v1.PodSpec{NodeName: "gw", Containers: []v1.Container{{Name: "app", Image: "busybox", Command: []string{"sleep", "3600"}}}}}
	n.mgr.Update(api)
	eventually(t, 10*time.Second, "the API pod running", func() bool { return n.running(t)["api-1"] })
	n.mgr.Update(static)
	eventually(t, 10*time.Second, "the static pod running beside the API pod of its name", func() bool { return n.running(t)[static.UID] })

	// Offline restart: the API source not ready, the file source ready, the API pod's record lost.
	n.stop()
	if err := n.store.DeletePod("api-1"); err != nil {
		t.Fatal(err)
	}
	n.ready.Store(false)
	n.start(t, nil)
	n.mgr.Update(static)
	time.Sleep(time.Second) // relists
	if !n.running(t)["api-1"] {
		t.Error("offline, the API pod of the static pod's name was torn down as a static orphan")
	}
}

// A manifest edited while the agent was down, online: the previous version's containers are a
// static orphan's, and the new version starts once they are down, not a minute later (its
// worker was poked only by the end of a static pod's worker; found by a review).
func TestStaticPodEditedWhileDownStartsOnceThePreviousStops(t *testing.T) {
	n := startHollowNode(t)
	// The previous version ignores SIGTERM: its orphan worker's stop takes a while (its
	// grace period, shortened here), during which the new version waits.
	n.rt.SetTermWait(func(time.Duration) time.Duration { return 2 * time.Second })
	path := filepath.Join(t.TempDir(), "sensor.yaml")
	v1pod := staticPod(t, "sensor", path, "sh", "-c", "trap '' TERM; sleep 3600")
	n.mgr.Update(v1pod)
	eventually(t, 10*time.Second, "version 1 running", func() bool { return n.running(t)[v1pod.UID] })
	n.stop()
	v2pod := staticPod(t, "sensor", path, "sh", "-c", "trap '' TERM; sleep 7200") // edited while down: a new UID
	n.start(t, nil)
	n.mgr.Update(v2pod)
	eventually(t, 15*time.Second, "version 2 running, version 1 gone", func() bool {
		r := n.running(t)
		return r[v2pod.UID] && !r[v1pod.UID]
	})
}
