// Package prober runs the liveness, readiness and startup probes of the containers of the
// node's pods, with kubelet's semantics, so that a pod spec behaves on a holdfast node as it
// does on a kubelet node.
//
// One goroutine per (pod UID, container, probe kind) runs the probe every periodSeconds,
// from initialDelaySeconds after the container started, each attempt bounded by
// timeoutSeconds; successThreshold consecutive successes or failureThreshold consecutive
// failures change the cached result. The defaults are kubelet's: period 10 s, timeout 1 s,
// success threshold 1, failure threshold 3. The results are per container instance (its
// containerd ID): a restarted container starts over.
//
//   - startup: until it succeeds, the container is not started and neither liveness nor
//     readiness runs; once it succeeds it is not run again for that instance. Reaching its
//     failure threshold asks the pod worker to restart the container, like liveness.
//   - liveness: reaching the failure threshold asks the pod worker to restart the container
//     (OnContainerUnhealthy, exactly once per instance) and stops probing that instance.
//   - readiness: drives the container's Ready; not ready until the first success. A change
//     calls OnStatusChange so the pod worker reports the pod's status again.
//
// A probe attempt that could not run at all (a port name the container does not declare, the
// runtime unreachable, the exec'd command missing from the image) is "errored", as kubelet
// says: it is reported in an event and counts neither as a success nor as a failure.
//
// The pod worker tells the Manager what runs (UpdatePod, after every observation of the
// runtime, RemovePod when the pod is torn down) and asks it for Ready, Started and Unhealthy
// when it computes the pod's status and plan. Handlers are pluggable behind one interface:
// exec (through the container runtime), httpGet, tcpSocket, grpc, and Wasm probe policies
// named by a pod annotation (package policy).
package prober
