package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func testImages() []Image {
	layer := []Entry{
		File("bin/tool", 0o755, []byte("#!/bin/sh\necho tool\n")),
		Symlink("bin/sh", "tool"),
		Dir("tmp", fs.ModeSticky|0o777),
	}
	return []Image{
		{
			Name:   "docker.io/example/app:1",
			Config: ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}},
			Layers: [][]Entry{layer},
		},
		{
			Name:   "registry.example/pause:1",
			Config: ocispec.ImageConfig{Entrypoint: []string{"sleep", "1"}},
			Layers: [][]Entry{layer},
		},
	}
}

// readLayout returns the regular files of a layout tarball by path.
func readLayout(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("read layout tar: %v", err)
		}
		if !hdr.ModTime.Equal(Epoch) {
			t.Errorf("%s: mtime %v, want %v", hdr.Name, hdr.ModTime, Epoch)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", hdr.Name, err)
		}
		files[hdr.Name] = b
	}
}

// blobOf returns the blob desc points at, after checking its digest and size.
func blobOf(t *testing.T, files map[string][]byte, desc ocispec.Descriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+desc.Digest.Encoded()]
	if !ok {
		t.Fatalf("blob %s (%s) missing from layout", desc.Digest, desc.MediaType)
	}
	if got := digest.FromBytes(b); got != desc.Digest {
		t.Fatalf("blob %s has content digest %s", desc.Digest, got)
	}
	if int64(len(b)) != desc.Size {
		t.Fatalf("blob %s: size %d, descriptor says %d", desc.Digest, len(b), desc.Size)
	}
	return b
}

func TestWriteLayout(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteLayout(&buf, testImages()...); err != nil {
		t.Fatalf("WriteLayout: %v", err)
	}
	files := readLayout(t, buf.Bytes())

	var layout ocispec.ImageLayout
	if err := json.Unmarshal(files[ocispec.ImageLayoutFile], &layout); err != nil || layout.Version != ocispec.ImageLayoutVersion {
		t.Fatalf("oci-layout = %q (%v), want version %s", files[ocispec.ImageLayoutFile], err, ocispec.ImageLayoutVersion)
	}
	for name := range files {
		if strings.HasPrefix(name, "blobs/sha256/") {
			if got := digest.FromBytes(files[name]).Encoded(); "blobs/sha256/"+got != name {
				t.Errorf("blob %s holds content with digest %s", name, got)
			}
		}
	}

	var index ocispec.Index
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil {
		t.Fatalf("decode index.json: %v", err)
	}
	if index.SchemaVersion != 2 || index.MediaType != ocispec.MediaTypeImageIndex {
		t.Errorf("index: schemaVersion %d mediaType %q", index.SchemaVersion, index.MediaType)
	}
	want := testImages()
	if len(index.Manifests) != len(want) {
		t.Fatalf("index has %d manifests, want %d", len(index.Manifests), len(want))
	}
	for i, mdesc := range index.Manifests {
		name := want[i].Name
		if got := mdesc.Annotations[ocispec.AnnotationRefName]; got != name {
			t.Errorf("manifest %d: %s = %q, want %q", i, ocispec.AnnotationRefName, got, name)
		}
		if got := mdesc.Annotations[AnnotationContainerdImageName]; got != name {
			t.Errorf("manifest %d: %s = %q, want %q", i, AnnotationContainerdImageName, got, name)
		}
		if host := HostPlatform(); mdesc.Platform == nil || mdesc.Platform.OS != host.OS ||
			mdesc.Platform.Architecture != host.Architecture || mdesc.Platform.Variant != host.Variant {
			t.Errorf("manifest %d: platform %+v, want %+v", i, mdesc.Platform, HostPlatform())
		}

		var manifest ocispec.Manifest
		if err := json.Unmarshal(blobOf(t, files, mdesc), &manifest); err != nil {
			t.Fatalf("decode manifest %d: %v", i, err)
		}
		var config ocispec.Image
		if err := json.Unmarshal(blobOf(t, files, manifest.Config), &config); err != nil {
			t.Fatalf("decode config %d: %v", i, err)
		}
		if config.Architecture != HostPlatform().Architecture || config.OS != "linux" {
			t.Errorf("config %d: platform %s/%s", i, config.OS, config.Architecture)
		}
		if len(config.RootFS.DiffIDs) != len(manifest.Layers) {
			t.Fatalf("config %d: %d diff IDs for %d layers", i, len(config.RootFS.DiffIDs), len(manifest.Layers))
		}
		for j, ldesc := range manifest.Layers {
			zr, err := gzip.NewReader(bytes.NewReader(blobOf(t, files, ldesc)))
			if err != nil {
				t.Fatalf("layer %d: %v", j, err)
			}
			raw, err := io.ReadAll(zr)
			if err != nil {
				t.Fatalf("layer %d: gunzip: %v", j, err)
			}
			if got := digest.FromBytes(raw); got != config.RootFS.DiffIDs[j] {
				t.Errorf("layer %d: uncompressed digest %s, config says %s", j, got, config.RootFS.DiffIDs[j])
			}
			assertLayerEntries(t, raw, []string{"bin/", "bin/sh", "bin/tool", "tmp/"})
		}
	}
}

func assertLayerEntries(t *testing.T, raw []byte, want []string) {
	t.Helper()
	var got []string
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || !hdr.ModTime.Equal(Epoch) {
			t.Errorf("%s: uid %d gid %d mtime %v", hdr.Name, hdr.Uid, hdr.Gid, hdr.ModTime)
		}
		if hdr.Name == "tmp/" && hdr.Mode != 0o1777 {
			t.Errorf("tmp/: mode %o, want 1777", hdr.Mode)
		}
		got = append(got, hdr.Name)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("layer entries %q, want %q", got, want)
	}
}

func TestWriteLayoutIsDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := WriteLayout(&a, testImages()...); err != nil {
		t.Fatal(err)
	}
	imgs := testImages()
	// The order entries are given in must not matter.
	layer := imgs[0].Layers[0]
	layer[0], layer[2] = layer[2], layer[0]
	if err := WriteLayout(&b, imgs...); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two builds of the same images differ")
	}
}

func TestBuildLayerRejects(t *testing.T) {
	tests := []struct {
		name    string
		entries []Entry
	}{
		{"duplicate", []Entry{File("a", 0o644, nil), File("/a", 0o644, nil)}},
		{"file as parent", []Entry{File("a", 0o644, nil), File("a/b", 0o644, nil)}},
		{"root", []Entry{Dir("/", 0o755)}},
		{"device", []Entry{{Path: "dev/null", Mode: fs.ModeDevice | 0o666}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := BuildLayer(tt.entries); err == nil {
				t.Fatal("BuildLayer succeeded, want an error")
			}
		})
	}
}

func TestWriteLayoutRequiresName(t *testing.T) {
	if err := WriteLayout(io.Discard, Image{}); err == nil {
		t.Fatal("WriteLayout of an unnamed image succeeded")
	}
}
