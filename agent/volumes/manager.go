package volumes

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/internal/expansion"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Directory names of the volume kinds under a pod's volumes directory, as kubelet names them.
const (
	dirEmptyDir    = "kubernetes.io~empty-dir"
	dirConfigMap   = "kubernetes.io~configmap"
	dirSecret      = "kubernetes.io~secret"
	dirDownwardAPI = "kubernetes.io~downward-api"
	dirProjected   = "kubernetes.io~projected"
)

// DefaultResyncPeriod is how often content volumes are re-projected when Options does not say.
const DefaultResyncPeriod = 30 * time.Second

// eventInterval is the least time between two identical events about one volume: a pod that
// retries every few seconds must not flood the apiserver (or a metered uplink) with them.
const eventInterval = time.Minute

// Options tunes a Manager.
type Options struct {
	// ResyncPeriod is how often every content volume is re-projected: downward API changes,
	// service account token renewals, and a safety net for watch events. ConfigMap and Secret
	// changes arrive through their watches within about a second. Defaults to
	// DefaultResyncPeriod (30s).
	ResyncPeriod time.Duration
	// Allocatable returns the node's allocatable resources: the limits resourceFieldRef reports
	// for a container without its own, and the size of tmpfs volumes of pods without memory
	// limits. Defaults to none: such limits read as 0 and such tmpfs get the kernel's default
	// size (half the RAM).
	Allocatable func() v1.ResourceList
	// Cache keeps the ConfigMaps pods reference across restarts (offline.Store does), so that
	// a gateway that boots while the apiserver is out of reach can still project them and
	// resolve env from them. Defaults to none: only what is already on disk survives.
	Cache Cache
	// PersistSecrets also keeps Secrets and service account tokens in the Cache, which must
	// encrypt them (the agent sets it when the state store has a state key). Off by default:
	// Secrets and tokens then never touch the disk (volumes are on tmpfs, the cache is in
	// memory), at the price that a pod needing one cannot start after a reboot until the
	// apiserver answers.
	PersistSecrets bool
	// APIDown reports whether the node's own heartbeat found the apiserver out of reach on its
	// latest try (node.Reachability.Down). A lookup that has a kept copy to fall back on then
	// does not wait on the apiserver, as when one of the manager's own requests found it so:
	// in an offline boot the heartbeat fails first, and the first pods' lookups would each
	// wait keptCopyWait. Defaults to never.
	APIDown func() bool
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// PlainDirs puts what goes on tmpfs (Secrets, tokens, downward API, emptyDir of medium
	// Memory) in plain directories of the node's disk, mounting nothing. Hollow nodes only
	// (agent/runtime/hollow), so that a hundred of them on one machine leave its mount table alone,
	// as kubemark's fake mounter does; never on a gateway, whose secrets must not touch the
	// disk.
	PlainDirs bool
}

// Manager prepares, refreshes and removes the volumes of the pods on this node. It is also the
// node-scoped source of ConfigMaps and Secrets for env (see ConfigMap, Secret, Allocatable).
type Manager struct {
	podsDir  string
	client   kube.Interface       // nil when standalone
	recorder record.EventRecorder // may be nil
	log      *slog.Logger
	opts     Options
	pokeCh   chan struct{} // buffered(1): resync now (an object changed)

	// mu protects pods, watches, tokens, unreachable, runCtx, lastEvent and podState.pod/refs.
	mu          sync.Mutex
	pods        map[types.UID]*podState
	watches     map[objectKey]*objectWatch
	tokens      map[tokenKey]cachedToken
	unreachable map[any]failure // last unreachable-apiserver failure per objectKey / tokenKey
	// apiDown is the last request of any key that found the apiserver unreachable, cleared by
	// the next that reached it: a lookup with a kept copy does not ask while it is recent.
	apiDown   failure
	runCtx    context.Context // set while Run runs; watches run under it
	lastEvent map[string]eventRecord
	wg        sync.WaitGroup // the watch goroutines
}

// podState is what the manager keeps about a pod between Setup and Teardown.
type podState struct {
	// mu serializes the file-system work on the pod's volumes: Setup, resync and Teardown.
	mu   sync.Mutex
	gone bool // torn down; guarded by mu
	// projections are what the pod's content volumes held after the last write or check, by
	// directory; guarded by mu.
	projections map[string]*projection

	// Guarded by Manager.mu.
	pod  *v1.Pod
	refs map[objectKey]bool
}

