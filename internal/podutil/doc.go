// Package podutil holds the three small helpers of a pod's spec the agent took from
// k8s.io/kubectl, so that the agent does not require that module: a pod's QoS class
// (qos.go), a downward API field path's value (fieldpath.go), and a container's resource
// as the downward API reports it (resource.go). Each follows kubectl v0.37.2's
// pkg/util/{qos,fieldpath,resource} (Apache License 2.0, the Kubernetes Authors), behaviour
// unchanged. And IsTerminal (phase.go), the one test of a terminal phase the pod workers and
// the status manager share.
package podutil
