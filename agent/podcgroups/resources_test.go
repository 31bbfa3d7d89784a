package podcgroups

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/internal/podutil"
)

func resourceList(cpu, memory string) v1.ResourceList {
	res := v1.ResourceList{}
	if cpu != "" {
		res[v1.ResourceCPU] = resource.MustParse(cpu)
	}
	if memory != "" {
		res[v1.ResourceMemory] = resource.MustParse(memory)
	}
	return res
}

func requirements(requests, limits v1.ResourceList) v1.ResourceRequirements {
	return v1.ResourceRequirements{Requests: requests, Limits: limits}
}

func podWith(init []v1.ResourceRequirements, containers ...v1.ResourceRequirements) *v1.Pod {
	pod := &v1.Pod{}
	for i, r := range init {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: fmt.Sprintf("init%d", i), Resources: r})
	}
	for i, r := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: fmt.Sprintf("c%d", i), Resources: r})
	}
	return pod
}

// TestResourceConfigForPod is the kubelet's own table (pkg/kubelet/cm helpers_linux_test.go
// TestResourceConfigForPod, v1.37.2), its rows without pod-level resources (those are
// TestResourceConfigForPodLevel's), with the values it expects written out.
func TestResourceConfigForPod(t *testing.T) {
	const defaultPeriod, tunedPeriod = uint64(100000), uint64(5000)
	burstableShares := MilliCPUToShares(100)
	burstableMemory := int64(200 << 20)
	guaranteedMemory := int64(100 << 20)
	tests := []struct {
		name             string
		pod              *v1.Pod
		enforceCPULimits bool
		period           uint64
		want             cgroups.Resources
	}{
		{"besteffort", podWith(nil, requirements(resourceList("", ""), resourceList("", ""))), true, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(uint64(2))}},
		{"burstable-no-limits", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("", ""))), true, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(burstableShares)}},
		{"burstable-with-limits", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi"))), true, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(burstableShares), CPUQuota: ptr.To(MilliCPUToQuota(200, 100000)), CPUPeriod: ptr.To(defaultPeriod), Memory: ptr.To(burstableMemory)}},
		{"burstable-with-limits-no-cpu-enforcement", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi"))), false, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(burstableShares), CPUQuota: ptr.To(int64(-1)), CPUPeriod: ptr.To(defaultPeriod), Memory: ptr.To(burstableMemory)}},
		{"burstable-partial-limits", podWith(nil,
			requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi")),
			requirements(resourceList("100m", "100Mi"), resourceList("", ""))), true, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200))}},
		{"burstable-with-limits-with-tuned-quota", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi"))), true, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(burstableShares), CPUQuota: ptr.To(int64(1000)), CPUPeriod: ptr.To(tunedPeriod), Memory: ptr.To(burstableMemory)}},
		{"burstable-with-limits-no-cpu-enforcement-with-tuned-quota", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi"))), false, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(burstableShares), CPUQuota: ptr.To(int64(-1)), CPUPeriod: ptr.To(tunedPeriod), Memory: ptr.To(burstableMemory)}},
		{"burstable-partial-limits-with-tuned-quota", podWith(nil,
			requirements(resourceList("100m", "100Mi"), resourceList("200m", "200Mi")),
			requirements(resourceList("100m", "100Mi"), resourceList("", ""))), true, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200))}},
		{"guaranteed", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("100m", "100Mi"))), true, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(10000)), CPUPeriod: ptr.To(defaultPeriod), Memory: ptr.To(guaranteedMemory)}},
		{"guaranteed-no-cpu-enforcement", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("100m", "100Mi"))), false, defaultPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(-1)), CPUPeriod: ptr.To(defaultPeriod), Memory: ptr.To(guaranteedMemory)}},
		{"guaranteed-with-tuned-quota", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("100m", "100Mi"))), true, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(1000)), CPUPeriod: ptr.To(tunedPeriod), Memory: ptr.To(guaranteedMemory)}},
		{"guaranteed-no-cpu-enforcement-with-tuned-quota", podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("100m", "100Mi"))), false, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(-1)), CPUPeriod: ptr.To(tunedPeriod), Memory: ptr.To(guaranteedMemory)}},
		{"burstable-partial-limits-with-init-containers", podWith(
			[]v1.ResourceRequirements{
				requirements(resourceList("100m", "100m"), resourceList("100m", "100Mi")),
				requirements(resourceList("100m", "100m"), resourceList("", "")),
			},
			requirements(resourceList("100m", "100m"), resourceList("100m", "100Mi")),
			requirements(resourceList("100m", "100m"), resourceList("", ""))), true, tunedPeriod,
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ResourceConfigForPod(tt.pod, tt.enforceCPULimits, tt.period, 0)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ResourceConfigForPod =\n%s, want\n%s", show(got), show(tt.want))
			}
		})
	}
}

