package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// A pod's startup (holdfast_pod_start_duration_seconds) ends when every app container runs;
// init containers and a container waiting or exited do not end it.
func TestAllContainersRunning(t *testing.T) {
	running := v1.ContainerState{Running: &v1.ContainerStateRunning{}}
	waiting := v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init"}},
		Containers:     []v1.Container{{Name: "a"}, {Name: "b"}},
	}}
	for _, c := range []struct {
		name string
		st   v1.PodStatus
		want bool
	}{
		{"none reported", v1.PodStatus{}, false},
		{"one waiting", v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "a", State: running}, {Name: "b", State: waiting}}}, false},
		{"only the init container runs", v1.PodStatus{InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: running}}}, false},
		{"all running", v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "a", State: running}, {Name: "b", State: running}}}, true},
	} {
		if got := allContainersRunning(pod, c.st); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
