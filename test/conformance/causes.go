package conformance

import "regexp"

// Causes classify the failures of both agents in docs/conformance.md by their message alone:
// the first whose pattern matches the failure's message wins, whichever agent failed and
// whether the other failed too. A failure none matches is listed as "other" with its message.
// Each pattern is written against messages the suite gave (report_test.go holds them).
var Causes = []Cause{
	{
		Name:    "cgroup file unreadable in the container",
		Pattern: regexp.MustCompile(`failed to read cgroup value "[^"]+" for container`),
		Means:   "the test reads the container's cgroup files from inside it (the message names the file: a cgroup v1 path on a cgroup v1 machine) and the read failed",
	},
	{
		Name:    "variable named with a dash missing from env's output",
		Pattern: regexp.MustCompile(`expected "[A-Za-z0-9_]*-[A-Za-z0-9_.-]*=[^"]*" in container output`),
		Means:   "the test prints the container's environment with `sh -c env` and looks for a variable whose name is no shell identifier: a shell that leaves such variables out of its children's environment (Debian's busybox 1.35 ash) fails it on any agent",
	},
	{
		Name:    "node API",
		Pattern: regexp.MustCompile(`(?i):10250|error dialing backend|dial tcp [0-9.]+:0:|unable to upgrade connection|GetPodLogs|failed to get logs|kubelet.*(connection refused|no route)|does not have a host assigned|an error on the server \("unknown"\) has prevented the request from succeeding \(get pods`),
		Means:   "the node API (logs, exec, attach, port-forward) did not answer as the test expects: read the test's request and the agent's log",
	},
	{
		Name:    "refused as UnsupportedPodSpec",
		Pattern: regexp.MustCompile(`UnsupportedPodSpec`),
		Means:   "holdfast refused a PodSpec field it does not implement (agent/admission/unsupported.go lists them; the pod's status names the field)",
	},
	{
		Name:    "kernel: operation not supported",
		Pattern: regexp.MustCompile(`RTNETLINK answers: Operation not supported`),
		Means:   "the container's command asked the kernel for something this machine's kernel does not offer (e.g. a network device type whose module is absent)",
	},
	{
		Name:    "image pull",
		Pattern: regexp.MustCompile(`(?i)ImagePullBackOff|ErrImagePull|pull image|failed to resolve reference`),
		Means:   "an image was not pulled: the message names it; the harness's registry holds only the images it builds (test/conformance/images.go)",
	},
	{
		Name:    "oom_score_adj above the QoS class's",
		Pattern: regexp.MustCompile(`oom_score_adj value -?[0-9]+ not equal to expected -?[0-9]+`),
		Means:   "the test reads the container's oom_score_adj and wants the kubelet's score for its QoS class (-997 for Guaranteed); a process without CAP_SYS_RESOURCE (this machine's, when it has none: `grep CapEff /proc/self/status`) may not lower a score below its own, so the harness's containerd runs with restrict_oom_score_adj and both agents' containers keep the runtime's score (0)",
	},
	{
		Name:    "timed out",
		Pattern: regexp.MustCompile(`(?i)timed out|context deadline exceeded`),
		Means:   "the pod did not reach the state the test waits for in its time: read the test and the agent's log",
	},
}
