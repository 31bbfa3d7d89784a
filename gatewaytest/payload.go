package gatewaytest

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// PayloadOptions configures BuildPayload.
type PayloadOptions struct {
	// NodeName is the gateway's node name (config nodeName).
	NodeName string
	// Kubeconfig is the node's kubeconfig as the guest must read it (see GuestKubeconfig).
	// Empty: standalone.
	Kubeconfig []byte
	// ExtraConfig is appended to firmware/config.yaml: keys the firmware leaves unset.
	ExtraConfig string
}

// BuildPayload writes the payload disk the VM installs holdfast from and returns its path:
// an ext4 image (no loop device needed: mkfs.ext4 -d) laid out as a firmware bundle, with
// this checkout's binaries (amd64, built as `make build` builds them), firmware/ and the test images as preloaded images,
// and the site's kubeconfig and configuration. hack/vm/payload-install.sh installs it; the
// guest's holdfast-payload.service runs that once per payload.
func BuildPayload(t testing.TB, opts PayloadOptions) string {
	t.Helper()
	root := repoRoot(t)
	dir := filepath.Join(t.TempDir(), "payload")
	for _, d := range []string{"bin", "tools", "site"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatalf("payload: %v", err)
		}
	}
	goBuild(t, root, filepath.Join(dir, "bin"), "./cmd/holdfast", "./cmd/holdfast-logger")
	goBuild(t, root, filepath.Join(dir, "tools"), "./gatewaytest/guestprobe")
	run(t, "", "cp", "-r", filepath.Join(root, "firmware"), filepath.Join(dir, "firmware"))
	for _, name := range []string{testenv.BusyboxImageFile, testenv.PauseImageFile} {
		run(t, "", "cp", filepath.Join(testenv.ImagesDir(), name), filepath.Join(dir, "firmware", "images", name))
	}
	run(t, "", "cp", filepath.Join(root, "hack", "vm", "payload-install.sh"), filepath.Join(dir, "install.sh"))

	config, err := os.ReadFile(filepath.Join(root, "firmware", "config.yaml"))
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	site := string(config) + "\n# gatewaytest: this gateway\nnodeName: " + opts.NodeName + "\n"
	if len(opts.Kubeconfig) > 0 {
		site += "kubeconfig: /etc/holdfast/kubeconfig\n"
		writeFile(t, filepath.Join(dir, "site", "kubeconfig"), opts.Kubeconfig, 0o600)
	}
	site += opts.ExtraConfig
	writeFile(t, filepath.Join(dir, "site", "config.yaml"), []byte(site), 0o644)
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	writeFile(t, filepath.Join(dir, "id"), []byte(hex.EncodeToString(id)+"\n"), 0o644)

	disk := dir + ".ext4"
	run(t, "", "mkfs.ext4", "-q", "-F", "-L", "payload", "-d", dir, disk, "512M")
	return disk
}

// GuestKubeconfig rewrites a kubeconfig of the test control plane (WriteNodeKubeconfig) for
// the guest: the apiserver listens on the host's loopback, which the guest reaches as
// HostFromGuest; its self-signed serving certificate names "kubernetes" (the in-cluster
// name), so the guest verifies it under that name.
func GuestKubeconfig(t testing.TB, path string) []byte {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatalf("guest kubeconfig: %v", err)
	}
	for _, cluster := range cfg.Clusters {
		u, err := url.Parse(cluster.Server)
		if err != nil {
			t.Fatalf("guest kubeconfig: %v", err)
		}
		u.Host = HostFromGuest + ":" + u.Port()
		cluster.Server = u.String()
		cluster.TLSServerName = "kubernetes"
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatalf("guest kubeconfig: %v", err)
	}
	return out
}

// goBuild builds linux/amd64 binaries of pkgs into outDir with `make build`'s flags, so the
// build cache of a `make build` serves it (a static or stripped build shares nothing with it,
// and took over half an hour on a busy 2-core machine). The guest is Debian 12 like the host:
// the same glibc.
func goBuild(t testing.TB, root, outDir string, pkgs ...string) {
	t.Helper()
	args := append([]string{"build", "-trimpath", "-o", outDir + "/"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func run(t testing.TB, dir string, argv ...string) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

func writeFile(t testing.TB, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatalf("payload: %v", err)
	}
}
