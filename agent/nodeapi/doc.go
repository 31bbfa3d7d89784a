// Package nodeapi serves the kubelet API on the node's port (10250 by default) over HTTPS:
// what the apiserver proxies `kubectl logs`, `kubectl exec`, `kubectl attach`, `kubectl
// port-forward` and metrics-server's scrapes to, with the kubelet's paths and semantics.
//
//	/containerLogs/NS/POD/CONTAINER   follow, tailLines, sinceSeconds, sinceTime, previous,
//	                                  timestamps, limitBytes (read from the CRI log files)
//	/exec/NS/POD[/UID]/CONTAINER      SPDY (and WebSocket) remote command, stdin, tty, resize
//	/portForward/NS/POD[/UID]         SPDY (and WebSocket) port forwarding into the pod's network
//	/attach/NS/POD[/UID]/CONTAINER    SPDY (and WebSocket): the container's output from then on,
//	                                  followed in its log (the output goes to holdfast-logger,
//	                                  never through the agent); stdin and resize with stdin and
//	                                  tty (runtime.Attach)
//	/pods                             the node's pods as a v1.PodList
//	/healthz                          the agent's health (the runtime relist)
//	/stats/summary, /metrics/resource the kubelet's Summary API and resource metrics (agent/stats)
//	/metrics                          holdfast's own metrics (agent/metrics), Prometheus text
//
// The same API is served on a listener the konnectivity tunnel feeds (RunOn, agent/tunnel), for
// an apiserver that cannot dial the node; with tunnel.only it is the only way in.
//
// The streaming protocols are served by k8s.io/cri-streaming, the code containerd's CRI
// plugin and the kubelet's streaming server run; nothing here speaks SPDY or WebSocket itself.
//
// # Security
//
// Every request is authenticated and authorized, /healthz included; there is no anonymous
// access and no read-only port.
//
//   - Authentication (auth.go): a client certificate that verifies against the configured
//     client CA file (user: its CN, groups: its O, as the kubelet maps them), else a bearer
//     token checked with a TokenReview (results cached: 2 minutes, failures 10 seconds, as the
//     kubelet's webhook defaults). Otherwise 401.
//   - Authorization: a SubjectAccessReview for the user on resource nodes, name the node,
//     subresource from the path with the kubelet's mapping (proxy by default; stats, metrics,
//     log for /stats, /metrics, /logs; pods and healthz, then proxy, for /pods and /healthz),
//     verb from the HTTP method. Decisions are cached (allowed 5 minutes, denied 30 seconds,
//     the kubelet's defaults). Otherwise 403.
//   - Fail closed: with the apiserver out of reach, a request that needs a TokenReview or a
//     SubjectAccessReview not in the cache is refused (503). A client certificate of the
//     configured CA is not taken as authorization by itself: only the apiserver decides what a
//     user may do. The node API is therefore not started on a standalone node.
//
// The node API is never a reason for the agent to stop: a client CA file that cannot be read,
// a serving certificate that cannot be written or a port held by another process is logged as
// an error and the API stays off (the port is retried), while pods and heartbeats go on.
//
// Names in paths are checked as Kubernetes names before they are used (a path traversal gets
// 400); log files are opened without following symlinks (agent/logs); at most
// maxStreams log, exec, attach and port-forward requests run at once (429 past it).
package nodeapi
