// Package testimages defines the container images holdfast's integration tests run: which
// names, which tarballs, what is inside. hack/mkimage writes them and test/testenv imports
// them, both from this one definition. It is kept apart from testenv so that building the
// images does not compile client-go and the containerd client.
package testimages

import (
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/holdfast-dev/holdfast/test/ociimage"
)

// Image references, fully qualified as containerd's CRI plugin resolves them.
const (
	// Busybox holds a static busybox and its applets in /bin; its Cmd is ["sh"].
	Busybox = "docker.io/holdfast/busybox:test"
	// Pause is the same layer with Entrypoint ["sleep", "2147483647"], under the name
	// containerd 1.6's CRI plugin uses for its sandbox image.
	Pause = "registry.k8s.io/pause:3.6"
)

// File names of the image tarballs.
const (
	BusyboxFile = "busybox.tar"
	PauseFile   = "pause.tar"
)

// path is the PATH both images set.
const path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Images returns the test images by file name, both made of one layer around the static
// busybox binary given (ociimage.BusyboxLayer), for the host's platform.
func Images(busybox []byte) map[string]ociimage.Image {
	layer := ociimage.BusyboxLayer(busybox)
	return map[string]ociimage.Image{
		BusyboxFile: {
			Name: Busybox,
			Config: ocispec.ImageConfig{
				Env:        []string{path},
				Cmd:        []string{"sh"},
				WorkingDir: "/",
			},
			Layers: [][]ociimage.Entry{layer},
		},
		PauseFile: {
			Name: Pause,
			Config: ocispec.ImageConfig{
				Env:        []string{path},
				Entrypoint: []string{"sleep", "2147483647"},
				WorkingDir: "/",
			},
			Layers: [][]ociimage.Entry{layer},
		},
	}
}
