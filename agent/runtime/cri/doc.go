// Package cri runs holdfast's pods on any container runtime through the kubelet's Container
// Runtime Interface (k8s.io/cri-api, v1): containerd's CRI plugin, CRI-O. It is the runtime
// backend of `runtime: cri`, beside the containerd client backend (agent/runtime).
//
// What differs from the containerd backend stays here, behind the same interfaces the pod
// workers use (runtime.Runtime, runtime.Network):
//
//   - The runtime makes each pod's sandbox, with its pause container and its network (the
//     runtime's own CNI configuration): Network.Setup is RunPodSandbox, for host-network pods
//     too, and the pod's IPs are the sandbox's.
//   - Containers are made from the kubelet's ContainerConfig: the pod's and the container's
//     securityContext go to the runtime as the kubelet sends them, and the runtime applies
//     them; resources are the numbers the containerd backend applies.
//   - The runtime writes the containers' logs (CRI format, at the path holdfast gives) and
//     keeps their exits; holdfast rotates the logs (RotateLogs) as the kubelet does.
//   - Sandboxes and containers carry the kubelet's labels (io.kubernetes.pod.name, namespace,
//     uid, io.kubernetes.container.name), so crictl and tools written for kubelet nodes find
//     holdfast's pods; holdfast's own are io.holdfast.managed and annotations for what the
//     runtime's status does not keep (spec hash, the image as the pod wrote it).
//
// The runtime is the source of truth, as with the containerd backend: after an agent restart,
// every answer comes from listing sandboxes and containers by label, and a create retried
// finds the attempt it made.
package cri
