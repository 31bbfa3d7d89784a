package gc

import (
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// ContainerPolicy says which exited containers are kept.
type ContainerPolicy struct {
	// MaxDeadPerContainer is how many exited attempts of one container of a live pod are kept,
	// newest first (kubelet's MaxPerPodContainer); at least 1.
	MaxDeadPerContainer int
	// MinAge: a container that exited less than MinAge ago is kept.
	MinAge time.Duration
}

// PodState answers, for SelectContainers, whether a pod exists.
type PodState struct {
	// Complete: every pod source has delivered its whole set. Until then a pod that Known does
	// not know may still exist, and nothing is removed for its absence.
	Complete bool
	// Known reports whether the agent has the pod (running, terminating, or finished but not
	// deleted).
	Known func(uid types.UID) bool
}

// SelectContainers returns the exited containers to remove, in a stable order:
//   - of a live pod, per container, the exited attempts beyond the newest
//     MaxDeadPerContainer, never the latest attempt (the pod worker decides from it);
//   - of a pod that no longer exists (only once pods.Complete), every exited container.
//
// Running and created containers are never selected: stopping one is the pod worker's act,
// with a reason. Containers younger than MinAge are kept.
func SelectContainers(cs []runtime.Container, pods PodState, policy ContainerPolicy, now time.Time) []runtime.Container {
	maxDead := max(policy.MaxDeadPerContainer, 1)
	type key struct {
		pod  string
		name string
	}
	groups := map[key][]runtime.Container{}
	var keys []key
	for _, c := range cs {
		if c.PodUID == "" {
			continue // not holdfast's
		}
		k := key{c.PodUID, c.Name}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], c)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].pod != keys[j].pod {
			return keys[i].pod < keys[j].pod
		}
		return keys[i].name < keys[j].name
	})
	var out []runtime.Container
	for _, k := range keys {
		attempts := groups[k]
		sort.Slice(attempts, func(i, j int) bool { return attempts[i].Attempt > attempts[j].Attempt })
		alive := pods.Known(types.UID(k.pod))
		if !alive && !pods.Complete {
			continue
		}
		kept := 0
		for i, c := range attempts {
			if c.State != runtime.StateExited {
				continue
			}
			if alive && (i == 0 || kept < maxDead) {
				kept++
				continue
			}
			if now.Sub(exitedAt(c)) < policy.MinAge {
				continue
			}
			out = append(out, c)
		}
	}
	return out
}

func exitedAt(c runtime.Container) time.Time {
	if !c.FinishedAt.IsZero() {
		return c.FinishedAt
	}
	return c.CreatedAt
}

// SelectPodLogDirs returns the pod log directories (NAMESPACE_NAME_UID) to remove: those of
// pods that no longer exist and have no container left. Nothing before pods.Complete.
func SelectPodLogDirs(dirs []string, cs []runtime.Container, pods PodState) []string {
	if !pods.Complete {
		return nil
	}
	hasContainers := map[string]bool{}
	for _, c := range cs {
		hasContainers[c.PodUID] = true
	}
	var out []string
	for _, d := range dirs {
		i := strings.LastIndexByte(d, '_')
		if i < 0 || strings.Count(d, "_") != 2 || i == len(d)-1 {
			continue // not a pod log directory
		}
		uid := d[i+1:]
		if hasContainers[uid] || pods.Known(types.UID(uid)) {
			continue
		}
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Image is one name of an image in containerd. Names with the same target digest are one
// image: removing one frees nothing while another remains, so they go (or stay) together.
type Image struct {
	Name   string
	Digest digest.Digest
	// Size is the disk space the image takes (content and unpacked snapshots), what removing
	// it is expected to free; set only for candidates.
	Size int64
	// Updated is when the name was last created or pointed anew (import, pull).
	Updated time.Time
	// LastUsed is when a container was last seen using the image; zero if never seen.
	LastUsed time.Time
}

// ImageSelection is the input of SelectImages.
type ImageSelection struct {
	Images []Image
	// InUse holds the names (normalized) and digests that containers use or desired pods want.
	InUse map[string]bool
	// Pinned holds names (normalized) never removed.
	Pinned map[string]bool
	// BytesToFree is how much to free; nothing is selected when it is not positive.
	BytesToFree int64
	// MinAge: an image used or updated less than MinAge ago is kept (it may have just been
	// pulled for a container about to be created).
	MinAge time.Duration
	Now    time.Time
}

// SelectImages returns the names to remove to free BytesToFree: images no container uses, no
// desired pod wants and no pin holds, least recently used first (last use, or arrival for
// images never seen used), until their sizes add up to BytesToFree.
func SelectImages(in ImageSelection) []Image {
	if in.BytesToFree <= 0 {
		return nil
	}
	type group struct {
		digest digest.Digest
		names  []Image
		last   time.Time
		size   int64
		keep   bool
	}
	byDigest := map[digest.Digest]*group{}
	var groups []*group
	for _, img := range in.Images {
		g := byDigest[img.Digest]
		if g == nil {
			g = &group{digest: img.Digest, keep: in.InUse[img.Digest.String()]}
			byDigest[img.Digest] = g
			groups = append(groups, g)
		}
		g.names = append(g.names, img)
		g.keep = g.keep || in.InUse[img.Name] || in.Pinned[img.Name]
		g.size = max(g.size, img.Size)
		for _, t := range []time.Time{img.LastUsed, img.Updated} {
			if t.After(g.last) {
				g.last = t
			}
		}
	}
	var candidates []*group
	for _, g := range groups {
		if !g.keep && in.Now.Sub(g.last) >= in.MinAge {
			candidates = append(candidates, g)
		}
	}
	sort.Slice(candidates, func(i, j int) bool {
		if !candidates[i].last.Equal(candidates[j].last) {
			return candidates[i].last.Before(candidates[j].last)
		}
		return candidates[i].digest < candidates[j].digest
	})
	var out []Image
	var freed int64
	for _, g := range candidates {
		if freed >= in.BytesToFree {
			break
		}
		sort.Slice(g.names, func(i, j int) bool { return g.names[i].Name < g.names[j].Name })
		out = append(out, g.names...)
		freed += g.size
	}
	return out
}

// BytesToFree is kubelet's rule: when the file system's usage (100 - available*100/capacity,
// in whole percent) is at or above high, free enough to bring it down to low. high 100 or more
// disables it.
func BytesToFree(capacity, available uint64, high, low int) int64 {
	if capacity == 0 || high >= 100 || available >= capacity {
		return 0
	}
	usage := 100 - int(available*100/capacity)
	if usage < high {
		return 0
	}
	used, usedAtLow := capacity-available, capacity*uint64(max(low, 0))/100
	if used <= usedAtLow {
		return 0
	}
	return int64(used - usedAtLow)
}
