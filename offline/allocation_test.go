package offline

import (
	"errors"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
)

func testAllocation(cpu string) Allocation {
	return Allocation{Containers: map[string]v1.ResourceRequirements{"app": {
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu)},
		Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse("64Mi")},
	}}}
}

// testAllocations: a pod's allocation is kept, replaced by the next, untouched by a put of
// the pod (the apiserver's copy with the desired resources), gone with the pod; an unchanged
// one writes nothing; one for a pod not recorded is ErrNotFound.
func testAllocations(t *testing.T, s Store) {
	if err := s.SetAllocation("uid-1", testAllocation("100m")); !errors.Is(err, ErrNotFound) {
		t.Errorf("allocation of a pod not recorded: %v, want ErrNotFound", err)
	}
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	if _, err := s.GetAllocation("uid-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("allocation before any: %v, want ErrNotFound", err)
	}
	for _, cpu := range []string{"100m", "250m", "50m"} {
		must(t, s.SetAllocation("uid-1", testAllocation(cpu)))
		must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
		got, err := s.GetAllocation("uid-1")
		if err != nil || !equality.Semantic.DeepEqual(got, testAllocation(cpu)) {
			t.Errorf("allocation after setting %s: %+v, %v", cpu, got, err)
		}
	}
	before := s.Stats().SkippedWrites
	must(t, s.SetAllocation("uid-1", testAllocation("50m")))
	if s.Stats().SkippedWrites != before+1 {
		t.Errorf("an unchanged allocation was written")
	}
	must(t, s.DeletePod("uid-1"))
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	if _, err := s.GetAllocation("uid-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("allocation of a deleted pod made again: %v, want ErrNotFound", err)
	}
	if err := s.SetAllocation("uid-1", Allocation{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an allocation without containers: %v, want ErrInvalid", err)
	}
}

// The allocation survives a restart of the agent (the database closed and opened again).
func TestAllocationSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	must(t, s.SetAllocation("uid-1", testAllocation("250m")))
	must(t, s.Close())
	s, _ = openTestStore(t, path, Options{Key: testKey})
	got, err := s.GetAllocation("uid-1")
	if err != nil || !equality.Semantic.DeepEqual(got, testAllocation("250m")) {
		t.Errorf("allocation after reopening: %+v, %v", got, err)
	}
}

// An allocation as the agent wrote it before pod-level resources were admitted (no "pod") is
// read as one with none; one with pod-level resources reads back as written.
func TestAllocationPodLevelCompat(t *testing.T) {
	old, err := encodeValue(map[string]any{"containers": map[string]any{"app": map[string]any{
		"requests": map[string]string{"cpu": "100m"}, "limits": map[string]string{"cpu": "100m", "memory": "64Mi"}}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeAllocation(old)
	if err != nil || got.Pod != nil || !equality.Semantic.DeepEqual(got, testAllocation("100m")) {
		t.Fatalf("an allocation of the previous shape read as %+v, %v; want %+v", got, err, testAllocation("100m"))
	}
	want := testAllocation("100m")
	want.Pod = &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("128Mi")}}
	raw, err := encodeAllocation(want)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = decodeAllocation(raw); err != nil || !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("an allocation with pod-level resources read back as %+v, %v; want %+v", got, err, want)
	}
}