type eventRecord struct {
	message string
	at      time.Time
}

// NewManager builds a manager for the pods under podsDir (StateDir/pods). client is the
// node's client, nil when standalone; recorder may be nil. Nothing is watched until Run.
func NewManager(podsDir string, client kube.Interface, recorder record.EventRecorder, log *slog.Logger, opts Options) *Manager {
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = DefaultResyncPeriod
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return &Manager{
		podsDir: podsDir, client: client, recorder: recorder, log: log, opts: opts,
		pokeCh:      make(chan struct{}, 1),
		pods:        map[types.UID]*podState{},
		watches:     map[objectKey]*objectWatch{},
		tokens:      map[tokenKey]cachedToken{},
		unreachable: map[any]failure{},
		lastEvent:   map[string]eventRecord{},
	}
}

// PodVolumes are a pod's volumes as Setup prepared them, ready to be mounted into containers.
type PodVolumes struct {
	m       *Manager
	podUID  types.UID
	volumes map[string]volume
}

// volume is one prepared volume.
type volume struct {
	hostPath   string
	readOnly   bool // content volumes are read-only in every container, as in kubelet
	isHostPath bool
}

// Setup prepares every volume of pod on the host, idempotently: a second call (the next sync,
// or the first after an agent restart) finds what is there, refreshes content, and mounts
// nothing twice. A volume that cannot be prepared records a FailedMount event and makes Setup
// fail, naming it; the pod's containers must then not start (kubelet keeps them in
// ContainerCreating). A content volume that was written before and cannot be refreshed keeps
// its content (see the package documentation).
func (m *Manager) Setup(ctx context.Context, pod *v1.Pod) (*PodVolumes, error) {
	ps := m.register(pod)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.gone {
		return nil, fmt.Errorf("volumes of pod %s/%s are being torn down", pod.Namespace, pod.Name)
	}
	pv := &PodVolumes{m: m, podUID: pod.UID, volumes: map[string]volume{}}
	var errs []error
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		v, err := m.setupVolume(ctx, ps, pod, vol)
		if err != nil {
			err = fmt.Errorf("MountVolume.SetUp failed for volume %q : %w", vol.Name, err)
			m.eventOnce(pod, vol.Name, v1.EventTypeWarning, "FailedMount", err.Error())
			errs = append(errs, err)
			continue
		}
		pv.volumes[vol.Name] = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return pv, nil
}

// register records pod (its latest spec) and the objects it references, watching them.
func (m *Manager) register(pod *v1.Pod) *podState {
	refs := m.references(pod)
	m.mu.Lock()
	defer m.mu.Unlock()
	ps, ok := m.pods[pod.UID]
	if !ok {
		ps = &podState{}
		m.pods[pod.UID] = ps
	}
	ps.pod = pod
	if !reflect.DeepEqual(ps.refs, refs) {
		ps.refs = refs
		m.syncWatchesLocked()
	}
	return ps
}

func (m *Manager) podDir(uid types.UID) string { return filepath.Join(m.podsDir, string(uid)) }

func (m *Manager) volumeDir(uid types.UID, kind, name string) string {
	return filepath.Join(m.podDir(uid), "volumes", kind, name)
}

