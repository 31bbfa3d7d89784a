package conformance

import "regexp"

// Causes classify holdfast's failures in docs/conformance.md; the first match wins, messages
// before names. Each is a gap for an issue-sized piece of work. A failure no cause matches is
// listed as "other" with its message.
var Causes = []Cause{
	{
		Name:    "node API not served",
		Pattern: regexp.MustCompile(`(?i):10250|error dialing backend|dial tcp [0-9.]+:0:|unable to upgrade connection|container logs|GetPodLogs|failed to get logs|kubelet.*(connection refused|no route)|does not have a host assigned|an error on the server \("unknown"\) has prevented the request from succeeding \(get pods`),
		Work:    "serve the kubelet API (containerLogs, exec, attach, portForward, healthz) on the node's port, authenticated by the cluster's CA, and report it in status.daemonEndpoints",
	},
	{
		Name:    "refused as UnsupportedPodSpec",
		Pattern: regexp.MustCompile(`UnsupportedPodSpec`),
		Work:    "implement the PodSpec field the pod's status names (agent/admission/unsupported.go lists them)",
	},
	{
		Name:    "image pull behaviour",
		Pattern: regexp.MustCompile(`(?i)ImagePullBackOff|ErrImagePull|imagePullSecrets|pull image|private registry`),
		Work:    "ImagePullBackOff, imagePullSecrets and node registry credentials, kubelet's pull events",
	},
	{
		Name:    "termination message",
		Pattern: regexp.MustCompile(`(?i)termination message`),
		OnName:  true,
		Work:    "terminationMessagePath / terminationMessagePolicy (FallbackToLogsOnError): write the file, report it in the container's terminated state",
	},
	{
		Name:    "service links",
		Pattern: regexp.MustCompile(`(?i)environment variables for services|enableServiceLinks`),
		OnName:  true,
		Work:    "service link environment variables (KUBERNETES_SERVICE_HOST and one set per service), enableServiceLinks",
	},
	{
		Name:    "ephemeral containers",
		Pattern: regexp.MustCompile(`(?i)ephemeral container`),
		OnName:  true,
		Work:    "ephemeral containers (kubectl debug), which also needs the node API's attach",
	},
	{
		Name:    "in-place resize",
		Pattern: regexp.MustCompile(`(?i)resize`),
		OnName:  true,
		Work:    "in-place pod resize: resize the cgroups, report allocatedResources and the resize conditions",
	},
	{
		Name:    "activeDeadlineSeconds",
		Pattern: regexp.MustCompile(`(?i)activeDeadlineSeconds|active deadline`),
		OnName:  true,
		Work:    "activeDeadlineSeconds: fail the pod with reason DeadlineExceeded",
	},
	{
		Name:    "RuntimeClass",
		Pattern: regexp.MustCompile(`RuntimeClass`),
		OnName:  true,
		Work:    "runtimeClassName: a handler per class, the pod overhead",
	},
	{
		Name:    "sysctls",
		Pattern: regexp.MustCompile(`(?i)sysctl`),
		OnName:  true,
		Work:    "securityContext.sysctls (safe and allowed unsafe ones), rejection with SysctlForbidden",
	},
	{
		Name:    "node lease",
		Pattern: regexp.MustCompile(`NodeLease`),
		OnName:  true,
		Work:    "the node Lease and status as the test expects them",
	},
	{
		Name:    "timed out waiting for the pod",
		Pattern: regexp.MustCompile(`(?i)timed out|context deadline exceeded`),
		Work:    "read the test and holdfast's log: the pod did not reach the state the test waits for",
	},
}
