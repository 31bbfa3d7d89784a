// Package volumes prepares a pod's volumes on the node, keeps their content current, and tears
// them down: what kubelet's volume manager does for the volume types a gateway workload uses.
//
// # Layout
//
// Every volume lives under the pod's directory, named as kubelet names it, so an operator who
// knows kubelet finds them:
//
//	PODSDIR/UID/volumes/kubernetes.io~empty-dir/NAME     emptyDir (disk; tmpfs for medium Memory)
//	PODSDIR/UID/volumes/kubernetes.io~configmap/NAME     configMap (disk)
//	PODSDIR/UID/volumes/kubernetes.io~secret/NAME        secret (tmpfs)
//	PODSDIR/UID/volumes/kubernetes.io~downward-api/NAME  downwardAPI (tmpfs)
//	PODSDIR/UID/volumes/kubernetes.io~projected/NAME     projected (tmpfs)
//	PODSDIR/UID/volume-subpaths/NAME/CONTAINER/INDEX     subPath bind mounts (see Mounts)
//
// hostPath volumes have nothing under the pod: the host path itself is bind-mounted.
//
// # Content volumes
//
// configMap, secret, downwardAPI and projected volumes are written the way kubelet's
// AtomicWriter writes them: the files live in a timestamped directory, the names a container
// sees are symlinks through ..data, and an update swaps the ..data symlink with one rename, so a
// reader sees the old set of files or the new one, never a mix. Unchanged content is not
// rewritten (flash wears out); files are fsynced before the swap, so a power cut leaves the old
// set or the new one. Secrets, tokens and downward API data are on tmpfs and never touch the
// disk; configMaps are on disk, so that a gateway rebooted while offline still has them.
//
// ConfigMaps and Secrets are fetched with the node's own identity: the Node authorizer and
// NodeRestriction let a node read exactly the objects its pods reference. Each referenced object
// is followed by a watch of that one object (kubelet's default "Watch" change detection), shared
// by every pod and by env resolution (the Manager is the pods package's EnvSource), so an update
// reaches the files within about a second, and only changes cross the network, which matters on
// a metered uplink. Run also re-projects every content volume each resync period, which catches
// downward API changes and renews service account tokens at 80% of their lifetime.
//
// Holding fast: once a content volume has been written, failing to refresh it (the apiserver
// is unreachable, the object was deleted) keeps the content it has and records a FailedMount
// event; only a volume that was never written keeps its pod from starting. After an agent
// restart with no apiserver, volumes already on disk count as written. With a Cache (the
// agent's offline store), every ConfigMap read is kept, and served when the apiserver cannot be
// reached, so a gateway rebooted offline still projects them and resolves env from them.
// Secrets are kept there only with Options.PersistSecrets: by default they never touch the disk,
// and a pod that needs one waits for the apiserver after a reboot. A request that found the
// apiserver unreachable is not repeated for 30 s, so pod syncs do not stall offline.
//
// # Differences from kubelet, on purpose or not yet
//
//   - emptyDir sizeLimit is enforced for medium Memory (it is the tmpfs size). On disk it is
//     measured each resync and exceeding it records a Warning event (EmptyDirSizeLimitExceeded);
//     the pod is not evicted: a gateway's workload is better kept running than killed for disk
//     usage the operator can see.
//   - The size of tmpfs volumes without a sizeLimit is the pod's memory limit when every
//     container has one, else the node's allocatable memory (kubelet's SizeMemoryBackedVolumes).
//   - mountPropagation is ignored: every mount is rprivate. HostToContainer and Bidirectional
//     need a shared host mount tree that gateway images rarely have.
//   - fsGroup is applied as kubelet applies it (group ownership, group bits, setgid
//     directories; service account tokens 0640) to the volumes holdfast creates; since every
//     one of them is created by holdfast, empty or with content it writes, fsGroupChangePolicy
//     Always and OnRootMismatch give the same result. fsUser and SELinux relabelling are not
//     applied: files are owned by root.
//   - Volume types other than emptyDir, hostPath, configMap, secret, downwardAPI and projected
//     (configMap, secret, downwardAPI, serviceAccountToken sources) are refused with an error
//     naming the volume; clusterTrustBundle and podCertificate projections too.
//   - Static pods may use emptyDir, hostPath and downwardAPI volumes only, as NodeRestriction
//     requires of the mirror pods that represent them.
//   - A content volume mounted with subPath is a snapshot taken when the container starts, as
//     in kubelet: later updates do not reach it.
package volumes
