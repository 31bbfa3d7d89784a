package podutil

import v1 "k8s.io/api/core/v1"

// IsTerminal reports whether a pod's phase is Succeeded or Failed: a phase a pod never leaves.
func IsTerminal(p v1.PodPhase) bool { return p == v1.PodSucceeded || p == v1.PodFailed }
