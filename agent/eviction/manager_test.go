package eviction

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/manifest"
)

type fakeObserver struct{ obs Observations }

func (f *fakeObserver) Observe(context.Context) (Observations, error) {
	out := Observations{}
	for k, v := range f.obs {
		out[k] = v
	}
	return out, nil
}

type eviction struct {
	pod     string
	grace   time.Duration
	message string
}

type fakePods struct {
	pods    []*v1.Pod
	evicted []eviction
	// undecided is how many pods await their admission decision.
	undecided int
}

func (f *fakePods) ActivePods() ([]*v1.Pod, int) {
	var out []*v1.Pod
	for _, p := range f.pods {
		if !slices.ContainsFunc(f.evicted, func(e eviction) bool { return e.pod == p.Name }) {
			out = append(out, p)
		}
	}
	return out, f.undecided
}

func (f *fakePods) Evict(pod *v1.Pod, grace time.Duration, message string) error {
	f.evicted = append(f.evicted, eviction{pod.Name, grace, message})
	return nil
}

func (f *fakePods) CleanedUp(types.UID) bool { return true }

type fakeStats map[string]PodStats

func (f fakeStats) Stats(context.Context, []*v1.Pod, Signal) StatsFunc { return statsOf(f) }

type fakeReclaimer struct {
	calls int
	frees func()
}

