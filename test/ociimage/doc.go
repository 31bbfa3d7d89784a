// Package ociimage builds OCI image-layout tarballs from file trees held in memory, with no
// registry, no docker and no network.
//
// An offline gateway has no registry to pull from: every image it runs must be preloaded, and
// the integration tests stand on the same ground. The tarballs written here are what
// containerd's client Import reads (github.com/containerd/containerd/v2/client): each manifest
// in index.json carries its image name in both the org.opencontainers.image.ref.name and the
// io.containerd.image.name annotations, so Import registers that name as is.
//
// Output is deterministic: every timestamp is [Epoch], owners are root, entries are sorted, and
// gzip headers carry no name or time. Building the same images twice gives identical bytes and
// therefore identical digests, so callers can compare instead of rebuilding.
package ociimage
