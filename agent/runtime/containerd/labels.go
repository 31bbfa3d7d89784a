package containerd

import (
	"strconv"
	"time"
)

// Labels holdfast puts on every containerd container it creates. The prefix keeps them apart
// from anything another client of the same containerd may set.
const (
	labelPrefix        = "io.holdfast."
	LabelPodUID        = labelPrefix + "pod.uid"
	LabelPodName       = labelPrefix + "pod.name"
	LabelPodNamespace  = labelPrefix + "pod.namespace"
	LabelContainerName = labelPrefix + "container.name"
	LabelAttempt       = labelPrefix + "container.attempt"
	LabelImage         = labelPrefix + "container.image"
	LabelImageID       = labelPrefix + "container.image-id"
	LabelLogPath       = labelPrefix + "container.log-path"
	LabelSpecHash      = labelPrefix + "container.spec-hash"
	LabelStartedAt     = labelPrefix + "state.started-at"
	LabelFinishedAt    = labelPrefix + "state.finished-at"
	LabelExitCode      = labelPrefix + "state.exit-code"
	LabelReason        = labelPrefix + "state.reason"
	LabelMessage       = labelPrefix + "state.message"
	// LabelStdin is "true" for a container with stdin: true, "once" with stdinOnce: true too;
	// absent without stdin. LabelTTY is "true" for a container with tty: true.
	LabelStdin = labelPrefix + "container.stdin"
	LabelTTY   = labelPrefix + "container.tty"
	// LabelStatic is "true" on a static pod's container (runtime.ContainerConfig.Static).
	LabelStatic = labelPrefix + "pod.static"
	// LabelMemoryRequest is the container's memory request in bytes
	// (runtime.ContainerConfig.MemoryRequest).
	LabelMemoryRequest = labelPrefix + "container.memory-request"
)

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// parseBytes is a count of bytes a label holds, nil where it holds none (a container created
// before the label was).
func parseBytes(s string) *int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}

func parseInt(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return n
}
