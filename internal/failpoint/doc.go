// Package failpoint marks the crash windows of holdfast's persistence: the points where a
// process killed between two steps leaves one done and the other not (a bbolt commit made but
// not yet acknowledged, a container made but not yet started). Tests stop the agent dead at
// exactly one of them and kill -9 it, then check that nothing acknowledged was lost and
// nothing ran twice (agent TestFailpointsCrossedByKill).
//
// The production binary carries none of it: without the build tag failpoints, Inject is an
// empty function the compiler removes. The agent under test is built with -tags failpoints
// (test/testenv), and a point is armed by the environment:
//
//	HOLDFAST_FAILPOINT=store-before-commit@3   stop at the third crossing of that point
//	HOLDFAST_FAILPOINT_MARKER=/path            written with the point's name when it stops
//
// When the armed point is reached, the marker is written and fsynced, and the process stops
// itself with SIGSTOP: every goroutine freezes at once, as a power cut or a kill -9 at that
// instant would leave it, and the harness, having seen the marker, kills it with SIGKILL.
package failpoint

// The points, named where they are injected. Each is a window between two effects that must
// survive a crash in either order.
const (
	// StoreBeforeCommit: a state store write transaction has run every write of its batch,
	// the bbolt commit (and its fsync) not yet made. Nothing of the batch is acknowledged.
	StoreBeforeCommit = "store-before-commit"
	// StoreAfterCommit: the bbolt commit is on disk, the writers not yet told.
	StoreAfterCommit = "store-after-commit"
	// OutboxAfterAppend: a pod status is committed to the outbox, not yet handed to the
	// sender.
	OutboxAfterAppend = "outbox-after-append"
	// OutboxBeforeAck: the apiserver has accepted a pod status, the outbox's entries for it
	// not yet removed: the status is sent again after the restart.
	OutboxBeforeAck = "outbox-before-ack"
	// PodBeforeCreate: the pod and its admission are in the store, its container not yet
	// asked of containerd.
	PodBeforeCreate = "pod-before-create"
	// ContainerBeforeRecord: the container's snapshot is made, its containerd container
	// record not yet (the window of the leftover snapshot bug, 332e127).
	ContainerBeforeRecord = "container-before-record"
	// ContainerBeforeStart: the container record is made, its task not yet.
	ContainerBeforeStart = "container-before-start"
	// TaskBeforeStart: the container's task is created in containerd, not yet started.
	TaskBeforeStart = "task-before-start"
	// SandboxAfterRun: the CRI runtime has made the pod's sandbox, holdfast has not read it
	// yet: after the restart the pod must be given that sandbox, not a second one.
	SandboxAfterRun = "sandbox-after-run"
)

// All lists every point, for the tests that cross each one.
var All = []string{
	StoreBeforeCommit, StoreAfterCommit, OutboxAfterAppend, OutboxBeforeAck,
	PodBeforeCreate, ContainerBeforeRecord, ContainerBeforeStart, TaskBeforeStart, SandboxAfterRun,
}

// OnlyBackend names the runtime backend ("containerd" or "cri", as the configuration's
// runtime) that alone crosses a point; the others are crossed on both. The containerd backend
// makes a container's record and its task in steps of its own, where the CRI runtime has one
// call; only the CRI backend has sandboxes.
var OnlyBackend = map[string]string{
	ContainerBeforeRecord: "containerd",
	TaskBeforeStart:       "containerd",
	SandboxAfterRun:       "cri",
}

// Environment variables that arm a point in a binary built with -tags failpoints.
const (
	EnvPoint  = "HOLDFAST_FAILPOINT"
	EnvMarker = "HOLDFAST_FAILPOINT_MARKER"
)