// TestMilliCPUToShares is the kubelet's arithmetic at its edges: none is 2 shares (not the
// kernel's 1024), a tiny request is clamped up to 2, a huge one down to the kernel's maximum.
func TestMilliCPUToShares(t *testing.T) {
	for _, tt := range []struct {
		milli int64
		want  uint64
	}{{0, 2}, {1, 2}, {2, 2}, {3, 3}, {100, 102}, {1000, 1024}, {256000, 262144}, {1 << 40, 262144}} {
		if got := MilliCPUToShares(tt.milli); got != tt.want {
			t.Errorf("MilliCPUToShares(%d) = %d, want %d", tt.milli, got, tt.want)
		}
	}
	// The kubelet's TestMilliCPUToQuota rows.
	for _, tt := range []struct{ milli, period, want int64 }{
		{0, 100000, 0}, {5, 100000, 1000}, {9, 100000, 1000}, {10, 100000, 1000}, {200, 100000, 20000}, {500, 100000, 50000}, {1000, 100000, 100000}, {1500, 100000, 150000},
	} {
		if got := MilliCPUToQuota(tt.milli, tt.period); got != tt.want {
			t.Errorf("MilliCPUToQuota(%d, %d) = %d, want %d", tt.milli, tt.period, got, tt.want)
		}
	}
}

// TestResourceConfigForPodInvariants attacks ResourceConfigForPod with generated pods: what
// the kubelet promises of a pod cgroup holds for every one (a memory limit exactly when every
// container has one, and then the sum of the limits, quota only when every container has a
// CPU limit, shares from the summed requests, the pids limit as configured).
func TestResourceConfigForPodInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	quantity := func(unit string) string {
		switch rng.IntN(4) {
		case 0:
			return ""
		case 1:
			return "0"
		default:
			return fmt.Sprintf("%d%s", 1+rng.IntN(3000), unit)
		}
	}
	for i := range 2000 {
		var containers []v1.ResourceRequirements
		var sumCPULimit, sumMemLimit, sumCPUReq int64
		allCPULimits, allMemLimits := true, true
		for range 1 + rng.IntN(3) {
			req, lim := resourceList(quantity("m"), quantity("Mi")), resourceList(quantity("m"), quantity("Mi"))
			for name, l := range lim { // valid pods: a request never above its limit
				if r, ok := req[name]; ok && r.Cmp(l) > 0 {
					req[name] = l
				}
			}
			containers = append(containers, requirements(req, lim))
			if lim.Cpu().IsZero() {
				allCPULimits = false
			}
			if lim.Memory().IsZero() {
				allMemLimits = false
			}
			sumCPULimit += lim.Cpu().MilliValue()
			sumMemLimit += lim.Memory().Value()
			sumCPUReq += req.Cpu().MilliValue() // no API defaulting here: no request is none
		}
		pod := podWith(nil, containers...)
		pids := int64(rng.IntN(3) - 1)
		got := ResourceConfigForPod(pod, true, QuotaPeriod, pids)
		desc := fmt.Sprintf("pod %d %+v: %s", i, containers, show(got))
		if podutil.ComputePodQOS(pod) == v1.PodQOSBestEffort {
			if got.CPUQuota != nil || got.Memory != nil || *got.CPUShares != MinShares {
				t.Fatalf("BestEffort: only 2 shares; %s", desc)
			}
			continue
		}
		if (got.Memory != nil) != allMemLimits || (got.Memory != nil && *got.Memory != sumMemLimit) {
			t.Fatalf("memory limit wants every container limited (%v) and their sum %d; %s", allMemLimits, sumMemLimit, desc)
		}
		if (got.CPUQuota != nil) != allCPULimits || (got.CPUQuota != nil && *got.CPUQuota != MilliCPUToQuota(sumCPULimit, QuotaPeriod)) {
			t.Fatalf("CPU quota wants every container limited (%v), of the sum %dm; %s", allCPULimits, sumCPULimit, desc)
		}
		if *got.CPUShares != MilliCPUToShares(sumCPUReq) {
			t.Fatalf("shares want the summed requests %dm; %s", sumCPUReq, desc)
		}
		if (got.PidsLimit != nil) != (pids > 0) {
			t.Fatalf("pids limit %d: %s", pids, desc)
		}
	}
}

