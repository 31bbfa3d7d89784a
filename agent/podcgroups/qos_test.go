package podcgroups

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/internal/podutil"
)

// TestQOSAsTheKubelet is the kubelet's own table (pkg/apis/core/v1/helper/qos qos_test.go
// TestComputePodQOS, v1.37.2), with pod-level rows, run against the QoS
// class that decides a pod's cgroup (podutil.ComputePodQOS), each case's pod then placed in
// its class's directory.
func TestQOSAsTheKubelet(t *testing.T) {
	guaranteed := v1.ResourceRequirements{
		Requests: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("100Mi"),
			v1.ResourceEphemeralStorage: resource.MustParse("10Gi"), // does not count
		},
		Limits: resourceList("100m", "100Mi"),
	}
	bestEffort := []v1.ResourceRequirements{
		{},
		{Requests: resourceList("0", "0")},
		{Requests: resourceList("0", "0"), Limits: resourceList("0", "0")},
		{Requests: v1.ResourceList{v1.ResourceCPU: resource.Quantity{}, v1.ResourceMemory: resource.Quantity{}}},
		{Requests: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}},
		{Requests: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}, Limits: v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}},
	}
	burstable := []v1.ResourceRequirements{
		{Requests: resourceList("100m", "100Mi"), Limits: resourceList("200m", "200Mi")},
		{Requests: resourceList("100m", "100Mi"), Limits: resourceList("100m", "200Mi")},
		{Requests: resourceList("100m", "100Mi"), Limits: resourceList("200m", "100Mi")},
		{Requests: resourceList("100m", "100Mi")},
		{Requests: resourceList("100m", "100Mi"), Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}},
	}
	type testCase struct {
		name string
		pod  *v1.Pod
		want v1.PodQOSClass
	}
	tests := []testCase{{"guaranteed", podWith(nil, guaranteed), v1.PodQOSGuaranteed}}
	for i, r := range bestEffort {
		tests = append(tests, testCase{fmt.Sprintf("best-effort-%d", i), podWith(nil, r), v1.PodQOSBestEffort})
	}
	for i, r := range burstable {
		tests = append(tests, testCase{fmt.Sprintf("burstable-%d", i), podWith(nil, r), v1.PodQOSBurstable})
	}
	two := []testCase{
		{"2c-guaranteed", podWith(nil, guaranteed, guaranteed), v1.PodQOSGuaranteed},
		{"2c-best-effort", podWith(nil, bestEffort[0], bestEffort[1]), v1.PodQOSBestEffort},
		{"2c-burstable", podWith(nil, burstable[0], burstable[1]), v1.PodQOSBurstable},
	}
	for i, r1 := range []v1.ResourceRequirements{guaranteed, bestEffort[0], burstable[0]} {
		for j, r2 := range []v1.ResourceRequirements{guaranteed, bestEffort[1], burstable[1]} {
			if i != j {
				two = append(two, testCase{fmt.Sprintf("2c-mixed-burstable-%d-%d", i, j), podWith(nil, r1, r2), v1.PodQOSBurstable})
			}
		}
	}
	tests = append(tests, two...)
	// The second container as an init container: the same class.
	for _, tc := range two {
		c := tc.pod.Spec.Containers
		tests = append(tests, testCase{tc.name + "-init", podWith([]v1.ResourceRequirements{c[1].Resources}, c[0].Resources), tc.want})
	}
	ephemeral := podWith(nil, guaranteed)
	ephemeral.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "ec"}}}
	tests = append(tests, testCase{"guaranteed-ephemeral", ephemeral, v1.PodQOSGuaranteed})

	// The pod-level rows (PodLevelResources, and PodLevelResourcesFixKubeletQOSClass: empty
	// pod-level resources do not decide): where the pod sets requests or limits of its own,
	// they alone give the class, whatever its containers ask.
	podLevel := func(name string, r v1.ResourceRequirements, want v1.PodQOSClass, containers ...v1.ResourceRequirements) {
		p := podWith(nil, containers...)
		p.Spec.Resources = &r
		tests = append(tests, testCase{"pod-level-" + name, p, want})
	}
	podLevel("guaranteed", guaranteed, v1.PodQOSGuaranteed, burstable[0])
	podLevel("guaranteed-containers-without", v1.ResourceRequirements{Requests: resourceList("1", "1Gi"), Limits: resourceList("1", "1Gi")}, v1.PodQOSGuaranteed, bestEffort[0], bestEffort[1])
	podLevel("burstable-over-guaranteed-containers", burstable[3], v1.PodQOSBurstable, guaranteed, guaranteed)
	podLevel("memory-only", v1.ResourceRequirements{Requests: resourceList("", "64Mi"), Limits: resourceList("", "64Mi")}, v1.PodQOSBurstable, guaranteed)
	podLevel("cpu-request-only", v1.ResourceRequirements{Requests: resourceList("100m", "")}, v1.PodQOSBurstable, bestEffort[0])
	podLevel("empty", v1.ResourceRequirements{}, v1.PodQOSGuaranteed, guaranteed)
	podLevel("empty-lists", v1.ResourceRequirements{Requests: v1.ResourceList{}, Limits: v1.ResourceList{}}, v1.PodQOSBurstable, burstable[1])

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := podutil.ComputePodQOS(tt.pod); got != tt.want {
				t.Fatalf("ComputePodQOS = %s, want %s", got, tt.want)
			}
			tt.pod.UID = "u"
			if got, want := PodDir("/", tt.pod), QOSDir("/", tt.want)+"/podu"; got != want {
				t.Errorf("PodDir = %s, want %s", got, want)
			}
		})
	}
}
