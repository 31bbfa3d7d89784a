package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// Defaults of Config.
const (
	DefaultPeriod                    = time.Minute
	DefaultMaxDeadPerContainer       = 1
	DefaultImageHighThresholdPercent = 85
	DefaultImageLowThresholdPercent  = 80
	DefaultImageMinAge               = 2 * time.Minute
	// DefaultPauseImage is containerd 1.6's sandbox image, pinned whatever the configuration.
	DefaultPauseImage = "registry.k8s.io/pause:3.6"
)

// lastUsedResolution is how stale the last-used label of an image in use may get before it is
// written again: LRU order needs no finer clock, and flash wears out.
const lastUsedResolution = time.Hour

// Config tunes the collector.
type Config struct {
	// Period is how often both collections run. Defaults to 1m.
	Period time.Duration
	// MaxDeadPerContainer is how many exited attempts of one container of a live pod are kept
	// (kubelet keeps 1: the lastState and `logs --previous` of a restarted container).
	// Defaults to 1.
	MaxDeadPerContainer int
	// ContainerMinAge keeps containers that exited less than this ago. Defaults to 0.
	ContainerMinAge time.Duration
	// PodLogDir is the pod log root; directories of pods that are gone are removed. Empty
	// leaves logs alone.
	PodLogDir string

	// ImageHighThresholdPercent: image collection starts when the image file system's usage
	// reaches it. Defaults to 85; 100 disables image collection.
	ImageHighThresholdPercent int
	// ImageLowThresholdPercent: image collection frees down to it. Defaults to 80.
	ImageLowThresholdPercent int
	// ImageMinAge keeps images used or pulled less than this ago. Defaults to 2m.
	ImageMinAge time.Duration
	// PauseImage is pinned. Defaults to DefaultPauseImage.
	PauseImage string
	// PinnedImages are never removed: the operator's list plus the images preloaded from the
	// firmware's image directory (the agent adds those it imported at boot).
	PinnedImages []string

	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

func (c *Config) applyDefaults() error {
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.MaxDeadPerContainer == 0 {
		c.MaxDeadPerContainer = DefaultMaxDeadPerContainer
	}
	if c.ImageHighThresholdPercent == 0 {
		c.ImageHighThresholdPercent = DefaultImageHighThresholdPercent
	}
	if c.ImageLowThresholdPercent == 0 {
		c.ImageLowThresholdPercent = DefaultImageLowThresholdPercent
	}
	if c.ImageMinAge == 0 {
		c.ImageMinAge = DefaultImageMinAge
	}
	if c.PauseImage == "" {
		c.PauseImage = DefaultPauseImage
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	var errs []error
	if c.Period < 0 {
		errs = append(errs, fmt.Errorf("gc period %s is negative", c.Period))
	}
	if c.MaxDeadPerContainer < 1 {
		errs = append(errs, fmt.Errorf("maxDeadPerContainer %d: at least 1 (the pod worker decides from the latest attempt)", c.MaxDeadPerContainer))
	}
	if h, l := c.ImageHighThresholdPercent, c.ImageLowThresholdPercent; h < 0 || h > 100 || l < 0 || l > 100 || l >= h && h != 100 {
		errs = append(errs, fmt.Errorf("image thresholds high %d%% low %d%%: want 0 <= low < high <= 100", h, l))
	}
	return errors.Join(errs...)
}

// Runtime is what container collection needs of the runtime; *runtime.Runtime has it.
type Runtime interface {
	List(ctx context.Context) ([]runtime.Container, error)
	RemoveContainer(ctx context.Context, id string) error
}

// Pods is what the collector needs to know of the desired pods; *pods.Manager has it.
type Pods interface {
	// SourcesReady reports whether every pod source has delivered its whole set.
	SourcesReady() bool
	// Known reports whether the agent has the pod.
	Known(uid types.UID) bool
	// Images returns the images of every desired pod's containers, init containers included:
	// they are kept even while no container uses them (an offline gateway cannot pull them
	// again).
	Images() []string
}

// Images is the image store, containerd's in holdfast's namespace (see NewContainerdImages).
type Images interface {
	// List returns every image name, without Size.
	List(ctx context.Context) ([]Image, error)
	// Size returns what removing the image is expected to free.
	Size(ctx context.Context, name string) (int64, error)
	// ContainerImages returns the image names every container in the namespace references,
	// holdfast's or not.
	ContainerImages(ctx context.Context) ([]string, error)
	// Referenced reports whether a container references the image name now: asked again right
	// before each removal.
	Referenced(ctx context.Context, name string) (bool, error)
	// Remove removes one image name, if it still points to digest.
	Remove(ctx context.Context, name string, digest digest.Digest) error
	// SetLastUsed records when the image was last seen in use, where a restart finds it.
	SetLastUsed(ctx context.Context, name string, t time.Time) error
}

// Filesystem reports the image file system's size and free space in bytes.
type Filesystem interface {
	Usage(ctx context.Context) (capacity, available uint64, err error)
}

// GC removes what nobody needs any more: exited containers beyond what status and logs need,
// with their log files, containers and logs of pods that are gone, and, when the image file
// system fills up, the least recently used images no container or desired pod needs.
type GC struct {
	cfg    Config
	rt     Runtime
	images Images
	fs     Filesystem
	pods   Pods
	log    *slog.Logger
	pinned map[string]bool

	mu       sync.Mutex // protects lastUsed
	lastUsed map[digest.Digest]time.Time

	// runMu serializes collections: the periodic one and the eviction manager's Reclaim.
	runMu sync.Mutex
	short bool // the last image collection could not free enough; guarded by runMu
}

// New builds a collector; nothing runs until Run. images and fs may be nil: no image
// collection then.
func New(cfg Config, rt Runtime, images Images, fs Filesystem, pods Pods, log *slog.Logger) (*GC, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, err
	}
	pinned := map[string]bool{runtime.NormalizeImageRef(cfg.PauseImage): true}
	for _, p := range cfg.PinnedImages {
		pinned[runtime.NormalizeImageRef(p)] = true
	}
	return &GC{
		cfg: cfg, rt: rt, images: images, fs: fs, pods: pods, log: log,
		pinned: pinned, lastUsed: map[digest.Digest]time.Time{},
	}, nil
}

// Run collects every Period until ctx ends. Errors are logged and the next period tries again.
func (g *GC) Run(ctx context.Context) error {
	t := time.NewTicker(g.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := g.RunOnce(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("garbage collection", "err", err)
		}
	}
}

// RunOnce runs container collection, then image collection.
func (g *GC) RunOnce(ctx context.Context) error { return g.collect(ctx, false) }

// Reclaim frees what it can at once, for the eviction manager under disk pressure, before it
// evicts a pod (kubelet's node-level reclaim): exited containers beyond those kept, then
// every unused image that is not pinned or younger than imageMinAge, whatever the
// thresholds.
func (g *GC) Reclaim(ctx context.Context) error { return g.collect(ctx, true) }

func (g *GC) collect(ctx context.Context, all bool) error {
	g.runMu.Lock()
	defer g.runMu.Unlock()
	cs, err := g.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	cerr := g.collectContainers(ctx, cs)
	var ierr error
	if g.images != nil && g.fs != nil {
		ierr = g.collectImages(ctx, all)
	}
	return errors.Join(cerr, ierr)
}

func (g *GC) podState() PodState {
	return PodState{Complete: g.pods.SourcesReady(), Known: g.pods.Known}
}

func (g *GC) collectContainers(ctx context.Context, cs []runtime.Container) error {
	pods := g.podState()
	policy := ContainerPolicy{MaxDeadPerContainer: g.cfg.MaxDeadPerContainer, MinAge: g.cfg.ContainerMinAge}
	var errs []error
	removed := map[string]bool{}
	for _, c := range SelectContainers(cs, pods, policy, g.cfg.Now()) {
		if err := g.rt.RemoveContainer(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove container %s of pod %s/%s: %w", c.Name, c.PodNamespace, c.PodName, err))
			continue
		}
		removed[c.ID] = true
		if c.LogPath != "" {
			if err := logs.RemoveContainerLogs(c.LogPath); err != nil {
				errs = append(errs, fmt.Errorf("remove logs of container %s of pod %s/%s: %w", c.Name, c.PodNamespace, c.PodName, err))
			}
		}
		g.log.Info("removed exited container", "pod", c.PodNamespace+"/"+c.PodName, "uid", c.PodUID,
			"container", c.Name, "attempt", c.Attempt, "id", c.ID)
	}
	if g.cfg.PodLogDir == "" || !pods.Complete {
		return errors.Join(errs...)
	}
	var left []runtime.Container
	for _, c := range cs {
		if !removed[c.ID] {
			left = append(left, c)
		}
	}
	entries, err := fsutil.ReadDirNoAtime(g.cfg.PodLogDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(append(errs, fmt.Errorf("read pod log dir: %w", err))...)
	}
	var dirs []string
	for _, e := range entries {
		dirs = append(dirs, e.Name())
	}
	for _, d := range SelectPodLogDirs(dirs, left, pods) {
		// RemoveAll removes a symlink, never what it points to.
		if err := os.RemoveAll(filepath.Join(g.cfg.PodLogDir, d)); err != nil {
			errs = append(errs, fmt.Errorf("remove logs of a deleted pod: %w", err))
			continue
		}
		g.log.Info("removed logs of a deleted pod", "dir", d)
	}
	return errors.Join(errs...)
}

// collectImages frees image space down to the low threshold once the high one is passed;
// all: every unused image it may remove, whatever the thresholds.
func (g *GC) collectImages(ctx context.Context, all bool) error {
	if !g.pods.SourcesReady() {
		return nil // which images desired pods want is not known yet
	}
	now := g.cfg.Now()
	inUse, err := g.inUse(ctx)
	if err != nil {
		return err
	}
	imgs, err := g.images.List(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	g.recordUse(ctx, imgs, inUse, now)

	capacity, available, err := g.fs.Usage(ctx)
	if err != nil {
		return fmt.Errorf("image file system usage: %w", err)
	}
	want := BytesToFree(capacity, available, g.cfg.ImageHighThresholdPercent, g.cfg.ImageLowThresholdPercent)
	if all {
		want = math.MaxInt64
	}
	if want <= 0 {
		g.short = false
		return nil
	}
	usage := 100 - int(available*100/max(capacity, 1))
	g.log.Debug("image file system above its high threshold; looking for unused images",
		"usagePercent", usage, "highPercent", g.cfg.ImageHighThresholdPercent, "lowPercent", g.cfg.ImageLowThresholdPercent, "bytesToFree", want)

	var errs []error
	for i := range imgs {
		imgs[i].LastUsed = g.lastUse(imgs[i])
		if inUse[imgs[i].Name] || inUse[imgs[i].Digest.String()] || g.pinned[imgs[i].Name] {
			continue // never a candidate: no need to measure it
		}
		size, err := g.images.Size(ctx, imgs[i].Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("size of image %s: %w", imgs[i].Name, err))
			size = 0
		}
		imgs[i].Size = size
	}
	selected := SelectImages(ImageSelection{
		Images: imgs, InUse: inUse, Pinned: g.pinned,
		BytesToFree: want, MinAge: g.cfg.ImageMinAge, Now: now,
	})
	var freed int64
	counted := map[digest.Digest]bool{}
	for _, img := range selected {
		// A pod may have been given this image since the list: ask again, right before.
		if wanted := g.wanted(); wanted[img.Name] {
			continue
		}
		if used, err := g.images.Referenced(ctx, img.Name); err != nil || used {
			if err != nil {
				errs = append(errs, fmt.Errorf("check use of image %s: %w", img.Name, err))
			}
			continue
		}
		if err := g.images.Remove(ctx, img.Name, img.Digest); err != nil {
			errs = append(errs, fmt.Errorf("remove image %s: %w", img.Name, err))
			continue
		}
		if !counted[img.Digest] {
			counted[img.Digest] = true
			freed += img.Size
		}
		g.log.Info("removed unused image", "image", img.Name, "digest", img.Digest, "size", img.Size, "lastUsed", lastUsedAttr(img.LastUsed))
	}
	// Said once per episode, not every period of a disk that stays full of images in use.
	if all {
		g.log.Info("node-level reclaim of images", "freed", freed)
		return errors.Join(errs...)
	}
	if freed < want && (!g.short || freed > 0) {
		g.log.Warn("image collection could not free enough: the rest is in use, pinned or too recent",
			"usagePercent", usage, "highPercent", g.cfg.ImageHighThresholdPercent, "lowPercent", g.cfg.ImageLowThresholdPercent,
			"freed", freed, "bytesToFree", want)
	}
	g.short = freed < want
	return errors.Join(errs...)
}

// inUse returns the names (normalized) and digests that containers use or desired pods want.
func (g *GC) inUse(ctx context.Context) (map[string]bool, error) {
	names, err := g.images.ContainerImages(ctx)
	if err != nil {
		return nil, fmt.Errorf("images of containers: %w", err)
	}
	inUse := g.wanted()
	for _, n := range names {
		inUse[n] = true
		inUse[runtime.NormalizeImageRef(n)] = true
	}
	return inUse, nil
}

// wanted returns the images desired pods want, normalized.
func (g *GC) wanted() map[string]bool {
	m := map[string]bool{}
	for _, n := range g.pods.Images() {
		m[runtime.NormalizeImageRef(n)] = true
	}
	return m
}

// recordUse notes the images in use now, and persists it on the image where it is stale.
func (g *GC) recordUse(ctx context.Context, imgs []Image, inUse map[string]bool, now time.Time) {
	used := map[digest.Digest]bool{}
	for _, img := range imgs {
		if inUse[img.Name] || inUse[img.Digest.String()] {
			used[img.Digest] = true
		}
	}
	g.mu.Lock()
	present := map[digest.Digest]time.Time{}
	for _, img := range imgs {
		present[img.Digest] = g.lastUsed[img.Digest] // forget images that are gone
	}
	for d := range used {
		present[d] = now
	}
	g.lastUsed = present
	g.mu.Unlock()
	for _, img := range imgs {
		if !used[img.Digest] || now.Sub(img.LastUsed) < lastUsedResolution {
			continue
		}
		if err := g.images.SetLastUsed(ctx, img.Name, now); err != nil {
			g.log.Debug("record image last use", "image", img.Name, "err", err)
		}
	}
}

func (g *GC) lastUse(img Image) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := g.lastUsed[img.Digest]; t.After(img.LastUsed) {
		return t
	}
	return img.LastUsed
}

func lastUsedAttr(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}
