// Package containerd is the containerd backend of the runtime contract (agent/runtime): it
// runs containers with containerd through its Go client, inside one containerd namespace that
// holdfast owns, and translates the pod layer's description of a container into an OCI spec.
//
// The runtime is the source of truth for "what exists": every container holdfast creates
// carries labels naming its pod (UID, namespace, name), its container name and its attempt,
// and the agent records on the container itself when it started, when it finished and how
// (exit code, reason). After an agent restart, List answers from containerd alone; nothing
// is started twice because the agent forgot it.
//
// A task's exit is recorded in the labels and the task is then deleted, so that an exited
// container costs no shim process; the container record and its snapshot stay until the pod
// worker removes them (they are the pod's lastState and logs).
package containerd