func show(r cgroups.Resources) string {
	s := ""
	for name, p := range map[string]any{"shares": r.CPUShares, "quota": r.CPUQuota, "period": r.CPUPeriod, "memory": r.Memory, "pids": r.PidsLimit} {
		v := reflect.ValueOf(p)
		if !v.IsNil() {
			s += fmt.Sprintf("%s=%v ", name, v.Elem().Interface())
		}
	}
	return s
}

// TestQOSResources: the kubelet's QoS levels (TestQOSCPUConfigUpdate): besteffort 2 shares
// whatever runs, burstable the shares of the sum of the burstable pods' requests (Guaranteed
// and BestEffort pods not counted), 2 when there are none.
func TestQOSResources(t *testing.T) {
	guaranteed := podWith(nil, requirements(resourceList("1", "1Gi"), resourceList("1", "1Gi")))
	burstable1 := podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("", "")))
	burstable2 := podWith(nil, requirements(resourceList("250m", ""), resourceList("500m", "")))
	besteffort := podWith(nil, requirements(nil, nil))
	b, be := QOSResources(nil)
	if *b.CPUShares != 2 || *be.CPUShares != 2 {
		t.Errorf("no pods: burstable %d, besteffort %d shares; want 2 and 2", *b.CPUShares, *be.CPUShares)
	}
	b, be = QOSResources([]*v1.Pod{guaranteed, burstable1, burstable2, besteffort})
	if want := MilliCPUToShares(350); *b.CPUShares != want || *be.CPUShares != 2 {
		t.Errorf("burstable %d, besteffort %d shares; want %d and 2", *b.CPUShares, *be.CPUShares, want)
	}
	if b.Memory != nil || be.Memory != nil || b.CPUQuota != nil {
		t.Errorf("QoS levels get shares only: %s / %s", show(b), show(be))
	}
}

// TestPodDir: the kubelet's names, below the cgroup root.
func TestPodDir(t *testing.T) {
	for _, tt := range []struct {
		root string
		pod  *v1.Pod
		want string
	}{
		{"/", podWith(nil, requirements(resourceList("1", "1Gi"), resourceList("1", "1Gi"))), "/kubepods/podu1"},
		{"", podWith(nil, requirements(resourceList("1", ""), nil)), "/kubepods/burstable/podu1"},
		{"/edge", podWith(nil, requirements(nil, nil)), "/edge/kubepods/besteffort/podu1"},
	} {
		tt.pod.UID = "u1"
		if got := PodDir(tt.root, tt.pod); got != tt.want {
			t.Errorf("PodDir(%q) = %q, want %q", tt.root, got, tt.want)
		}
	}
}

// TestNodeAllocatableResources: kubepods is capped at the allocatable it is given, its CPU as
// shares (the kubelet sets no quota on it).
func TestNodeAllocatableResources(t *testing.T) {
	got := NodeAllocatableResources(v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("1500m"), v1.ResourceMemory: resource.MustParse("300Mi"), "pid": resource.MustParse("1000"),
	})
	want := cgroups.Resources{CPUShares: ptr.To(uint64(1536)), Memory: ptr.To(int64(300 << 20)), PidsLimit: ptr.To(int64(1000))}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NodeAllocatableResources = %s, want %s", show(got), show(want))
	}
}

func withPodLevel(pod *v1.Pod, r v1.ResourceRequirements) *v1.Pod {
	pod.Spec.Resources = &r
	return pod
}

