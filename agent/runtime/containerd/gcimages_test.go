package containerd

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/test/ociimage"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestContainerdImages runs the containerd side of image collection against a real
// containerd: listing, sizes with unpacked snapshots, references from containers, the
// last-used label, synchronous removal, and finding the image file system.
func TestContainerdImages(t *testing.T) {
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	const ns = "holdfast-gc-adapter-test"
	ctx := namespaces.WithNamespace(context.Background(), ns)
	cd.ImportTestImages(context.Background(), ns)

	var tar bytes.Buffer
	const tiny = "docker.io/holdfast/gc-tiny:1"
	if err := ociimage.WriteLayout(&tar, ociimage.Image{
		Name:   tiny,
		Config: ocispec.ImageConfig{Cmd: []string{"/hello"}},
		Layers: [][]ociimage.Entry{{ociimage.File("hello", 0o644, []byte("tiny\n"))}},
	}); err != nil {
		t.Fatal(err)
	}
	imported, err := cd.Client.Import(ctx, &tar)
	if err != nil || len(imported) != 1 {
		t.Fatalf("import: %v %v", imported, err)
	}
	busybox, err := cd.Client.GetImage(ctx, testenv.BusyboxImage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cd.Client.NewContainer(ctx, "gc-adapter-user", client.WithImage(busybox), client.WithNewSpec()); err != nil {
		t.Fatal(err)
	}

	store := NewImages(cd.Client, ns)
	imgs, err := store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]gc.Image{}
	for _, i := range imgs {
		byName[i.Name] = i
	}
	for _, n := range []string{testenv.BusyboxImage, testenv.PauseImage, tiny} {
		if i, ok := byName[n]; !ok || i.Digest == "" || i.Updated.IsZero() || !i.LastUsed.IsZero() {
			t.Errorf("image %s listed as %+v", n, i)
		}
	}

	// Unpacked, busybox counts its snapshot (the static binary, about 1 MiB and more); the
	// tiny image, never unpacked, only its blobs.
	bbSize, err := store.Size(ctx, testenv.BusyboxImage)
	if err != nil || bbSize < 1<<20 {
		t.Errorf("busybox size %d (%v): want its unpacked snapshot counted", bbSize, err)
	}
	if sz, err := store.Size(ctx, tiny); err != nil || sz <= 0 || sz > 4096 {
		t.Errorf("tiny size %d (%v)", sz, err)
	}

	names, err := store.ContainerImages(ctx)
	if err != nil || strings.Join(names, ",") != testenv.BusyboxImage {
		t.Errorf("container images %v (%v)", names, err)
	}
	for name, want := range map[string]bool{testenv.BusyboxImage: true, testenv.PauseImage: false} {
		if got, err := store.Referenced(ctx, name); err != nil || got != want {
			t.Errorf("Referenced(%s) = %v, %v; want %v", name, got, err, want)
		}
	}

	used := time.Date(2026, 11, 2, 10, 4, 5, 0, time.UTC)
	if err := store.SetLastUsed(ctx, testenv.PauseImage, used); err != nil {
		t.Fatal(err)
	}
	imgs, _ = store.List(ctx)
	for _, i := range imgs {
		if i.Name == testenv.PauseImage && !i.LastUsed.Equal(used) {
			t.Errorf("last used read back as %v, want %v", i.LastUsed, used)
		}
	}

	// Removal is synchronous: the image's blobs are gone when Remove returns.
	config, err := client.NewImage(cd.Client, imported[0]).Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Remove(ctx, tiny, imported[0].Target.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := cd.Client.ContentStore().Info(ctx, config.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("config blob of the removed image: %v, want not found", err)
	}
	if err := store.Remove(ctx, tiny, imported[0].Target.Digest); err != nil {
		t.Errorf("removing a removed image: %v", err)
	}

	// The image file system is found from containerd's snapshotter root.
	fs := NewImageFilesystem(cd.Client, "").(*imageFS)
	capacity, available, err := fs.Usage(ctx)
	if err != nil || capacity == 0 || available > capacity {
		t.Fatalf("usage %d/%d: %v", available, capacity, err)
	}
	if want := filepath.Join(cd.Root, "io.containerd.snapshotter.v1.overlayfs"); fs.found != want {
		t.Errorf("image file system found at %q, want %q", fs.found, want)
	}
}
