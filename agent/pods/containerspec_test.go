package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// resourceList is a list of cpu and memory quantities, either left out when empty.
func resourceList(cpu, mem string) v1.ResourceList {
	l := v1.ResourceList{}
	if cpu != "" {
		l[v1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		l[v1.ResourceMemory] = resource.MustParse(mem)
	}
	return l
}

// TestContainerResourcesPodLevel: a container without a limit of its own in a pod with
// pod-level limits runs with the pod's (the kubelet's getCPULimit and getMemoryLimit in
// kuberuntime_container_linux.go, 1.37): the limit then also gives its shares where it asks
// for no CPU, as a container limit does. A container's own limits and requests win; pod-level
// requests alone change nothing of a container's.
func TestContainerResourcesPodLevel(t *testing.T) {
	for _, tt := range []struct {
		name string
		pod  *v1.ResourceRequirements
		own  v1.ResourceRequirements
		want runtime.Resources
	}{
		{"no limits of its own: the pod's", &v1.ResourceRequirements{Requests: resourceList("1", "100Mi"), Limits: resourceList("1", "100Mi")}, v1.ResourceRequirements{},
			runtime.Resources{CPUShares: 1024, CPUQuota: 100000, CPUPeriod: 100000, MemoryLimit: 100 << 20}},
		{"its own limits win", &v1.ResourceRequirements{Requests: resourceList("1", "100Mi"), Limits: resourceList("1", "100Mi")},
			v1.ResourceRequirements{Requests: resourceList("500m", "50Mi"), Limits: resourceList("500m", "50Mi")},
			runtime.Resources{CPUShares: 512, CPUQuota: 50000, CPUPeriod: 100000, MemoryLimit: 50 << 20}},
		{"its own request, the pod's limit", &v1.ResourceRequirements{Requests: resourceList("1", "100Mi"), Limits: resourceList("1", "100Mi")},
			v1.ResourceRequirements{Requests: resourceList("200m", "")},
			runtime.Resources{CPUShares: 204, CPUQuota: 100000, CPUPeriod: 100000, MemoryLimit: 100 << 20}},
		{"its own CPU limit, the pod's memory limit", &v1.ResourceRequirements{Requests: resourceList("", "64Mi"), Limits: resourceList("", "64Mi")},
			v1.ResourceRequirements{Requests: resourceList("300m", ""), Limits: resourceList("300m", "")},
			runtime.Resources{CPUShares: 307, CPUQuota: 30000, CPUPeriod: 100000, MemoryLimit: 64 << 20}},
		{"pod-level requests only", &v1.ResourceRequirements{Requests: resourceList("1", "100Mi")}, v1.ResourceRequirements{},
			runtime.Resources{CPUShares: 2}},
		{"no pod-level resources", nil, v1.ResourceRequirements{}, runtime.Resources{CPUShares: 2}},
		{"empty pod-level resources", &v1.ResourceRequirements{}, v1.ResourceRequirements{Limits: resourceList("", "32Mi")},
			runtime.Resources{CPUShares: 2, MemoryLimit: 32 << 20}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{Resources: tt.pod, Containers: []v1.Container{{Name: "c", Resources: tt.own}}}}
			got := containerResources(pod, &pod.Spec.Containers[0], 0, false)
			got.OOMScoreAdj = 0
			if got != tt.want {
				t.Errorf("containerResources = %+v, want %+v", got, tt.want)
			}
		})
	}
}