// setupVolume prepares one volume; the caller holds ps.mu.
func (m *Manager) setupVolume(ctx context.Context, ps *podState, pod *v1.Pod, vol *v1.Volume) (volume, error) {
	switch {
	case vol.EmptyDir != nil:
		dir := m.volumeDir(pod.UID, dirEmptyDir, vol.Name)
		_, err := os.Lstat(dir)
		made := errors.Is(err, fs.ErrNotExist)
		switch vol.EmptyDir.Medium {
		case v1.StorageMediumDefault:
			// World-writable, as kubelet makes it: the containers may run as any user. With
			// fsGroup, setgid too (applyFSGroup), which this must not take away.
			mode := os.FileMode(0o777)
			if fsGroupOf(pod) != nil {
				mode |= os.ModeSetgid
			}
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return volume{}, err
			}
			if err := os.Chmod(dir, mode); err != nil {
				return volume{}, err
			}
		case v1.StorageMediumMemory:
			// kubelet mounts it with no mode: a tmpfs root's default, world-writable and sticky.
			made = made || (!m.opts.PlainDirs && !isTmpfs(dir))
			if err := m.ensureTmpfs(dir, tmpfsSize(pod, vol.EmptyDir.SizeLimit, m.Allocatable()), os.ModeSticky|0o777); err != nil {
				return volume{}, err
			}
		default:
			return volume{}, fmt.Errorf("emptyDir medium %q is not supported by holdfast", vol.EmptyDir.Medium)
		}
		if gid := fsGroupOf(pod); gid != nil {
			if err := applyFSGroupOnce(dir, *gid, made); err != nil {
				return volume{}, err
			}
		}
		return volume{hostPath: dir}, nil
	case vol.HostPath != nil:
		if err := checkHostPath(vol.HostPath.Path, vol.HostPath.Type); err != nil {
			return volume{}, err
		}
		return volume{hostPath: vol.HostPath.Path, isHostPath: true}, nil
	case isContent(vol):
		return m.setupContent(ctx, ps, pod, vol)
	}
	return volume{}, fmt.Errorf("%s volumes are not supported by holdfast", volumeType(vol))
}

func isContent(vol *v1.Volume) bool {
	return vol.ConfigMap != nil || vol.Secret != nil || vol.DownwardAPI != nil || vol.Projected != nil
}

// contentDir is where a content volume lives and whether it is memory-backed: everything but
// configMaps, as in kubelet (secrets and tokens must never reach the disk).
func contentDir(vol *v1.Volume) (kind string, onTmpfs bool) {
	switch {
	case vol.ConfigMap != nil:
		return dirConfigMap, false
	case vol.Secret != nil:
		return dirSecret, true
	case vol.DownwardAPI != nil:
		return dirDownwardAPI, true
	default:
		return dirProjected, true
	}
}

// volumeType names the source a volume uses, as its JSON field is spelt ("persistentVolumeClaim").
func volumeType(vol *v1.Volume) string {
	v := reflect.ValueOf(vol.VolumeSource)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			return strings.Split(v.Type().Field(i).Tag.Get("json"), ",")[0]
		}
	}
	return "empty"
}

