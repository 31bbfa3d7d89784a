package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// PayloadOptions configures BuildPayload.
type PayloadOptions struct {
	// NodeName is the gateway's node name (config nodeName).
	NodeName string
	// BootstrapKubeconfig is a kubeconfig with a bootstrap token (the control plane's
	// WriteBootstrapKubeconfig) as the guest must read it (see GuestKubeconfig): holdfast
	// joins through TLS bootstrap and writes its own kubeconfig. Empty: standalone.
	BootstrapKubeconfig []byte
	// ExtraConfig is appended to firmware/config.yaml: keys the firmware leaves unset.
	ExtraConfig string
	// SetConfig gives top-level keys firmware/config.yaml sets another value (a key set
	// twice is refused by the agent): "cgroupDriver": "systemd".
	SetConfig map[string]string
	// ContainerdConfig, when set, becomes the guest's /etc/containerd/config.toml (installed
	// before containerd starts), as a site running holdfast's CRI backend configures
	// containerd's CRI plugin.
	ContainerdConfig string
}

// BuildPayload writes the payload disk the VM installs holdfast from and returns its path:
// an ext4 image (no loop device needed: mkfs.ext4 -d) holding
//
//	bundle/holdfast-VERSION-linux-amd64.tar.gz   this checkout's firmware bundle (hack/firmware.sh)
//	images/*.tar                                 the test images, preloaded as a gateway image would
//	site/config.yaml, site/bootstrap-kubeconfig  this gateway's configuration and join token
//	site/containerd.toml                         containerd's configuration, if ContainerdConfig
//	tools/guestprobe                             what the tests run in the guest
//	install.sh                                   hack/vm/payload-install.sh
//	id                                           a fresh id: the guest installs each payload once
//
// The guest's holdfast-payload.service runs install.sh, which installs the bundle with the
// bundle's own install.sh, as on a gateway, then adds the site's files.
func BuildPayload(t testing.TB, opts PayloadOptions) string {
	t.Helper()
	root := repo.Root(t)
	dir := filepath.Join(t.TempDir(), "payload")
	for _, d := range []string{"bundle", "images", "tools", "site"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatalf("payload: %v", err)
		}
	}
	start := time.Now()
	firmware := exec.Command(filepath.Join(root, "hack", "firmware.sh"))
	firmware.Dir = root
	firmware.Env = append(os.Environ(), "ARCHES=amd64", "OUT="+filepath.Join(dir, "bundle"))
	if out, err := firmware.CombinedOutput(); err != nil {
		t.Fatalf("hack/firmware.sh: %v\n%s", err, out)
	}
	t.Logf("firmware bundle built (%v)", time.Since(start).Round(time.Second))
	goBuild(t, root, filepath.Join(dir, "tools"), "./test/gateway/guestprobe")
	for _, name := range []string{testenv.BusyboxImageFile, testenv.PauseImageFile} {
		run(t, "", "cp", filepath.Join(testenv.ImagesDir(), name), filepath.Join(dir, "images", name))
	}
	run(t, "", "cp", filepath.Join(root, "hack", "vm", "payload-install.sh"), filepath.Join(dir, "install.sh"))

	config, err := os.ReadFile(filepath.Join(root, "firmware", "config.yaml"))
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	for key, value := range opts.SetConfig {
		line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `:.*$`)
		if !line.Match(config) {
			t.Fatalf("payload: firmware/config.yaml sets no %s to replace", key)
		}
		config = line.ReplaceAll(config, []byte(key+": "+value+" # test/gateway"))
	}
	site := string(config) + "\n# test/gateway: this gateway\nnodeName: " + opts.NodeName + "\n"
	if len(opts.BootstrapKubeconfig) > 0 {
		site += "bootstrapKubeconfig: /etc/holdfast/bootstrap-kubeconfig\n"
		writeFile(t, filepath.Join(dir, "site", "bootstrap-kubeconfig"), opts.BootstrapKubeconfig, 0o600)
	}
	site += opts.ExtraConfig
	if opts.ContainerdConfig != "" {
		writeFile(t, filepath.Join(dir, "site", "containerd.toml"), []byte(opts.ContainerdConfig), 0o644)
	}
	writeFile(t, filepath.Join(dir, "site", "config.yaml"), []byte(site), 0o644)
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	writeFile(t, filepath.Join(dir, "id"), []byte(hex.EncodeToString(id)+"\n"), 0o644)

	disk := dir + ".ext4"
	run(t, "", "mkfs.ext4", "-q", "-F", "-L", "payload", "-d", dir, disk, "512M")
	return disk
}

// GuestKubeconfig rewrites a kubeconfig of the test control plane (WriteBootstrapKubeconfig) for
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
// build cache of a `make build` serves it. The guest is Debian 12 like the host: the same glibc.
func goBuild(t testing.TB, root, outDir string, pkgs ...string) {
	t.Helper()
	args := append([]string{"build", "-trimpath", "-tags", "grpcnotrace", "-o", outDir + "/"}, pkgs...)
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
