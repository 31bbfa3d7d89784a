// Package gc removes what nobody needs any more, as kubelet's container and image garbage
// collectors do, with the care an offline gateway needs.
//
// Every Period (1 minute by default) [GC.RunOnce] does two things.
//
// Containers: of each container of a live pod, exited attempts beyond the newest
// MaxDeadPerContainer (1, kubelet's default: the previous attempt is the lastState of a
// restarted container and what `kubectl logs --previous` reads) are removed with their log
// files; the latest attempt is never removed, whatever its state, because the pod worker
// decides from it. Exited containers of pods the agent no longer has, and then the pod's log
// directory, are removed only once every pod source has delivered its whole set: a pod that is
// merely not known yet is never treated as gone. Running containers are never touched here:
// stopping one is the pod worker's act, with a reason.
//
// Images: when the usage of the image file system (the file system of containerd's snapshotter
// root, or a configured path) reaches the high threshold (85%), images are removed, least
// recently used first, until their sizes add up to what brings usage down to the low threshold
// (80%) — kubelet's rule. Never removed: an image any container in holdfast's containerd
// namespace references (checked again right before each removal), an image a desired pod
// wants even if none of its containers exists yet (an offline gateway cannot pull it back),
// the pause image, the configured pinned images and the images preloaded from the firmware,
// and images used or pulled within ImageMinAge (2 minutes). Names sharing one digest are one
// image: they stay or go together. When an image was last used is kept in a label on the image
// (LabelLastUsed of agent/runtime/containerd, whose NewImages is the image store on containerd,
// rewritten at most hourly), so the order survives restarts.
//
// Which containers and images to remove are pure functions ([SelectContainers],
// [SelectPodLogDirs], [SelectImages], [BytesToFree]); [GC] only gathers their inputs through
// small interfaces ([Runtime], [Pods], [Images], [Filesystem]) and applies the result.
package gc
