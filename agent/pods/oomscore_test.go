package pods

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
)

// Pods' OOM scores follow their QoS class as kubelet's do when the agent runs at -999 (the
// firmware unit's OOMScoreAdjust): the clamp to the agent's own score changes none of them.
// An agent left at 0 (no unit, or a sandbox without CAP_SYS_RESOURCE) lifts Guaranteed pods to 0.
func TestOOMScoreAdjFollowsQoSWithAgentAtMinus999(t *testing.T) {
	const memCapacity = 4 << 30
	res := func(cpu, mem string, limits bool) v1.ResourceRequirements {
		r := v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}}
		if limits {
			r.Limits = r.Requests.DeepCopy()
		}
		return r
	}
	pod := func(r v1.ResourceRequirements) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: r}}}}
	}
	for _, tc := range []struct {
		name       string
		pod        *v1.Pod
		atMinus999 int
		atZero     int
	}{
		{"guaranteed", pod(res("1", "1Gi", true)), -997, 0},
		{"burstable, a quarter of memory", pod(res("100m", "1Gi", false)), 750, 750},
		{"best effort", pod(v1.ResourceRequirements{}), 1000, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj := oomScoreAdj(tc.pod, &tc.pod.Spec.Containers[0], memCapacity)
			if got := runtime.ClampOOMScoreAdj(adj, -999); got != tc.atMinus999 {
				t.Errorf("agent at -999: %d, want %d", got, tc.atMinus999)
			}
			if got := runtime.ClampOOMScoreAdj(adj, 0); got != tc.atZero {
				t.Errorf("agent at 0: %d, want %d", got, tc.atZero)
			}
		})
	}
}

// With the swap controller, every container gets memory.swap.max 0 (kubelet's NoSwap); without
// it, nothing is written.
func TestNoSwap(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "a"}}}}
	for _, noSwap := range []bool{true, false} {
		s := &oci.Spec{Process: &specs.Process{}}
		cfg := runtime.ContainerConfig{NetNSPath: "/var/run/netns/test", Resources: containerResources(pod, &pod.Spec.Containers[0], 1<<30, noSwap)}
		if err := oci.ApplyOpts(context.Background(), nil, &containers.Container{}, s, containerd.ContainerSpecOpts(cfg, containerd.NodeSecurity{})...); err != nil {
			t.Fatal(err)
		}
		var got string
		if s.Linux != nil && s.Linux.Resources != nil {
			got = s.Linux.Resources.Unified["memory.swap.max"]
		}
		if want := map[bool]string{true: "0", false: ""}[noSwap]; got != want {
			t.Errorf("noSwap %v: memory.swap.max %q, want %q", noSwap, got, want)
		}
	}
}
