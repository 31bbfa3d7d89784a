package eviction

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// testPod is a pod with one container "main" requesting memory and ephemeral-storage (""
// for none), at a priority.
func testPod(name, memRequest, diskRequest string, prio int32) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	c := v1.Container{Name: "main"}
	if memRequest != "" || diskRequest != "" {
		c.Resources.Requests = v1.ResourceList{}
	}
	if memRequest != "" {
		c.Resources.Requests[v1.ResourceMemory] = resource.MustParse(memRequest)
		c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(memRequest)}
	}
	if diskRequest != "" {
		c.Resources.Requests[v1.ResourceEphemeralStorage] = resource.MustParse(diskRequest)
	}
	p.Spec.Containers = []v1.Container{c}
	p.Spec.Priority = &prio
	return p
}

func statsOf(m map[string]PodStats) StatsFunc {
	return func(pod *v1.Pod) (PodStats, bool) {
		s, ok := m[pod.Name]
		return s, ok
	}
}

func names(pods []*v1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func TestRank(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name   string
		signal Signal
		pods   []*v1.Pod
		stats  map[string]PodStats
		want   []string
	}{
		{
			name:   "memory: over requests first, then lower priority, then most over requests",
			signal: SignalMemoryAvailable,
			pods: []*v1.Pod{
				testPod("guaranteed", "200Mi", "", 0),       // under its request
				testPod("burstable-high", "50Mi", "", 1000), // over, higher priority
				testPod("burstable-low", "10Mi", "", 0),     // over by 50Mi
				testPod("besteffort", "", "", 0),            // over by 300Mi
				testPod("guaranteed-big", "1Gi", "", -5),    // under its request, lowest priority
			},
			stats: map[string]PodStats{
				"guaranteed":     {Memory: 100 * mi},
				"burstable-high": {Memory: 100 * mi},
				"burstable-low":  {Memory: 60 * mi},
				"besteffort":     {Memory: 300 * mi},
				"guaranteed-big": {Memory: 900 * mi},
			},
			want: []string{"besteffort", "burstable-low", "burstable-high", "guaranteed-big", "guaranteed"},
		},
		{
			name:   "memory: a pod without stats first, as kubelet",
			signal: SignalMemoryAvailable,
			pods:   []*v1.Pod{testPod("known", "", "", 0), testPod("unknown", "1Gi", "", 0)},
			stats:  map[string]PodStats{"known": {Memory: 10 * mi}},
			want:   []string{"unknown", "known"},
		},
		{
			name:   "disk: over ephemeral-storage requests first",
			signal: SignalNodeFsAvailable,
			pods: []*v1.Pod{
				testPod("writer", "64Mi", "", 0),
				testPod("quiet", "", "", 0),
				testPod("within", "", "1Gi", 0),
			},
			stats: map[string]PodStats{
				"writer": {Disk: 500 * mi, Memory: 1},
				"quiet":  {Disk: 4096},
				"within": {Disk: 900 * mi},
			},
			want: []string{"writer", "quiet", "within"},
		},
		{
			name:   "pids: lower priority first, then most tasks",
			signal: SignalPIDAvailable,
			pods:   []*v1.Pod{testPod("few", "", "", 0), testPod("many-high", "", "", 10), testPod("many", "", "", 0)},
			stats:  map[string]PodStats{"few": {PIDs: 2}, "many-high": {PIDs: 900}, "many": {PIDs: 500}},
			want:   []string{"many", "few", "many-high"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := slices.Clone(tc.pods)
			Rank(tc.signal, pods, statsOf(tc.stats))
			if got := names(pods); !slices.Equal(got, tc.want) {
				t.Errorf("ranked %v, want %v", got, tc.want)
			}
		})
	}
}