func (f *fakeReclaimer) Reclaim(context.Context) error {
	f.calls++
	if f.frees != nil {
		f.frees()
	}
	return nil
}

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newTestManager(t *testing.T, hard map[string]string, obs *fakeObserver, pods *fakePods, stats fakeStats, r Reclaimer) (*Manager, *clock, *record.FakeRecorder) {
	t.Helper()
	ts, err := ParseThresholds(hard, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	rec := record.NewFakeRecorder(10)
	m := NewManager(Config{Thresholds: ts, PressureTransitionPeriod: 5 * time.Minute, Now: clk.Now}, obs, pods, stats, r, rec,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	return m, clk, rec
}

const mi = 1 << 20

var roomy = Observations{
	SignalMemoryAvailable: {Available: 8 << 30, Capacity: 16 << 30},
	SignalNodeFsAvailable: {Available: 50 << 30, Capacity: 100 << 30},
	SignalPIDAvailable:    {Available: 30000, Capacity: 32768},
}

// Under memory pressure one pod is evicted per synchronization, the first of kubelet's
// ranking that is not critical, with kubelet's message, event and immediate grace period; the
// conditions follow the thresholds and are held for the transition period.
func TestSynchronizeEvictsOnePodPerInterval(t *testing.T) {
	static := testPod("static", "", "", 0)
	static.Annotations = map[string]string{manifest.ConfigSourceAnnotation: manifest.SourceFile}
	critical := testPod("node-critical", "", "", 2000001000)
	pods := &fakePods{pods: []*v1.Pod{
		testPod("guaranteed", "200Mi", "", 0), static, critical,
		testPod("hog", "", "", 0), testPod("small", "", "", 0),
	}}
	pods.pods[3].Spec.Containers[0].Name = "eat"
	stats := fakeStats{
		"guaranteed": {Memory: 100 * mi}, "static": {Memory: 900 * mi}, "node-critical": {Memory: 800 * mi},
		"hog": {Memory: 300 * mi, Containers: map[string]int64{"eat": 300 * mi}}, "small": {Memory: 10 * mi},
	}
	obs := &fakeObserver{obs: Observations{}}
	for k, v := range roomy {
		obs.obs[k] = v
	}
	m, clk, rec := newTestManager(t, nil, obs, pods, stats, nil)
	ctx := context.Background()

	if p := m.Synchronize(ctx); p != nil || m.UnderPressure(v1.NodeMemoryPressure) {
		t.Fatalf("evicted %v / pressure %v with memory to spare", p, m.UnderPressure(v1.NodeMemoryPressure))
	}
	obs.obs[SignalMemoryAvailable] = Observation{Available: 50 * mi, Capacity: 16 << 30}
	clk.now = clk.now.Add(10 * time.Second)
	if p := m.Synchronize(ctx); p == nil || p.Name != "hog" {
		t.Fatalf("evicted %v, want the hog", p)
	}
	if !m.UnderPressure(v1.NodeMemoryPressure) || m.UnderPressure(v1.NodeDiskPressure) {
		t.Error("want MemoryPressure alone")
	}
	e := pods.evicted[0]
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. " +
		"Container eat was using 300Mi, request is 0, has larger consumption of memory. "
	if e.message != want || e.grace != time.Second {
		t.Errorf("eviction = %q, grace %s\nwant       %q, grace 1s", e.message, e.grace, want)
	}
	if ev := <-rec.Events; ev != "Warning Evicted "+want {
		t.Errorf("event %q", ev)
	}
	// Still low: the next interval evicts the next pod, never the static or critical ones.
	clk.now = clk.now.Add(10 * time.Second)
	m.Synchronize(ctx)
	clk.now = clk.now.Add(10 * time.Second)
	m.Synchronize(ctx)
	clk.now = clk.now.Add(10 * time.Second)
	if p := m.Synchronize(ctx); p != nil {
		t.Errorf("evicted %s; only critical pods were left", p.Name)
	}
	var got []string
	for _, e := range pods.evicted {
		got = append(got, e.pod)
	}
	if !slices.Equal(got, []string{"hog", "small", "guaranteed"}) {
		t.Errorf("evicted %v, want [hog small guaranteed]", got)
	}

	// Relieved: the condition stays for the transition period, then goes.
	obs.obs[SignalMemoryAvailable] = roomy[SignalMemoryAvailable]
	clk.now = clk.now.Add(4 * time.Minute)
	m.Synchronize(ctx)
	if !m.UnderPressure(v1.NodeMemoryPressure) {
		t.Error("MemoryPressure gone before the transition period")
	}
	clk.now = clk.now.Add(2 * time.Minute)
	m.Synchronize(ctx)
	if m.UnderPressure(v1.NodeMemoryPressure) {
		t.Error("MemoryPressure still there after the transition period")
	}
}

// While pods are still being admitted (restored after an agent restart, their containers
// running), no pod is chosen: the one not yet admitted may be the hog. The wait is bounded,
// so that a pod whose admission hangs does not stop eviction for good.
func TestSynchronizeWaitsForAdmission(t *testing.T) {
	pods := &fakePods{pods: []*v1.Pod{testPod("guaranteed", "200Mi", "", 0)}, undecided: 1}
	stats := fakeStats{"guaranteed": {Memory: 100 * mi}, "hog": {Memory: 3 << 30}}
	obs := &fakeObserver{obs: Observations{SignalMemoryAvailable: {Available: 50 * mi, Capacity: 16 << 30}}}
	m, clk, _ := newTestManager(t, nil, obs, pods, stats, nil)
	ctx := context.Background()
	if p := m.Synchronize(ctx); p != nil {
		t.Fatalf("evicted %s while a pod was still being admitted", p.Name)
	}
	if !m.UnderPressure(v1.NodeMemoryPressure) {
		t.Error("no MemoryPressure while waiting: the condition must not wait for admission")
	}
	// The hog is admitted: it is the one evicted.
	pods.pods, pods.undecided = append(pods.pods, testPod("hog", "", "", 0)), 0
	clk.now = clk.now.Add(10 * time.Second)
	if p := m.Synchronize(ctx); p == nil || p.Name != "hog" {
		t.Fatalf("evicted %v, want the hog", p)
	}

	// An admission that never ends holds eviction back for admissionSettleTimeout only.
	pods.undecided = 1
	clk.now = clk.now.Add(10 * time.Second)
	if p := m.Synchronize(ctx); p != nil {
		t.Fatalf("evicted %s at once while a pod was being admitted", p.Name)
	}
	clk.now = clk.now.Add(admissionSettleTimeout)
	if p := m.Synchronize(ctx); p == nil || p.Name != "guaranteed" {
		t.Fatalf("evicted %v after the settle timeout, want the guaranteed pod (the only one left)", p)
	}
}

// Under disk pressure, node-level reclaim (dead containers, unused images) comes first: a pod
// is evicted only when it did not relieve the threshold.
func TestSynchronizeReclaimsBeforeEvictingForDisk(t *testing.T) {
	pods := &fakePods{pods: []*v1.Pod{testPod("writer", "", "", 0), testPod("quiet", "", "", 0)}}
	stats := fakeStats{"writer": {Disk: 500 * mi}, "quiet": {Disk: mi}}
	obs := &fakeObserver{obs: Observations{SignalNodeFsAvailable: {Available: 5 * mi, Capacity: 100 * mi}}}
	r := &fakeReclaimer{}
	m, _, _ := newTestManager(t, nil, obs, pods, stats, r)
	r.frees = func() { obs.obs[SignalNodeFsAvailable] = Observation{Available: 50 * mi, Capacity: 100 * mi} }
	if p := m.Synchronize(context.Background()); p != nil || r.calls != 1 {
		t.Fatalf("evicted %v after %d reclaims; want a reclaim and no eviction", p, r.calls)
	}
	if !m.UnderPressure(v1.NodeDiskPressure) {
		t.Error("no DiskPressure, though the threshold was met")
	}
	r.frees = nil
	obs.obs[SignalNodeFsAvailable] = Observation{Available: 5 * mi, Capacity: 100 * mi}
	p := m.Synchronize(context.Background())
	if p == nil || p.Name != "writer" || r.calls != 2 {
		t.Fatalf("evicted %v after %d reclaims; want the writer after a second reclaim", p, r.calls)
	}
	if msg := pods.evicted[0].message; !strings.HasPrefix(msg, "The node was low on resource: ephemeral-storage. Threshold quantity: 10Mi, available: 5Mi. ") {
		t.Errorf("message %q", msg)
	}
}

// A soft threshold evicts only once met for its grace period, with the pod's grace period
// bounded by evictionMaxPodGracePeriod; the condition is set at once.
func TestSoftThreshold(t *testing.T) {
	ts, err := ParseThresholds(map[string]string{"memory.available": "0"}, map[string]string{"memory.available": "1Gi"}, map[string]string{"memory.available": "1m"})
	if err != nil {
		t.Fatal(err)
	}
	pods := &fakePods{pods: []*v1.Pod{testPod("hog", "", "", 0)}}
	grace := int64(30)
	pods.pods[0].Spec.TerminationGracePeriodSeconds = &grace
	obs := &fakeObserver{obs: Observations{SignalMemoryAvailable: {Available: 512 * mi, Capacity: 16 << 30}}}
	clk := &clock{now: time.Unix(1e9, 0)}
	m := NewManager(Config{Thresholds: ts, PressureTransitionPeriod: time.Minute, MaxPodGracePeriod: 10 * time.Second, Now: clk.Now},
		obs, pods, fakeStats{"hog": {Memory: mi}}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if p := m.Synchronize(context.Background()); p != nil || !m.UnderPressure(v1.NodeMemoryPressure) {
		t.Fatalf("evicted %v at once / pressure %v", p, m.UnderPressure(v1.NodeMemoryPressure))
	}
	clk.now = clk.now.Add(time.Minute)
	if p := m.Synchronize(context.Background()); p == nil {
		t.Fatal("nothing evicted after the grace period")
	}
	if g := pods.evicted[0].grace; g != 10*time.Second {
		t.Errorf("grace %s, want evictionMaxPodGracePeriod 10s", g)
	}
}

// Admission as kubelet's eviction admit handler.
func TestAdmit(t *testing.T) {
	obs := &fakeObserver{obs: Observations{}}
	for k, v := range roomy {
		obs.obs[k] = v
	}
	m, _, _ := newTestManager(t, nil, obs, &fakePods{}, fakeStats{}, nil)
	ctx := context.Background()
	bestEffort, burstable := testPod("be", "", "", 0), testPod("bu", "10Mi", "", 0)
	tolerant := testPod("tol", "", "", 0)
	tolerant.Spec.Tolerations = []v1.Toleration{{Key: v1.TaintNodeMemoryPressure, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule}}
	critical := testPod("crit", "", "", 2000000000)
	m.Synchronize(ctx)
	for _, p := range []*v1.Pod{bestEffort, burstable} {
		if r := m.Admit(p); !r.Admitted {
			t.Errorf("%s refused without pressure: %+v", p.Name, r)
		}
	}
	obs.obs[SignalMemoryAvailable] = Observation{Available: mi, Capacity: 16 << 30}
	m.Synchronize(ctx)
	if r := m.Admit(bestEffort); r.Admitted || r.Reason != "Evicted" || r.Message != "The node had condition: [MemoryPressure]. " {
		t.Errorf("BestEffort under memory pressure: %+v", r)
	}
	for _, p := range []*v1.Pod{burstable, tolerant, critical} {
		if r := m.Admit(p); !r.Admitted {
			t.Errorf("%s refused under memory pressure: %+v", p.Name, r)
		}
	}
	obs.obs[SignalNodeFsAvailable] = Observation{Available: mi, Capacity: 100 * mi}
	m.Synchronize(ctx)
	if r := m.Admit(burstable); r.Admitted || r.Message != "The node had condition: [MemoryPressure DiskPressure]. " {
		t.Errorf("Burstable under memory and disk pressure: %+v", r)
	}
	if r := m.Admit(critical); !r.Admitted {
		t.Errorf("critical pod refused: %+v", r)
	}
}
