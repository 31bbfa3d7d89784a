package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// TestRunningPodResources: a running pod's status.resources are what its pod cgroup holds, as
// the kubelet's convertToAPIPodLevelResourcesStatus reads them, the allocation's values kept
// where the cgroup holds them.
func TestRunningPodResources(t *testing.T) {
	podLevel := func(req, lim v1.ResourceList) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{Resources: &v1.ResourceRequirements{Requests: req, Limits: lim},
			Containers: []v1.Container{{Name: "c"}}}}
	}
	containers := func(rs ...v1.ResourceRequirements) *v1.Pod {
		p := &v1.Pod{}
		for _, r := range rs {
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "c", Resources: r})
		}
		return p
	}
	for _, tc := range []struct {
		name       string
		pod        *v1.Pod
		got        cgroups.Settings
		old        *v1.ResourceRequirements
		req, limit v1.ResourceList
	}{
		{"pod-level, applied", podLevel(resourceList("200m", "96Mi"), resourceList("200m", "96Mi")),
			cgroups.Settings{CPUShares: 204, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 96 << 20}, nil,
			resourceList("200m", "96Mi"), resourceList("200m", "96Mi")},
		{"pod-level, a resize not applied yet: the cgroup's values", podLevel(resourceList("400m", "64Mi"), resourceList("400m", "64Mi")),
			cgroups.Settings{CPUShares: 204, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 96 << 20}, nil,
			resourceList("200m", "64Mi"), resourceList("200m", "96Mi")},
		{"pod-level memory limit of no whole number of pages, held rounded down", podLevel(resourceList("200m", "100M"), resourceList("200m", "100M")),
			cgroups.Settings{CPUShares: 204, CPUQuota: 20000, CPUPeriod: 100000, MemoryLimit: 99999744}, nil,
			resourceList("200m", "100M"), resourceList("200m", "100M")},
		{"containers' resources added up", containers(
			v1.ResourceRequirements{Requests: resourceList("100m", "32Mi"), Limits: resourceList("100m", "32Mi")},
			v1.ResourceRequirements{Requests: resourceList("200m", "64Mi"), Limits: resourceList("200m", "64Mi")}),
			cgroups.Settings{CPUShares: 307, CPUQuota: 30000, CPUPeriod: 100000, MemoryLimit: 96 << 20}, nil,
			resourceList("300m", "96Mi"), resourceList("300m", "96Mi")},
		{"a container without limits: the pod cgroup has none, nor its status", containers(
			v1.ResourceRequirements{Requests: resourceList("100m", "32Mi"), Limits: resourceList("100m", "32Mi")},
			v1.ResourceRequirements{Requests: resourceList("200m", "64Mi")}),
			cgroups.Settings{CPUShares: 307}, nil,
			resourceList("300m", "96Mi"), resourceList("", "")},
		{"no limit in the cgroup keeps the previous status's", containers(
			v1.ResourceRequirements{Requests: resourceList("100m", "")}),
			cgroups.Settings{CPUShares: 102}, &v1.ResourceRequirements{Limits: resourceList("500m", "1Gi")},
			resourceList("100m", ""), resourceList("500m", "1Gi")},
		{"BestEffort: the least shares, no request reported", containers(v1.ResourceRequirements{}),
			cgroups.Settings{CPUShares: 2}, nil,
			resourceList("", ""), resourceList("", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runningPodResources(tc.pod, tc.got, tc.old)
			for _, c := range []struct {
				what      string
				got, want v1.ResourceList
			}{{"requests", got.Requests, tc.req}, {"limits", got.Limits, tc.limit}} {
				if len(c.got) != len(c.want) {
					t.Errorf("%s %v, want %v", c.what, c.got, c.want)
					continue
				}
				for name, q := range c.want {
					if g, ok := c.got[name]; !ok || g.Cmp(q) != 0 {
						t.Errorf("%s[%s] = %v, want %v", c.what, name, c.got[name], q.String())
					}
				}
			}
		})
	}
}