// ensureTmpfs mounts a tmpfs on dir (see the function), or with PlainDirs makes dir a plain
// directory with mode.
func (m *Manager) ensureTmpfs(dir string, sizeBytes int64, mode os.FileMode) error {
	if !m.opts.PlainDirs {
		return ensureTmpfs(dir, sizeBytes, mode)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

func (m *Manager) setupContent(ctx context.Context, ps *podState, pod *v1.Pod, vol *v1.Volume) (volume, error) {
	kind, onTmpfs := contentDir(vol)
	dir := m.volumeDir(pod.UID, kind, vol.Name)
	if onTmpfs {
		if err := m.ensureTmpfs(dir, tmpfsSize(pod, nil, m.Allocatable()), 0o755); err != nil {
			return volume{}, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return volume{}, err
	}
	v := volume{hostPath: dir, readOnly: true}
	if err := m.writeContent(ctx, ps, pod, vol, dir); err != nil {
		if !hasData(dir) {
			return volume{}, err
		}
		m.keptContent(pod, vol.Name, err)
	}
	return v, nil
}

// keptContent reports a refresh that failed on a volume that keeps its previous content.
func (m *Manager) keptContent(pod *v1.Pod, volName string, err error) {
	m.log.Warn("refresh volume content; keeping what it has", "pod", pod.Namespace+"/"+pod.Name, "volume", volName, "err", err)
	m.eventOnce(pod, volName, v1.EventTypeWarning, "FailedMount",
		fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v (the volume keeps its previous content)", volName, err))
}

// writeContent brings the content volume at dir up to date; the caller holds ps.mu.
func (m *Manager) writeContent(ctx context.Context, ps *podState, pod *v1.Pod, vol *v1.Volume, dir string) error {
	payload, err := m.contentPayload(ctx, pod, vol)
	if err != nil {
		return err
	}
	gid := fsGroupOf(pod)
	if gid != nil {
		// The modes fsGroup gives, in the payload itself, so that an unchanged payload still
		// compares equal to what is on disk.
		for p, f := range payload {
			f.mode |= fsGroupRO
			payload[p] = f
		}
	}
	// What the last write or check left, still there untouched: nothing to read (see
	// projection).
	digest := payloadDigest(payload)
	if ps.projections[dir].unchanged(dir, digest) {
		return nil
	}
	delete(ps.projections, dir)
	ts, changed, err := writeAtomic(dir, payload)
	if changed {
		m.log.Debug("volume content written", "pod", pod.Namespace+"/"+pod.Name, "volume", vol.Name, "files", len(payload))
	}
	if err == nil && gid != nil {
		err = applyFSGroup(dir, *gid, true)
	}
	if err != nil {
		return err
	}
	pr, err := recordProjection(dir, ts, payload, digest)
	if err != nil {
		// The volume is right; the next resync checks its files again.
		m.log.Debug("record volume content", "pod", pod.Namespace+"/"+pod.Name, "volume", vol.Name, "err", err)
		return nil
	}
	if ps.projections == nil {
		ps.projections = map[string]*projection{}
	}
	ps.projections[dir] = pr
	return nil
}

// Mounts returns the OCI mounts of container c: one bind mount per volumeMount, read-only when
// the mount or the volume says so, sorted so that a parent directory is mounted before what is
// mounted inside it. subPath and subPathExpr (expanded with env, the container's variables) are
// bind-mounted safely first (see bindSubPath); a subPath that resolves outside its volume is an
// error. mountPropagation is ignored: every mount is rprivate.
func (pv *PodVolumes) Mounts(c *v1.Container, env map[string]string) ([]specs.Mount, error) {
	if pv == nil {
		if len(c.VolumeMounts) > 0 {
			return nil, fmt.Errorf("container %q: the pod's volumes are not set up", c.Name)
		}
		return nil, nil
	}
	out := make([]specs.Mount, 0, len(c.VolumeMounts))
	for i, vm := range c.VolumeMounts {
		v, ok := pv.volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("container %q: volumeMount %q names no volume of the pod", c.Name, vm.Name)
		}
		src := v.hostPath
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expansion.Expand(vm.SubPathExpr, env)
		}
		if sub != "" {
			target := filepath.Join(pv.m.podDir(pv.podUID), "volume-subpaths", vm.Name, c.Name, strconv.Itoa(i))
			if err := bindSubPath(src, sub, target); err != nil {
				return nil, fmt.Errorf("failed to prepare subPath for volumeMount %q of container %q: %w", vm.Name, c.Name, err)
			}
			src = target
		} else if v.isHostPath {
			// The runtime mounts what the path resolves to now, as containerd's CRI plugin does.
			if resolved, err := filepath.EvalSymlinks(src); err == nil {
				src = resolved
			}
		}
		mode := "rw"
		if vm.ReadOnly || v.readOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", mode}})
	}
	sort.SliceStable(out, func(i, j int) bool { return depth(out[i].Destination) < depth(out[j].Destination) })
	return out, nil
}

func depth(p string) int {
	return strings.Count(filepath.Clean("/"+p), "/")
}

// Teardown unmounts and removes every volume of the pod. Only pod.UID is needed, so that the
// volumes of a pod deleted while the agent was down (an orphan) are removed too. It must run
// after the pod's containers are gone, and before anything removes the pod's directory: it
// leaves nothing mounted there, and never deletes through a mount (a hostPath under a subPath
// mount stays untouched).
func (m *Manager) Teardown(ctx context.Context, pod *v1.Pod) error {
	m.mu.Lock()
	ps := m.pods[pod.UID]
	delete(m.pods, pod.UID)
	for k := range m.tokens {
		if k.uid == pod.UID {
			delete(m.tokens, k)
		}
	}
	for k := range m.unreachable {
		if tk, ok := k.(tokenKey); ok && tk.uid == pod.UID {
			delete(m.unreachable, k)
		}
	}
	for k := range m.lastEvent {
		if strings.HasPrefix(k, string(pod.UID)+"/") {
			delete(m.lastEvent, k)
		}
	}
	m.syncWatchesLocked()
	m.mu.Unlock()
	if ps != nil {
		ps.mu.Lock()
		ps.gone = true
		defer ps.mu.Unlock()
	}
	dir := m.podDir(pod.UID)
	if err := unmountUnder(dir); err != nil {
		return fmt.Errorf("unmount volumes of pod %s: %w", pod.UID, err)
	}
	for _, sub := range []string{"volumes", "volume-subpaths"} {
		if err := removeAllOneFS(filepath.Join(dir, sub)); err != nil {
			return fmt.Errorf("remove volumes of pod %s: %w", pod.UID, err)
		}
	}
	return nil
}

// Known returns the UIDs of the pods that have a directory under the pods directory. After an
// agent restart, those no source claims are orphans to tear down.
func (m *Manager) Known() []string {
	entries, err := fsutil.ReadDirNoAtime(m.podsDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("list pod directories", "dir", m.podsDir, "err", err)
		}
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// Run follows the referenced ConfigMaps and Secrets and re-projects every content volume each
// ResyncPeriod and whenever one of them changes, until ctx ends; it returns once every watch it
// started has stopped.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.runCtx = ctx
	m.syncWatchesLocked()
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		for k, w := range m.watches {
			w.cancel()
			delete(m.watches, k)
		}
		m.runCtx = nil
		m.mu.Unlock()
		m.wg.Wait()
	}()
	ticker := time.NewTicker(m.opts.ResyncPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-m.pokeCh:
		}
		m.resync(ctx)
	}
}

