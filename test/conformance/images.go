package conformance

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/holdfast-dev/holdfast/test/ociimage"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// KubernetesVersion is the release whose e2e suite judges the node, and whose agnhost and nnp
// the images carry (hack/tools/e2e/go.mod).
const KubernetesVersion = "v1.37.2"

// Paths of the binaries in the cache (hack/build-conformance-tools.sh, hack/build-kubelet.sh).
func e2eTestPath() string { return filepath.Join(testenv.BinDir(), "e2e.test-"+KubernetesVersion) }
func ginkgoPath() string  { return filepath.Join(testenv.BinDir(), "ginkgo-"+KubernetesVersion) }
func agnhostPath() string { return filepath.Join(testenv.BinDir(), "agnhost-"+KubernetesVersion) }
func nnpPath() string     { return filepath.Join(testenv.BinDir(), "nnp-"+KubernetesVersion) }
func kubeletPath() string { return filepath.Join(testenv.BinDir(), "kubelet-"+KubernetesVersion) }

// busyboxPath is the host's static busybox (Debian package busybox-static).
const busyboxPath = "/bin/busybox"

// agnhostHostBinaries are host binaries (Debian packages curl and bash) that upstream's
// agnhost image has and the suite runs inside agnhost containers: curl in the exec lifecycle
// hooks, bash in the probing tests' scripts.
var agnhostHostBinaries = []string{"/usr/bin/curl", "/bin/bash"}

// The registries of test/utils/image/manifest.go that the suite is pointed at, as repository
// prefixes in the local registry. Images under the other keys are not built here: their
// tests fail with a pull error on both agents, never reaching the internet.
var repoList = map[string]string{
	"promoterE2eRegistry":      "e2e-test-images",
	"gcRegistry":               "",
	"privateRegistry":          "k8s-authenticated-test",
	"buildImageRegistry":       "build-image",
	"gcEtcdRegistry":           "etcd",
	"sigStorageRegistry":       "sig-storage",
	"dockerLibraryRegistry":    "library",
	"cloudProviderGcpRegistry": "cloud-provider-gcp",
}