// TestResourceConfigForPodLevel: the kubelet's ResourceConfigForPod with pod-level resources
// (PodLevelResources, beta and on in 1.37), its rules written out: the pod's requests and
// limits are the pod-level ones where set, the containers' summed for the others; a pod-level
// limit declares that limit for the whole pod whatever its containers say; the QoS class (and
// so what is written) is the pod-level resources'.
func TestResourceConfigForPodLevel(t *testing.T) {
	const period = uint64(100000)
	noLimits := requirements(resourceList("100m", ""), nil)
	tests := []struct {
		name string
		pod  *v1.Pod
		want cgroups.Resources
	}{
		{"burstable-pod-level-limits-container-without", withPodLevel(podWith(nil, noLimits),
			requirements(resourceList("200m", "100Mi"), resourceList("400m", "300Mi"))),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200)), CPUQuota: ptr.To(int64(40000)), CPUPeriod: ptr.To(period), Memory: ptr.To(int64(300 << 20))}},
		{"guaranteed-pod-level", withPodLevel(podWith(nil, requirements(nil, nil), noLimits),
			requirements(resourceList("200m", "128Mi"), resourceList("200m", "128Mi"))),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200)), CPUQuota: ptr.To(int64(20000)), CPUPeriod: ptr.To(period), Memory: ptr.To(int64(128 << 20))}},
		{"burstable-pod-level-memory-only", withPodLevel(podWith(nil, noLimits),
			requirements(resourceList("", "64Mi"), resourceList("", "64Mi"))),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), Memory: ptr.To(int64(64 << 20))}},
		{"burstable-pod-level-cpu-limit-beside-container-memory-limits", withPodLevel(podWith(nil, requirements(resourceList("100m", "50Mi"), resourceList("", "50Mi"))),
			requirements(resourceList("100m", ""), resourceList("300m", ""))),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(30000)), CPUPeriod: ptr.To(period), Memory: ptr.To(int64(50 << 20))}},
		{"burstable-pod-level-requests-only", withPodLevel(podWith(nil, requirements(nil, nil)),
			requirements(resourceList("500m", "100Mi"), nil)),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(500))}},
		{"pod-level-limits-below-the-containers-sum", withPodLevel(podWith(nil,
			requirements(resourceList("100m", "100Mi"), resourceList("1", "1Gi")),
			requirements(resourceList("100m", "100Mi"), resourceList("1", "1Gi"))),
			requirements(resourceList("200m", "200Mi"), resourceList("1500m", "1500Mi"))),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(200)), CPUQuota: ptr.To(int64(150000)), CPUPeriod: ptr.To(period), Memory: ptr.To(int64(1500 << 20))}},
		{"empty-pod-level-is-the-containers'", withPodLevel(podWith(nil, requirements(resourceList("100m", "100Mi"), resourceList("100m", "100Mi"))),
			v1.ResourceRequirements{}),
			cgroups.Resources{CPUShares: ptr.To(MilliCPUToShares(100)), CPUQuota: ptr.To(int64(10000)), CPUPeriod: ptr.To(period), Memory: ptr.To(int64(100 << 20))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ResourceConfigForPod(tt.pod, true, period, 0)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ResourceConfigForPod =\n%s, want\n%s", show(got), show(tt.want))
			}
		})
	}
}

// TestHolds: a pod cgroup read back holds its ResourceConfigForPod when each value set is
// there: shares as written or as a v2 weight's, no quota for -1, a memory limit as written or
// rounded down to a page (cgroup v1); a resize not applied yet does not hold.
func TestHolds(t *testing.T) {
	want := cgroups.Resources{CPUShares: ptr.To(uint64(204)), CPUQuota: ptr.To(int64(20000)), CPUPeriod: ptr.To(uint64(100000)), Memory: ptr.To(int64(100000000))}
	page := int64(100000000) / pageSize * pageSize
	for _, tt := range []struct {
		name string
		want cgroups.Resources
		got  cgroups.Settings
		ok   bool
	}{
		{"as written", want, cgroups.Settings{CPUShares: 204, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 100000000}, true},
		{"v2 weight, v1 page", want, cgroups.Settings{CPUShares: cgroups.WeightToShares(cgroups.SharesToWeight(204)), CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: page}, true},
		{"old quota", want, cgroups.Settings{CPUShares: 204, CPUQuota: 10000, CPUPeriod: 100000, MemoryLimit: 100000000}, false},
		{"old memory", want, cgroups.Settings{CPUShares: 204, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 64 << 20}, false},
		{"old shares", want, cgroups.Settings{CPUShares: 102, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 100000000}, false},
		{"no quota wanted (-1)", cgroups.Resources{CPUShares: ptr.To(uint64(2)), CPUQuota: ptr.To(int64(-1))}, cgroups.Settings{CPUShares: 2}, true},
		{"quota left", cgroups.Resources{CPUShares: ptr.To(uint64(2)), CPUQuota: ptr.To(int64(-1))}, cgroups.Settings{CPUShares: 2, CPUQuota: 5000, CPUPeriod: 100000}, false},
		{"unset: not judged", cgroups.Resources{CPUShares: ptr.To(uint64(2))}, cgroups.Settings{CPUShares: 2, CPUQuota: 5000, CPUPeriod: 100000, MemoryLimit: 1 << 20}, true},
	} {
		if got := Holds(tt.want, tt.got); got != tt.ok {
			t.Errorf("%s: Holds(%s, %+v) = %v, want %v", tt.name, show(tt.want), tt.got, got, tt.ok)
		}
	}
}

