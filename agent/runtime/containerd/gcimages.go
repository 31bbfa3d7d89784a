package containerd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// LabelLastUsed is the image label holding when a container was last seen using it (RFC
// 3339), so that least-recently-used order survives agent restarts and reboots.
const LabelLastUsed = "io.holdfast.image.last-used"

// containerdImages is gc.Images on a containerd namespace.
type containerdImages struct {
	client    *client.Client
	namespace string
}

// NewImages returns the image store of one containerd namespace, as image collection sees it
// (gc.Images): the containerd backend's, and the CRI backend's on containerd's CRI plugin.
func NewImages(c *client.Client, namespace string) gc.Images {
	return &containerdImages{client: c, namespace: namespace}
}

func (ci *containerdImages) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, ci.namespace)
}

func (ci *containerdImages) List(ctx context.Context) ([]gc.Image, error) {
	recs, err := ci.client.ImageService().List(ci.ctx(ctx))
	if err != nil {
		return nil, err
	}
	out := make([]gc.Image, 0, len(recs))
	for _, r := range recs {
		img := gc.Image{Name: r.Name, Digest: r.Target.Digest, Updated: r.UpdatedAt}
		if t, err := time.Parse(time.RFC3339, r.Labels[LabelLastUsed]); err == nil {
			img.LastUsed = t
		}
		out = append(out, img)
	}
	return out, nil
}

func (ci *containerdImages) Size(ctx context.Context, name string) (int64, error) {
	ctx = ci.ctx(ctx)
	rec, err := ci.client.ImageService().Get(ctx, name)
	if err != nil {
		return 0, err
	}
	return client.NewImage(ci.client, rec).Usage(ctx, client.WithSnapshotUsage())
}

func (ci *containerdImages) ContainerImages(ctx context.Context) ([]string, error) {
	recs, err := ci.client.ContainerService().List(ci.ctx(ctx))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, r := range recs {
		if r.Image != "" {
			names = append(names, r.Image)
		}
	}
	return names, nil
}

func (ci *containerdImages) Referenced(ctx context.Context, name string) (bool, error) {
	recs, err := ci.client.ContainerService().List(ci.ctx(ctx), "image=="+strconv.Quote(name))
	if err != nil {
		return false, err
	}
	return len(recs) > 0, nil
}

// Remove deletes the name synchronously: containerd's own collector frees the content and
// snapshots no other image or container references before it returns, so the next usage
// reading sees the space.
func (ci *containerdImages) Remove(ctx context.Context, name string, d digest.Digest) error {
	err := ci.client.ImageService().Delete(ci.ctx(ctx), name,
		images.DeleteTarget(&ocispec.Descriptor{Digest: d}), images.SynchronousDelete())
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

func (ci *containerdImages) SetLastUsed(ctx context.Context, name string, t time.Time) error {
	_, err := ci.client.ImageService().Update(ci.ctx(ctx),
		images.Image{Name: name, Labels: map[string]string{LabelLastUsed: t.UTC().Format(time.RFC3339)}},
		"labels."+LabelLastUsed)
	return err
}

// imageFS is the file system of containerd's snapshotter root.
type imageFS struct {
	client *client.Client
	path   string // set, or found once

	mu    sync.Mutex // protects found
	found string
}

// NewImageFilesystem returns the image file system: the one holding path, or when path is
// empty, the one holding the root of containerd's default snapshotter (overlayfs on Linux), as
// containerd reports it. That is where unpacked images take their space; the content store is
// usually beside it under containerd's root.
func NewImageFilesystem(c *client.Client, path string) gc.ImageFilesystem {
	return &imageFS{client: c, path: path}
}

func (fs *imageFS) Usage(ctx context.Context) (capacity, available uint64, err error) {
	path, err := fs.root(ctx)
	if err != nil {
		return 0, 0, err
	}
	return gc.StatFS(path)
}

// Root is a path on the image file system: the configured one, or the snapshotter's root.
func (fs *imageFS) Root(ctx context.Context) (string, error) { return fs.root(ctx) }

func (fs *imageFS) root(ctx context.Context) (string, error) {
	if fs.path != "" {
		return fs.path, nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.found != "" {
		return fs.found, nil
	}
	resp, err := fs.client.IntrospectionService().Plugins(ctx,
		fmt.Sprintf("type==%s,id==%s", plugins.SnapshotPlugin, defaults.DefaultSnapshotter))
	if err != nil {
		return "", fmt.Errorf("ask containerd for its snapshotter root: %w", err)
	}
	for _, p := range resp.Plugins {
		if root := p.Exports[plugins.SnapshotterRootDir]; root != "" {
			fs.found = root
			return root, nil
		}
	}
	return "", errors.New("containerd does not report the root of its " + defaults.DefaultSnapshotter +
		" snapshotter: set the image file system path in the configuration")
}
