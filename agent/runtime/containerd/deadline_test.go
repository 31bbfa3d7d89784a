package containerd

import (
	"testing"
	"time"
)

// TestCallTimeouts: each kind of containerd call gets its bound (runtime.CallDeadlines applies
// them).
func TestCallTimeouts(t *testing.T) {
	const request = time.Minute
	for _, tc := range []struct {
		method string
		want   time.Duration // 0: no deadline
	}{
		{"/containerd.services.containers.v1.Containers/List", request},
		{"/containerd.services.tasks.v1.Tasks/Get", request},
		{"/containerd.services.tasks.v1.Tasks/Kill", request},
		{"/containerd.services.tasks.v1.Tasks/Wait", 0},
		{"/containerd.services.diff.v1.Diff/Apply", layerApplyTimeout},
	} {
		if got, want := callTimeout(tc.method, false, request), tc.want; got != want {
			t.Errorf("%s: callTimeout %s, want %s", tc.method, got, want)
		}
	}

	for _, tc := range []struct {
		method string
		want   time.Duration
	}{
		{"/containerd.services.containers.v1.Containers/ListStream", request},
		{"/containerd.services.snapshots.v1.Snapshots/List", request},
		{"/containerd.services.content.v1.Content/Read", layerApplyTimeout},
		{"/containerd.services.content.v1.Content/Write", 0},
		{"/containerd.services.events.v1.Events/Subscribe", 0},
	} {
		if got := callTimeout(tc.method, true, request); got != tc.want {
			t.Errorf("stream %s: callTimeout %s, want %s", tc.method, got, tc.want)
		}
	}
}