func (m *Manager) poke() {
	select {
	case m.pokeCh <- struct{}{}:
	default:
	}
}

// resync re-projects the content volumes of every pod, and measures emptyDirs with a sizeLimit.
func (m *Manager) resync(ctx context.Context) {
	m.mu.Lock()
	states := make([]*podState, 0, len(m.pods))
	for _, ps := range m.pods {
		states = append(states, ps)
	}
	m.mu.Unlock()
	for _, ps := range states {
		if ctx.Err() != nil {
			return
		}
		m.resyncPod(ctx, ps)
	}
}

func (m *Manager) resyncPod(ctx context.Context, ps *podState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.gone {
		return
	}
	m.mu.Lock()
	pod := ps.pod
	m.mu.Unlock()
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		switch {
		case isContent(vol):
			kind, onTmpfs := contentDir(vol)
			dir := m.volumeDir(pod.UID, kind, vol.Name)
			// Only volumes Setup prepared; never write a secret where its tmpfs is missing.
			if !hasData(dir) || (onTmpfs && !m.opts.PlainDirs && !isTmpfs(dir)) {
				continue
			}
			if err := m.writeContent(ctx, ps, pod, vol, dir); err != nil {
				m.keptContent(pod, vol.Name, err)
			}
		case vol.EmptyDir != nil && vol.EmptyDir.Medium == v1.StorageMediumDefault && vol.EmptyDir.SizeLimit != nil:
			dir := m.volumeDir(pod.UID, dirEmptyDir, vol.Name)
			used, err := diskUsage(dir)
			if err != nil {
				continue
			}
			if limit := vol.EmptyDir.SizeLimit; used > limit.Value() {
				m.eventOnce(pod, vol.Name, v1.EventTypeWarning, "EmptyDirSizeLimitExceeded",
					fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q (holdfast does not evict the pod).", vol.Name, limit.String()))
			}
		}
	}
}

// diskUsage is the space the files under dir occupy, not crossing into other file systems.
func diskUsage(dir string) (int64, error) {
	var root fs.FileInfo
	var total int64
	err := fsutil.WalkDirNoAtime(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished meanwhile: the container is writing
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if root == nil {
			root = fi
		} else if d.IsDir() && !sameDevice(root, fi) {
			return filepath.SkipDir
		}
		total += allocatedBytes(fi)
		return nil
	})
	return total, err
}

// eventOnce records an event about one volume of pod unless the same one was recorded less
// than eventInterval ago.
func (m *Manager) eventOnce(pod *v1.Pod, volName, eventType, reason, message string) {
	if m.recorder == nil || pod.Name == "" {
		return
	}
	key := string(pod.UID) + "/" + volName + "/" + reason
	now := m.opts.Now()
	m.mu.Lock()
	last, seen := m.lastEvent[key]
	due := !seen || last.message != message || now.Sub(last.at) >= eventInterval
	if due {
		m.lastEvent[key] = eventRecord{message: message, at: now}
	}
	m.mu.Unlock()
	if due {
		m.recorder.Event(pod, eventType, reason, message)
	}
}
