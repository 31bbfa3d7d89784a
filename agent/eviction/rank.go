package eviction

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
)

// PodStats is what a pod uses, as the eviction manager ranks pods by it.
type PodStats struct {
	// Memory is the working set of the pod's containers, in bytes.
	Memory int64
	// Disk is the pod's local storage on the node file system (disk emptyDir volumes, logs),
	// in bytes; Inodes the files it holds there.
	Disk, Inodes int64
	// PIDs is the number of tasks in the pod's containers.
	PIDs int64
	// Containers is the memory working set of each running container, by name, for the
	// eviction message.
	Containers map[string]int64
}

// StatsFunc returns a pod's stats; ok is false when they are not known.
type StatsFunc func(pod *v1.Pod) (PodStats, bool)

// cmpFunc compares two pods: negative when p1 is to be evicted before p2.
type cmpFunc func(p1, p2 *v1.Pod) int

// rank sorts pods, the first to evict first, by the comparisons in order (kubelet's orderedBy).
func rank(pods []*v1.Pod, cmps ...cmpFunc) {
	sort.SliceStable(pods, func(i, j int) bool {
		for _, c := range cmps {
			if r := c(pods[i], pods[j]); r != 0 {
				return r < 0
			}
		}
		return false
	})
}

// Rank orders pods for a signal as kubelet's eviction manager does:
//   - memory: pods whose usage exceeds their requests first, then by priority (lowest first),
//     then by usage above requests (largest first); a BestEffort pod requests nothing, so any
//     usage exceeds it;
//   - disk (bytes or inodes): the same with the pod's local storage and its ephemeral-storage
//     requests;
//   - PIDs: by priority, then by number of tasks (largest first).
//
// A pod without stats ranks first, as in kubelet.
func Rank(signal Signal, pods []*v1.Pod, stats StatsFunc) {
	switch signal.Resource() {
	case v1.ResourceMemory:
		use := func(s PodStats) int64 { return s.Memory }
		rank(pods, exceedsRequests(stats, v1.ResourceMemory, use), byPriority, aboveRequests(stats, v1.ResourceMemory, use))
	case v1.ResourceEphemeralStorage:
		use := func(s PodStats) int64 { return s.Disk }
		rank(pods, exceedsRequests(stats, v1.ResourceEphemeralStorage, use), byPriority, aboveRequests(stats, v1.ResourceEphemeralStorage, use))
	case resourceInodes:
		use := func(s PodStats) int64 { return s.Inodes }
		rank(pods, exceedsRequests(stats, resourceInodes, use), byPriority, aboveRequests(stats, resourceInodes, use))
	case resourcePIDs:
		rank(pods, byPriority, func(p1, p2 *v1.Pod) int {
			s1, ok1 := stats(p1)
			s2, ok2 := stats(p2)
			if !ok1 || !ok2 {
				return cmpBool(!ok1, !ok2)
			}
			return cmpInt(s2.PIDs, s1.PIDs)
		})
	}
}

// request is what the pod requests of a resource (0 for inodes, which cannot be requested).
func request(pod *v1.Pod, name v1.ResourceName) int64 {
	q, ok := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})[name]
	if !ok {
		return 0
	}
	return q.Value()
}

func exceedsRequests(stats StatsFunc, name v1.ResourceName, use func(PodStats) int64) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		s1, ok1 := stats(p1)
		s2, ok2 := stats(p2)
		if !ok1 || !ok2 {
			return cmpBool(!ok1, !ok2)
		}
		return cmpBool(use(s1) > request(p1, name), use(s2) > request(p2, name))
	}
}

func aboveRequests(stats StatsFunc, name v1.ResourceName, use func(PodStats) int64) cmpFunc {
	return func(p1, p2 *v1.Pod) int {
		s1, ok1 := stats(p1)
		s2, ok2 := stats(p2)
		if !ok1 || !ok2 {
			return cmpBool(!ok1, !ok2)
		}
		return cmpInt(use(s2)-request(p2, name), use(s1)-request(p1, name))
	}
}

// byPriority puts the lower priority first.
func byPriority(p1, p2 *v1.Pod) int { return cmpInt(priority(p1), priority(p2)) }

func priority(pod *v1.Pod) int64 {
	if pod.Spec.Priority == nil {
		return 0
	}
	return int64(*pod.Spec.Priority)
}

// cmpBool puts the true one first.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
