package containerd

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// alreadyImported reads the OCI index of a tarball (without reading its layers) and reports
// whether every image it names is present with the digest it names.
func (r *Runtime) alreadyImported(ctx context.Context, f io.ReadSeeker) ([]string, bool) {
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return nil, false
		}
		if path.Clean(hdr.Name) != "index.json" {
			continue
		}
		var index ocispec.Index
		if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&index); err != nil {
			return nil, false
		}
		var names []string
		for _, m := range index.Manifests {
			name := m.Annotations["io.containerd.image.name"]
			if name == "" {
				name = m.Annotations[ocispec.AnnotationRefName]
			}
			if name == "" {
				return nil, false
			}
			img, err := r.client.ImageService().Get(ctx, name)
			if err != nil || img.Target.Digest != m.Digest {
				return nil, false
			}
			if ok, err := client.NewImage(r.client, img).IsUnpacked(ctx, ""); err != nil || !ok {
				return nil, false
			}
			names = append(names, name)
		}
		return names, len(names) > 0
	}
}

// ImportResult says what one preload tarball did.
type ImportResult struct {
	Path   string
	Images []string
	// Skipped: every image of the tarball was already present.
	Skipped bool
	Err     error
}

// ImportDir imports every OCI or Docker image tarball (*.tar) in dir into holdfast's
// namespace, so that a gateway with no registry can run its pods. An image whose name is
// already present with the same digest is left alone. One unreadable tarball does not stop
// the others: each result carries its own error. A missing dir means nothing to preload.
func (r *Runtime) ImportDir(ctx context.Context, dir string) ([]ImportResult, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read image preload dir: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".tar") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	results := make([]ImportResult, 0, len(names))
	for _, n := range names {
		p := filepath.Join(dir, n)
		if f, err := os.Open(p); err == nil {
			names, present := r.alreadyImported(r.ctx(ctx), f)
			f.Close()
			if present {
				results = append(results, ImportResult{Path: p, Images: names, Skipped: true})
				continue
			}
		}
		imgs, err := r.ImportFile(ctx, p)
		results = append(results, ImportResult{Path: p, Images: imgs, Err: err})
	}
	return results, nil
}

// ImportFile imports one image tarball and unpacks it, returning the image names it held.
// A tarball whose every named image is already present with the same digest is skipped, so
// a boot does not re-read hundreds of megabytes of firmware images.
func (r *Runtime) ImportFile(ctx context.Context, path string) ([]string, error) {
	ctx = r.ctx(ctx)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
	if names, ok := r.alreadyImported(ctx, f); ok {
		return names, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewind %s: %w", path, err)
	}
	imgs, err := r.client.Import(ctx, f, client.WithAllPlatforms(false))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	var names []string
	for _, rec := range imgs {
		img := client.NewImage(r.client, rec)
		if err := r.unpack(ctx, img); err != nil && !errdefs.IsAlreadyExists(err) {
			return names, fmt.Errorf("import %s: %w", path, err)
		}
		names = append(names, rec.Name)
	}
	return names, nil
}
