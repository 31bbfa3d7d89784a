package cri

import (
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCallBound: each CRI call is bounded by the request timeout but those that last by
// nature: a pull not at all, a stop by its grace period and the kill after it, an ExecSync
// by its own timeout (none when it has none), the event stream not at all.
func TestCallBound(t *testing.T) {
	const request = 2 * time.Minute
	bound := callBound(request)
	for _, tc := range []struct {
		method string
		stream bool
		req    any
		want   time.Duration
	}{
		{"/runtime.v1.RuntimeService/ListContainers", false, &criapi.ListContainersRequest{}, request},
		{"/runtime.v1.RuntimeService/RunPodSandbox", false, &criapi.RunPodSandboxRequest{}, request},
		{"/runtime.v1.ImageService/PullImage", false, &criapi.PullImageRequest{}, 0},
		{"/runtime.v1.RuntimeService/StopContainer", false, &criapi.StopContainerRequest{Timeout: 30}, 30*time.Second + request},
		{"/runtime.v1.RuntimeService/StopContainer", false, &criapi.StopContainerRequest{}, request},
		{"/runtime.v1.RuntimeService/ExecSync", false, &criapi.ExecSyncRequest{Timeout: 5}, 5*time.Second + request},
		{"/runtime.v1.RuntimeService/ExecSync", false, &criapi.ExecSyncRequest{}, 0},
		{"/runtime.v1.RuntimeService/GetContainerEvents", true, nil, 0},
	} {
		if got := bound(tc.method, tc.stream, tc.req); got != tc.want {
			t.Errorf("%s %+v: bound %v, want %v", tc.method, tc.req, got, tc.want)
		}
	}
}
