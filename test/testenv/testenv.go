package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast-dev/holdfast/test/testenv/testimages"
)

// Versions of the control plane binaries. hack/build-tools.sh builds the same ones; the
// binaries are cached under these names so that a version bump rebuilds instead of reusing.
const (
	KubeAPIServerVersion = "v1.37.2"
	EtcdVersion          = "v3.6.16"
)

// Image references of the test images hack/mkimage builds (see package testimages) and
// ImportTestImages imports. Fully qualified, as containerd's CRI plugin resolves them.
const (
	// BusyboxImage holds a static busybox and its applets in /bin; its Cmd is ["sh"].
	BusyboxImage = testimages.Busybox
	// PauseImage is the same layer with Entrypoint ["sleep", "2147483647"], under the name
	// containerd 1.6's CRI plugin uses for its sandbox image.
	PauseImage = testimages.Pause
)

// File names of the image tarballs in ImagesDir.
const (
	BusyboxImageFile = testimages.BusyboxFile
	PauseImageFile   = testimages.PauseFile
)

// CNIBinDir is where Debian's containernetworking-plugins installs the plugins.
const CNIBinDir = "/usr/lib/cni"

// cniPlugins are the plugins CNI's configuration uses.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// CacheDir returns $HOLDFAST_CACHE, or /var/cache/holdfast.
func CacheDir() string {
	if d := os.Getenv("HOLDFAST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/holdfast"
}

// BinDir returns $HOLDFAST_TEST_BIN, or CacheDir()/bin: where kube-apiserver and etcd are.
func BinDir() string {
	if d := os.Getenv("HOLDFAST_TEST_BIN"); d != "" {
		return d
	}
	return filepath.Join(CacheDir(), "bin")
}

// ImagesDir returns $HOLDFAST_TEST_IMAGES, or CacheDir()/images: where the image tarballs are.
func ImagesDir() string {
	if d := os.Getenv("HOLDFAST_TEST_IMAGES"); d != "" {
		return d
	}
	return filepath.Join(CacheDir(), "images")
}

// KubeAPIServerPath and EtcdPath return the paths of the versioned binaries in BinDir.
func KubeAPIServerPath() string {
	return filepath.Join(BinDir(), "kube-apiserver-"+KubeAPIServerVersion)
}

// EtcdPath returns the path of the etcd binary in BinDir.
func EtcdPath() string { return filepath.Join(BinDir(), "etcd-"+EtcdVersion) }

// KubeControllerManagerPath and KubeSchedulerPath return the paths of the cluster's controllers
// and scheduler in BinDir, built by hack/build-tools.sh at the apiserver's version, for the
// tests that need a cluster around the node (TLS bootstrap, the conformance suite).
func KubeControllerManagerPath() string {
	return filepath.Join(BinDir(), "kube-controller-manager-"+KubeAPIServerVersion)
}

// KubeSchedulerPath returns the path of the kube-scheduler binary in BinDir.
func KubeSchedulerPath() string {
	return filepath.Join(BinDir(), "kube-scheduler-"+KubeAPIServerVersion)
}

// KubectlPath returns the path of kubectl in BinDir, built by hack/build-tools.sh from
// k8s.io/kubectl at the apiserver's release.
func KubectlPath() string { return filepath.Join(BinDir(), "kubectl-"+KubeAPIServerVersion) }

// RequireIntegration marks t as an integration test. Under -short it skips t. Otherwise it
// fails t, naming what is missing, unless every prerequisite of this package is present: root,
// the control plane binaries, containerd, runc, the CNI plugins and the test images. It never
// skips outside -short: a CI run that quietly skips its integration tests proves nothing.
func RequireIntegration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (root, containerd, kube-apiserver): skipped under -short")
	}
	if missing := missingPrerequisites(); len(missing) > 0 {
		t.Fatalf("integration test prerequisites are missing:\n  - %s\n"+
			"Run `make test` as root: it installs the packages (hack/deps.sh), builds the binaries "+
			"(hack/build-tools.sh) and the images (hack/mkimage), then runs the tests. "+
			"HOLDFAST_TEST_BIN and HOLDFAST_TEST_IMAGES point elsewhere if they were built elsewhere.",
			strings.Join(missing, "\n  - "))
	}
}

// missingPrerequisites is computed once per test binary: the answer does not change while
// tests run, and every integration test asks.
var missingPrerequisites = sync.OnceValue(func() []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, fmt.Sprintf("root: running as uid %d (containerd, mounts and network namespaces need root)", os.Geteuid()))
	}
	for _, path := range []string{KubeAPIServerPath(), EtcdPath(), KubectlPath()} {
		if err := checkExecutable(path); err != nil {
			missing = append(missing, fmt.Sprintf("%v (HOLDFAST_TEST_BIN=%s; built by hack/build-tools.sh)", err, BinDir()))
		}
	}
	for _, name := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(name); err != nil {
			missing = append(missing, fmt.Sprintf("%s not in PATH (Debian packages containerd, runc; hack/deps.sh)", name))
		}
	}
	for _, name := range cniPlugins {
		if err := checkExecutable(filepath.Join(CNIBinDir, name)); err != nil {
			missing = append(missing, fmt.Sprintf("CNI plugin: %v (Debian package containernetworking-plugins; hack/deps.sh)", err))
		}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		missing = append(missing, "ip not in PATH (Debian package iproute2; hack/deps.sh)")
	}
	for _, name := range []string{BusyboxImageFile, PauseImageFile} {
		path := filepath.Join(ImagesDir(), name)
		if _, err := os.Stat(path); err != nil {
			missing = append(missing, fmt.Sprintf("test image %s (HOLDFAST_TEST_IMAGES=%s; built by `go run ./hack/mkimage -o DIR`)", path, ImagesDir()))
		}
	}
	return missing
})

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s not found", path)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