// TestCovering: the pod cgroup's setting before its containers are resized holds them as they
// are (got) and as they will be (want), resource by resource, whichever way each moves.
func TestCovering(t *testing.T) {
	res := func(shares uint64, quota, mem int64) cgroups.Resources {
		return cgroups.Resources{CPUShares: ptr.To(shares), CPUQuota: ptr.To(quota), CPUPeriod: ptr.To(uint64(QuotaPeriod)), Memory: ptr.To(mem), PidsLimit: ptr.To(int64(-1))}
	}
	held := func(shares uint64, quota, period, mem int64) cgroups.Settings {
		return cgroups.Settings{CPUShares: shares, CPUQuota: quota, CPUPeriod: period, MemoryLimit: mem}
	}
	for _, tc := range []struct {
		name string
		want cgroups.Resources
		got  cgroups.Settings
		out  cgroups.Resources
	}{
		{"CPU up, memory down", res(204, 60000, 64<<20), held(204, 40000, QuotaPeriod, 128<<20), res(204, 60000, 128<<20)},
		{"CPU down, memory up", res(102, 20000, 256<<20), held(204, 40000, QuotaPeriod, 128<<20), res(204, 40000, 256<<20)},
		{"both up", res(409, 80000, 256<<20), held(204, 40000, QuotaPeriod, 128<<20), res(409, 80000, 256<<20)},
		{"both down", res(102, 20000, 64<<20), held(204, 40000, QuotaPeriod, 128<<20), res(204, 40000, 128<<20)},
		{"a limit lifted", res(204, -1, -1), held(204, 40000, QuotaPeriod, 128<<20), res(204, -1, -1)},
		{"a limit set where none was", res(204, 40000, 128<<20), held(204, 0, 0, 0), res(204, -1, -1)},
		{"the quota held over another period", res(204, 30000, 64<<20), held(204, 20000, 50000, 64<<20), res(204, 40000, 64<<20)},
		{"the quota held over another period, rounded up", res(204, 10000, 64<<20), held(204, 10001, 30000, 64<<20), res(204, 33337, 64<<20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Covering(tc.want, tc.got)
			if !reflect.DeepEqual(got, tc.out) {
				t.Errorf("Covering(%s, %+v) = %s, want %s", fmtResources(tc.want), tc.got, fmtResources(got), fmtResources(tc.out))
			}
			// Whatever the case: it covers both.
			if *got.CPUQuota > 0 && (*tc.want.CPUQuota <= 0 || *got.CPUQuota < *tc.want.CPUQuota) {
				t.Errorf("quota %d below the new %d", *got.CPUQuota, *tc.want.CPUQuota)
			}
			if *got.Memory > 0 && (*tc.want.Memory <= 0 || tc.got.MemoryLimit <= 0 || *got.Memory < max(*tc.want.Memory, tc.got.MemoryLimit)) {
				t.Errorf("memory %d below the old %d or the new %d", *got.Memory, tc.got.MemoryLimit, *tc.want.Memory)
			}
		})
	}
}

func fmtResources(r cgroups.Resources) string {
	f := func(p any) string {
		switch v := p.(type) {
		case *uint64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		case *int64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		}
		return "nil"
	}
	return fmt.Sprintf("{shares %s quota %s/%s memory %s pids %s}", f(r.CPUShares), f(r.CPUQuota), f(r.CPUPeriod), f(r.Memory), f(r.PidsLimit))
}
