// Package pods runs pods: one worker per pod UID, each serializing the syncs of its pod.
//
// A sync observes the pod's containers in the runtime, computes what to do with a pure
// function (plan.go: no I/O, table-tested), applies it, and computes the pod's status from
// what it then observes (podstatus.go, also pure). Container exits reach the workers within a
// fraction of a second through containerd's task events, each to its pod's worker alone; a
// relist every RelistPeriod, and at once when the event subscription is back after a break,
// is the safety net for anything an event missed.
//
// A pod is stopped only on an authoritative removal (Manager.Remove): the pod deleted in the
// API, or its manifest file removed. Containers the agent finds at start for pods no source
// has claimed are removed only once every source has reported its complete set of pods.
package pods
