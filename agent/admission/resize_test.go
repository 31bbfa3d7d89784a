package admission

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func resizePod(name string, milliCPU, mem int64) *v1.Pod {
	req := v1.ResourceList{}
	if milliCPU > 0 {
		req[v1.ResourceCPU] = *resource.NewMilliQuantity(milliCPU, resource.DecimalSI)
	}
	if mem > 0 {
		req[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Resources: v1.ResourceRequirements{Requests: req}}}}}
}

// Generated nodes, other pods and resizes against a model in plain integers: a resize fits
// when the others' requests and its own fit the node's allocatable, for CPU and memory; it is
// Infeasible when its own requests exceed the allocatable, whatever the others; otherwise it
// is Deferred. A node full of pods (allocatable pods reached) still resizes: the pod is there.
func TestCheckResizeAgainstModel(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)
	for i := range 5000 {
		allocCPU, allocMem := 100+rng.Int64N(4000), int64(1+rng.IntN(2048))<<20
		var others []*v1.Pod
		var usedCPU, usedMem int64
		for j := range rng.IntN(5) {
			c, m := rng.Int64N(allocCPU/2+1), rng.Int64N(allocMem/2+1)
			others = append(others, resizePod(fmt.Sprintf("other-%d", j), c, m))
			usedCPU, usedMem = usedCPU+c, usedMem+m
		}
		cpu, mem := rng.Int64N(allocCPU*3/2+1), rng.Int64N(allocMem*3/2+1)
		pod := resizePod("resized", cpu, mem)
		allocatable := v1.ResourceList{
			v1.ResourceCPU:    *resource.NewMilliQuantity(allocCPU, resource.DecimalSI),
			v1.ResourceMemory: *resource.NewQuantity(allocMem, resource.BinarySI),
			v1.ResourcePods:   *resource.NewQuantity(int64(len(others)), resource.DecimalSI),
		}
		got := CheckResize(pod, allocatable, others)
		var want string
		switch {
		case cpu > allocCPU || mem > allocMem:
			want = v1.PodReasonInfeasible
		case cpu > 0 && usedCPU+cpu > allocCPU, mem > 0 && usedMem+mem > allocMem:
			want = v1.PodReasonDeferred
		}
		if got.Fit != (want == "") || got.Reason != want {
			t.Fatalf("case %d (seed %d): cpu %dm of %dm (others %dm), memory %d of %d (others %d): %+v, want reason %q",
				i, seed, cpu, allocCPU, usedCPU, mem, allocMem, usedMem, got, want)
		}
		if want == v1.PodReasonInfeasible && !strings.HasPrefix(got.Message, "Node didn't have enough capacity: ") {
			t.Fatalf("infeasible message %q", got.Message)
		}
		if want == v1.PodReasonDeferred && !strings.HasPrefix(got.Message, "Node didn't have enough resource: ") {
			t.Fatalf("deferred message %q", got.Message)
		}
	}
}
