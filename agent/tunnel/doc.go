// Package tunnel makes the node API reachable from an apiserver that cannot dial the node: a
// gateway behind NAT dials out to a konnectivity server (Kubernetes' apiserver-network-proxy,
// sigs.k8s.io/apiserver-network-proxy) and keeps that gRPC stream open; the apiserver's egress
// selector sends its node traffic (logs, exec, port-forward, the node proxy) to the server,
// which forwards each connection over the stream of the agent whose identifiers match the
// node's address; the agent here connects it to holdfast's own node API.
//
// It owns the agent side of the konnectivity protocol, and nothing else:
//
//   - Agent connects to the server (TLS, with a client certificate and/or a bearer token, as
//     the upstream agent's --agent-cert/--agent-key and --service-account-token-path), announces
//     the agent ID and identifiers, serves DIAL_REQ, DATA and CLOSE_REQ, and reconnects with the
//     upstream agent's back-off (1s growing by 1.5 to 10s, 10% jitter). With servers in HA it
//     keeps one stream per server, as many as the servers report (the serverCount header).
//   - Listener is the in-memory listener the node API serves the tunnel's connections on: a dial
//     the server asks for is never made on the network.
//
// # Why not the upstream agent's ClientSet
//
// sigs.k8s.io/apiserver-network-proxy/pkg/agent (v0.36.0) dials every DIAL_REQ with
// net.DialTimeout and has no hook for another dialer, so with it the node API would have to
// listen on the node's address for the agent to reach it: the direct path would stay open,
// which is what a gateway behind NAT, or one whose operator wants the tunnel only, must not
// need. Its ClientSet also starts goroutines nobody can wait for (Serve returns at once; the
// sync loop sleeps before it looks at its stop channel; each connection's copiers run on
// context.Background), logs through klog and registers global metrics. This package speaks the
// same wire protocol with upstream's own generated types (proto/agent, konnectivity-client's
// proto/client, proto/header), so the server cannot tell the difference, and the integration
// test runs it against the real konnectivity server. Every goroutine here has an owner that
// waits for it: Run returns only after every stream and every connection it served ended.
package tunnel
