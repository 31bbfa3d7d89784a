package conformance

import "regexp"

// Causes classify holdfast's failures in docs/conformance.md; the first match wins, messages
// before names. Each is a gap for an issue-sized piece of work. A failure no cause matches is
// listed as "other" with its message.
var Causes = []Cause{
	// Fixed after the dated run in docs/conformance.md; each names the commit. Checked by a
	// focused run of these tests on holdfast alone (-conformance.agents=holdfast
	// -conformance.focus=...) at 2026-12-03T23:00Z, commit 248ffaa: all passed.
	{
		Name:    "fixed after this run: init container statuses",
		Pattern: regexp.MustCompile(`InitContainer .*should not start app containers if init containers fail on a RestartAlways pod`),
		OnName:  true,
		Work:    "none left: 0ddf1dd (Initialized's message names a retried init container that runs again; a regular init container is never Ready while it runs; passed in a focused run after it)",
	},
	{
		Name:    "fixed after this run: memory emptyDir mode",
		Pattern: regexp.MustCompile(`EmptyDir volumes when FSGroup is specified .*nonexistent volume subPath should have the correct mode and owner using FSGroup`),
		OnName:  true,
		Work:    "none left: 0ddf1dd (a memory emptyDir's tmpfs keeps the sticky bit of a tmpfs root, as kubelet mounts it, and new subPath directories get it; passed in a focused run after it)",
	},
	{
		Name:    "fixed after this run: sidecar startup gating",
		Pattern: regexp.MustCompile(`restartable init container .*should be ready immediately after startupProbe succeeds`),
		OnName:  true,
		Work:    "none left: 9dd5f77 (the containers after a sidecar wait until its startup probe passed; passed in a focused run after it)",
	},
	{
		Name:    "node API",
		Pattern: regexp.MustCompile(`(?i):10250|error dialing backend|dial tcp [0-9.]+:0:|unable to upgrade connection|container logs|GetPodLogs|failed to get logs|kubelet.*(connection refused|no route)|does not have a host assigned|an error on the server \("unknown"\) has prevented the request from succeeding \(get pods`),
		Work:    "the node API (agent/nodeapi) did not answer as the kubelet does: read the test's request and holdfast's log",
	},
	{
		Name:    "refused as UnsupportedPodSpec",
		Pattern: regexp.MustCompile(`UnsupportedPodSpec`),
		Work:    "implement the PodSpec field the pod's status names (agent/admission/unsupported.go lists them)",
	},
	{
		Name:    "image pull behaviour",
		Pattern: regexp.MustCompile(`(?i)ImagePullBackOff|ErrImagePull|imagePullSecrets|pull image|private registry`),
		Work:    "the image pull as the kubelet does it: policy, credentials, back-off, events",
	},
	{
		Name:    "in-place resize",
		Pattern: regexp.MustCompile(`(?i)resize`),
		OnName:  true,
		Work:    "in-place pod resize: resize the cgroups, report allocatedResources and the resize conditions",
	},
	{
		Name:    "RuntimeClass",
		Pattern: regexp.MustCompile(`RuntimeClass`),
		OnName:  true,
		Work:    "runtimeClassName: a handler per class, the pod overhead",
	},
	{
		Name:    "attach",
		Pattern: regexp.MustCompile(`(?i)\battach\b`),
		OnName:  true,
		Work:    "the node API's /attach: containers created with their stdin kept open, attached through containerd",
	},
	{
		Name:    "timed out waiting for the pod",
		Pattern: regexp.MustCompile(`(?i)timed out|context deadline exceeded`),
		Work:    "read the test and holdfast's log: the pod did not reach the state the test waits for",
	},
}
