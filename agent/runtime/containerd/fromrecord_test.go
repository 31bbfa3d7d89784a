package containerd

import (
	"testing"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// TestFromRecordTaskStates: the state holdfast reads from a container record and its task as
// containerd lists it. A task whose state containerd could not get in time (UNKNOWN, no pid:
// seen on the gateway VM under software emulation, where a shim's answer takes over
// containerd's 2 seconds) is not a lost task: taken for one, the container was started a
// second time beside the one still running.
func TestFromRecordTaskStates(t *testing.T) {
	started := formatTime(time.Date(2026, 12, 3, 18, 32, 17, 0, time.UTC))
	rec := func(labels map[string]string) containers.Container {
		l := map[string]string{LabelPodUID: "uid", LabelPodName: "p", LabelContainerName: "c", LabelAttempt: "0"}
		for k, v := range labels {
			l[k] = v
		}
		return containers.Container{ID: "id", Labels: l}
	}
	for _, tc := range []struct {
		name       string
		labels     map[string]string
		task       *tasktypes.Process
		want       runtime.State
		wantReason string
	}{
		{"started, task running", map[string]string{LabelStartedAt: started}, &tasktypes.Process{Status: tasktypes.Status_RUNNING, Pid: 541}, runtime.StateRunning, ""},
		{"started, task state unknown", map[string]string{LabelStartedAt: started}, &tasktypes.Process{Status: tasktypes.Status_UNKNOWN}, runtime.StateRunning, ""},
		{"not started, task state unknown", nil, &tasktypes.Process{Status: tasktypes.Status_UNKNOWN}, runtime.StateCreated, ""},
		{"started, task stopped", map[string]string{LabelStartedAt: started}, &tasktypes.Process{Status: tasktypes.Status_STOPPED, ExitStatus: 1}, runtime.StateExited, runtime.ReasonError},
		{"started, no task", map[string]string{LabelStartedAt: started}, nil, runtime.StateExited, runtime.ReasonTaskLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fromRecord(rec(tc.labels), tc.task)
			if c.State != tc.want || c.Reason != tc.wantReason {
				t.Errorf("state %q reason %q, want %q reason %q", c.State, c.Reason, tc.want, tc.wantReason)
			}
		})
	}
}

// TestFromRecordStatic: a static pod's container says so itself, so that a previous version
// of a static pod is told from an API pod of the same name without the pod's record in the
// state store.
func TestFromRecordStatic(t *testing.T) {
	l := map[string]string{LabelPodUID: "uid", LabelPodName: "sensor-gw", LabelContainerName: "c", LabelAttempt: "0"}
	if c := fromRecord(containers.Container{ID: "id", Labels: l}, nil); c.Static {
		t.Error("a container without the static label read as a static pod's")
	}
	l[LabelStatic] = "true"
	if c := fromRecord(containers.Container{ID: "id", Labels: l}, nil); !c.Static {
		t.Error("a container with the static label read as an API pod's")
	}
}
