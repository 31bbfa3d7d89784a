package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Epoch is the only timestamp that appears in a built image: layer entries, the layout tarball
// and the image config's created time. Fixed so that rebuilding gives identical digests.
var Epoch = time.Unix(0, 0).UTC()

// AnnotationContainerdImageName is the index annotation containerd's Import takes as the image
// name, verbatim (images.AnnotationImageName in containerd; repeated here so that building an
// image does not pull in containerd).
const AnnotationContainerdImageName = "io.containerd.image.name"

// Entry is one file system object in a layer.
type Entry struct {
	// Path is slash-separated and relative to the image root, e.g. "bin/busybox". A leading
	// slash is accepted and ignored.
	Path string
	// Mode holds the permission bits plus fs.ModeDir or fs.ModeSymlink for those types, and
	// fs.ModeSticky, fs.ModeSetuid, fs.ModeSetgid where wanted. No type bit means a regular file.
	Mode fs.FileMode
	// Data is the content of a regular file.
	Data []byte
	// Linkname is the target of a symlink.
	Linkname string
}

// Dir returns a directory entry.
func Dir(p string, perm fs.FileMode) Entry { return Entry{Path: p, Mode: fs.ModeDir | perm} }

// File returns a regular file entry.
func File(p string, perm fs.FileMode, data []byte) Entry {
	return Entry{Path: p, Mode: perm, Data: data}
}

// Symlink returns a symlink entry pointing at target.
func Symlink(p, target string) Entry {
	return Entry{Path: p, Mode: fs.ModeSymlink | 0o777, Linkname: target}
}

// Image describes one image to build.
type Image struct {
	// Name is the fully qualified reference containerd will register, e.g.
	// "docker.io/holdfast/busybox:test". Containerd's CRI plugin resolves names fully
	// qualified, so a short name like "busybox" would never be found by it.
	Name string
	// Platform is the image's os/architecture/variant. Defaults to HostPlatform().
	Platform *ocispec.Platform
	// Config is the runtime configuration (Env, Entrypoint, Cmd, WorkingDir, ...).
	Config ocispec.ImageConfig
	// Layers are applied in order, each packed as one gzip-compressed tar. Parent
	// directories missing from a layer are added with mode 0755.
	Layers [][]Entry
}

// HostPlatform returns the linux platform of the running binary's architecture: GOARCH, with
// variant v7 for 32-bit arm (the gateways holdfast targets).
func HostPlatform() ocispec.Platform {
	p := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if runtime.GOARCH == "arm" {
		p.Variant = "v7"
	}
	return p
}

// blob is one content-addressed object of the layout.
type blob struct {
	desc ocispec.Descriptor
	data []byte
}

// WriteLayout writes an OCI image-layout tarball holding imgs to w. Blobs shared between
// images are stored once.
func WriteLayout(w io.Writer, imgs ...Image) error {
	if len(imgs) == 0 {
		return fmt.Errorf("write image layout: no images given")
	}
	blobs := map[digest.Digest]blob{}
	add := func(mediaType string, data []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		blobs[d.Digest] = blob{desc: d, data: data}
		return d
	}

	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
	}
	for _, img := range imgs {
		manifest, err := buildImage(img, add)
		if err != nil {
			return fmt.Errorf("build image %q: %w", img.Name, err)
		}
		index.Manifests = append(index.Manifests, manifest)
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return fmt.Errorf("encode index.json: %w", err)
	}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return fmt.Errorf("encode oci-layout: %w", err)
	}

	digests := make([]digest.Digest, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Slice(digests, func(i, j int) bool { return digests[i] < digests[j] })

	tw := tar.NewWriter(w)
	put := func(e Entry) error {
		if err := writeEntry(tw, e); err != nil {
			return fmt.Errorf("write %s to image layout: %w", e.Path, err)
		}
		return nil
	}
	entries := []Entry{
		File(ocispec.ImageLayoutFile, 0o644, layoutJSON),
		Dir(ocispec.ImageBlobsDir, 0o755),
		Dir(ocispec.ImageBlobsDir+"/sha256", 0o755),
	}
	for _, d := range digests {
		if d.Algorithm() != digest.SHA256 {
			return fmt.Errorf("write image layout: unexpected digest algorithm %s", d.Algorithm())
		}
		entries = append(entries, File(ocispec.ImageBlobsDir+"/sha256/"+d.Encoded(), 0o444, blobs[d].data))
	}
	entries = append(entries, File(ocispec.ImageIndexFile, 0o644, indexJSON))
	for _, e := range entries {
		if err := put(e); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("finish image layout tar: %w", err)
	}
	return nil
}