// writeRepoList writes the KUBE_TEST_REPO_LIST file pointing every registry key at host.
func writeRepoList(path, host string) error {
	var b strings.Builder
	for key, prefix := range repoList {
		fmt.Fprintf(&b, "%s: %s\n", key, strings.TrimSuffix(host+"/"+prefix, "/"))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// imagesDescription says what suiteImages builds, for the page of each run.
const imagesDescription = "built on this machine: agnhost and nnp from the Kubernetes module, busybox from Debian's busybox-static with the host's bash as its sh"

// suiteImages are the images the selected tests run, as manifest.go names them (registry key,
// name, tag), built from what this machine has: the static busybox for every base, agnhost
// and nnp built from the Kubernetes module. What upstream's Dockerfiles add that a test looks
// at is added too (agnhost's users, /uploads, the porter certificates, curl and bash).
func suiteImages(host string) ([]ociimage.Image, error) {
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read %s (Debian package busybox-static): %w", busyboxPath, err)
	}
	agnhost, err := os.ReadFile(agnhostPath())
	if err != nil {
		return nil, fmt.Errorf("read agnhost (hack/build-conformance-tools.sh): %w", err)
	}
	nnp, err := os.ReadFile(nnpPath())
	if err != nil {
		return nil, fmt.Errorf("read nnp (hack/build-conformance-tools.sh): %w", err)
	}
	hostBinaries, err := hostBinariesLayer(agnhostHostBinaries...)
	if err != nil {
		return nil, err
	}
	shLayer, err := hostBinariesLayer("/bin/bash")
	if err != nil {
		return nil, err
	}
	shLayer = append(shLayer, ociimage.Symlink("bin/sh", "bash"))
	// Upstream's busybox image links every applet (the sysctl tests run /bin/sysctl), where
	// BusyboxLayer links the set holdfast's own tests use.
	applets, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busyboxPath, err)
	}
	base := ociimage.BusyboxLayer(busybox)
	have := map[string]bool{}
	for _, e := range base {
		have[e.Path] = true
	}
	for _, a := range strings.Fields(string(applets)) {
		if p := "bin/" + a; !have[p] {
			base = append(base, ociimage.Symlink(p, "busybox"))
			have[p] = true
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	agnhostLayer := []ociimage.Entry{
		ociimage.File("agnhost", 0o755, agnhost),
		ociimage.Symlink("agnhost-2", "agnhost"),
		ociimage.Dir("uploads", 0o755),
		ociimage.File("localhost.crt", 0o644, porterCert),
		ociimage.File("localhost.key", 0o600, porterKey),
		ociimage.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"+
			"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")),
		ociimage.File("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"+
			"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")),
		ociimage.Dir("home/user-defined-in-image", 0o755),
	}
	name := func(key, repo, tag string) string {
		return strings.TrimSuffix(host+"/"+repoList[key], "/") + "/" + repo + ":" + tag
	}
	agnhostImage := func(ref string) ociimage.Image {
		return ociimage.Image{
			Name:   ref,
			Config: ocispec.ImageConfig{Env: env, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, WorkingDir: "/"},
			Layers: [][]ociimage.Entry{base, hostBinaries, agnhostLayer},
		}
	}
	return []ociimage.Image{
		agnhostImage(name("promoterE2eRegistry", "agnhost", "2.66.1")),
		agnhostImage(name("promoterE2eRegistry", "agnhost", "2.55")),
		agnhostImage(name("privateRegistry", "agnhost", "2.6")),
		{
			// sh is bash, every other applet busybox: Debian's busybox 1.35 ash leaves out of
			// its children's environment every variable whose name is no shell identifier
			// (data-1, from a ConfigMap's envFrom), which the ConfigMap and Secret env tests
			// look for; upstream's image (busybox 1.37.0) passes them, and bash passes the
			// variables on (docs/conformance-runs/2026-12-06-env-before.md and -after.md).
			Name:   name("promoterE2eRegistry", "busybox", "1.37.0-2"),
			Config: ocispec.ImageConfig{Env: env, Cmd: []string{"sh"}, WorkingDir: "/"},
			Layers: [][]ociimage.Entry{base, shLayer},
		},
		{
			// Upstream's pause exits on SIGTERM; agnhost's pause does the same.
			Name:   name("gcRegistry", "pause", "3.10.2"),
			Config: ocispec.ImageConfig{Env: env, Entrypoint: []string{"/agnhost", "pause"}, WorkingDir: "/"},
			Layers: [][]ociimage.Entry{base, agnhostLayer},
		},
		{
			Name:   name("promoterE2eRegistry", "nonewprivs", "1.4"),
			Config: ocispec.ImageConfig{Env: env, Cmd: []string{"nnp"}, WorkingDir: "/"},
			Layers: [][]ociimage.Entry{base, {ociimage.File("usr/local/bin/nnp", fs.ModeSetuid|0o755, nnp)}},
		},
		{
			Name:   name("promoterE2eRegistry", "nonroot", "1.5"),
			Config: ocispec.ImageConfig{Env: env, Cmd: []string{"sh"}, User: "1234", WorkingDir: "/"},
			Layers: [][]ociimage.Entry{base},
		},
	}, nil
}

// pushImages builds the suite's images and pushes them to r.
func pushImages(ctx context.Context, r *testenv.Registry) ([]string, error) {
	imgs, err := suiteImages(r.Host)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, img := range imgs {
		r.Push(ctx, img.Name, img)
		names = append(names, img.Name)
	}
	return names, nil
}

// hostBinariesLayer is a layer holding dynamically linked host binaries with the shared
// libraries and the loader ldd(1) resolves for them, at the same paths.
func hostBinariesLayer(bins ...string) ([]ociimage.Entry, error) {
	var paths []string
	for _, bin := range bins {
		out, err := exec.Command("ldd", bin).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s (Debian package %s): %w", bin, filepath.Base(bin), err)
		}
		paths = append(paths, bin)
		for _, line := range strings.Split(string(out), "\n") {
			// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)"
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
				paths = append(paths, f[2])
			case len(f) >= 1 && filepath.IsAbs(f[0]):
				paths = append(paths, f[0])
			}
		}
	}
	slices.Sort(paths)
	var layer []ociimage.Entry
	for _, p := range slices.Compact(paths) {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		layer = append(layer, ociimage.File(strings.TrimPrefix(p, "/"), 0o755, data))
	}
	return layer, nil
}
