package hollow

import (
	"context"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Images is the hollow runtime's image store as image collection sees it (gc.Images): the
// images pulled, each taking no space, so that collection finds nothing to free.
type Images struct{ r *Runtime }

// Images returns the runtime's image store.
func (r *Runtime) Images() Images { return Images{r} }

var _ gc.Images = Images{}

// List returns every image pulled.
func (im Images) List(context.Context) ([]gc.Image, error) {
	im.r.mu.Lock()
	defer im.r.mu.Unlock()
	out := make([]gc.Image, 0, len(im.r.images))
	for name, pulled := range im.r.images {
		out = append(out, gc.Image{Name: name, Digest: digest.Digest(imageDigest(name)), Updated: pulled})
	}
	return out, nil
}

// Size is 0: a hollow image takes no space.
func (im Images) Size(context.Context, string) (int64, error) { return 0, nil }

// ContainerImages returns the images the containers reference.
func (im Images) ContainerImages(ctx context.Context) ([]string, error) {
	cs, _ := im.r.List(ctx)
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, runtime.NormalizeImageRef(c.Image))
	}
	return out, nil
}

// Referenced reports whether a container references the image.
func (im Images) Referenced(ctx context.Context, name string) (bool, error) {
	names, _ := im.ContainerImages(ctx)
	for _, n := range names {
		if n == name {
			return true, nil
		}
	}
	return false, nil
}

// Remove forgets an image.
func (im Images) Remove(_ context.Context, name string, _ digest.Digest) error {
	im.r.mu.Lock()
	defer im.r.mu.Unlock()
	delete(im.r.images, name)
	return nil
}

// SetLastUsed does nothing: the image store is never under pressure.
func (im Images) SetLastUsed(context.Context, string, time.Time) error { return nil }

// Filesystem is a hollow node's image file system: always the same size and never filling
// up, so that neither image collection nor disk-pressure eviction act on a simulated disk
// (the host's disk is shared by every hollow node of the machine).
type Filesystem struct {
	// Dir is a path on the host, the node's state directory, that eviction's imagefs
	// signals are read from like the nodefs's.
	Dir string
}

var _ gc.ImageFilesystem = Filesystem{}

// Usage reports 64 GiB, 60 free.
func (f Filesystem) Usage(context.Context) (capacity, available uint64, err error) {
	return 64 << 30, 60 << 30, nil
}

// Root returns Dir.
func (f Filesystem) Root(context.Context) (string, error) { return f.Dir, nil }
