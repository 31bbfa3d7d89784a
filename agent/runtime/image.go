package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

func normalize(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}

// ImportResult says what one preload tarball did.
type ImportResult struct {
	Path   string
	Images []string
	Err    error
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
		imgs, err := r.ImportFile(ctx, p)
		results = append(results, ImportResult{Path: p, Images: imgs, Err: err})
	}
	return results, nil
}

// ImportFile imports one image tarball and unpacks it, returning the image names it held.
func (r *Runtime) ImportFile(ctx context.Context, path string) ([]string, error) {
	ctx = r.ctx(ctx)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
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
