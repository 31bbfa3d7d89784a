package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// For every CPU request and limit in millicores up to 4 CPUs, a container whose cgroup holds
// what its allocation gives, read back on cgroup v1 (shares as written) or v2 (the least
// shares of the weight runc wrote; with the systemd driver the quota rounded as systemd keeps
// it), matches it (no endless resize of a container already
// resized) and reports its allocation as is, not a rounded value; one whose cgroup holds
// another limit (a resize not applied) reports that limit.
func TestStatusResourcesReadBack(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app"}}}}
	for milli := int64(1); milli <= 4000; milli++ {
		q := *resource.NewMilliQuantity(milli, resource.DecimalSI)
		c := &pod.Spec.Containers[0]
		c.Resources = v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: q}, Limits: v1.ResourceList{v1.ResourceCPU: *resource.NewMilliQuantity(2*milli, resource.DecimalSI)}}
		want := containerResources(pod, c, 0, false)
		v1read := runtime.Resources{CPUShares: want.CPUShares, CPUQuota: want.CPUQuota, CPUPeriod: want.CPUPeriod}
		v2read := v1read
		v2read.CPUShares = cgroups.WeightToShares(cgroups.SharesToWeight(want.CPUShares))
		// With the systemd cgroup driver, runc's scope holds the quota rounded up to a whole
		// percent of a CPU (15m: 20m's).
		sdread := v2read
		sdread.CPUQuota = (want.CPUQuota*10000/want.CPUPeriod + 99) / 100 * want.CPUPeriod / 100
		for name, got := range map[string]runtime.Resources{"v1": v1read, "v2": v2read, "v2 systemd": sdread} {
			if !cpuMatches(want, got) {
				t.Fatalf("%dm on %s: %+v read back does not match %+v", milli, name, got, want)
			}
			st := statusResources(c.Resources, want, got)
			if st.Requests.Cpu().MilliValue() != milli || st.Limits.Cpu().MilliValue() != 2*milli {
				t.Fatalf("%dm on %s: status %v/%v", milli, name, st.Requests.Cpu(), st.Limits.Cpu())
			}
		}
		other := v1read
		other.CPUQuota = want.CPUQuota / 2
		if milli >= 10 && (cpuMatches(want, other) || statusResources(c.Resources, want, other).Limits.Cpu().MilliValue() != milli) {
			t.Fatalf("%dm: a cgroup with half the quota matches, or is reported as %v", milli, statusResources(c.Resources, want, other).Limits.Cpu())
		}
	}
}