// buildImage adds the layers, config and manifest of img through add and returns the
// manifest's descriptor as it belongs in index.json.
func buildImage(img Image, add func(mediaType string, data []byte) ocispec.Descriptor) (ocispec.Descriptor, error) {
	if img.Name == "" {
		return ocispec.Descriptor{}, fmt.Errorf("image has no name")
	}
	platform := HostPlatform()
	if img.Platform != nil {
		platform = *img.Platform
	}

	created := Epoch
	config := ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config:   img.Config,
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	var layerDescs []ocispec.Descriptor
	for i, entries := range img.Layers {
		compressed, diffID, err := BuildLayer(entries)
		if err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("layer %d: %w", i, err)
		}
		layerDescs = append(layerDescs, add(ocispec.MediaTypeImageLayerGzip, compressed))
		config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, diffID)
		config.History = append(config.History, ocispec.History{
			Created:   &created,
			CreatedBy: "holdfast ociimage",
		})
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode config: %w", err)
	}
	configDesc := add(ocispec.MediaTypeImageConfig, configJSON)

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    layerDescs,
	}
	if manifest.Layers == nil {
		manifest.Layers = []ocispec.Descriptor{} // the spec wants an array, never null
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("encode manifest: %w", err)
	}
	desc := add(ocispec.MediaTypeImageManifest, manifestJSON)
	desc.Platform = &platform
	desc.Annotations = map[string]string{
		ocispec.AnnotationRefName:     img.Name,
		AnnotationContainerdImageName: img.Name,
	}
	return desc, nil
}

// BuildLayer packs entries into a gzip-compressed tar and returns it with its diff ID (the
// digest of the uncompressed tar). Entries are sorted by path and missing parent directories
// added, so the result does not depend on the order given.
func BuildLayer(entries []Entry) (compressed []byte, diffID digest.Digest, err error) {
	entries, err = normalize(entries)
	if err != nil {
		return nil, "", err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz) // no Name, zero ModTime: the header is the same on every run
	digester := digest.SHA256.Digester()
	tw := tar.NewWriter(io.MultiWriter(zw, digester.Hash()))
	for _, e := range entries {
		if err := writeEntry(tw, e); err != nil {
			return nil, "", fmt.Errorf("write %s: %w", e.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", fmt.Errorf("finish layer tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("finish layer gzip: %w", err)
	}
	return gz.Bytes(), digester.Digest(), nil
}

// normalize cleans paths, rejects duplicates and escapes, adds missing parent directories and
// sorts by path so that parents come before children.
func normalize(entries []Entry) ([]Entry, error) {
	byPath := make(map[string]Entry, len(entries))
	for _, e := range entries {
		p := path.Clean("/" + e.Path)[1:]
		if p == "" {
			return nil, fmt.Errorf("entry %q: the root is not an entry", e.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("entry %q given twice", p)
		}
		e.Path = p
		byPath[p] = e
	}
	for p := range byPath {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			existing, ok := byPath[dir]
			if !ok {
				byPath[dir] = Dir(dir, 0o755)
				continue
			}
			if !existing.Mode.IsDir() {
				return nil, fmt.Errorf("entry %q: parent %q is not a directory", p, dir)
			}
		}
	}
	out := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// writeEntry writes one tar header (and content) with fixed owner and time.
func writeEntry(tw *tar.Writer, e Entry) error {
	hdr := &tar.Header{
		Name:    strings.TrimPrefix(e.Path, "/"),
		Mode:    int64(e.Mode.Perm()),
		ModTime: Epoch,
		Format:  tar.FormatPAX,
	}
	if e.Mode&fs.ModeSetuid != 0 {
		hdr.Mode |= 0o4000
	}
	if e.Mode&fs.ModeSetgid != 0 {
		hdr.Mode |= 0o2000
	}
	if e.Mode&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	switch e.Mode.Type() {
	case fs.ModeDir:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case fs.ModeSymlink:
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = e.Linkname
	case 0:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = int64(len(e.Data))
	default:
		return fmt.Errorf("unsupported file type %v", e.Mode.Type())
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeReg {
		if _, err := tw.Write(e.Data); err != nil {
			return err
		}
	}
	return nil
}
