package conformance

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// unmountUnder lazily unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return err
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
		}
	}
	return nil
}

// The agents judged.
const (
	Holdfast = "holdfast"
	Kubelet  = "kubelet"
)

// nodeName is the cluster's only node, whichever agent it runs.
const nodeName = "conformance-node"

// startNode starts agent as the cluster's node on a private containerd and CNI network, and
// waits until the Node is Ready. Everything stops when t ends.
func startNode(t testing.TB, agent string, c *Cluster) {
	t.Helper()
	cni := testenv.CNI(t)
	dir := t.TempDir()
	switch agent {
	case Holdfast:
		cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
		cfg := testenv.NewAgentConfig(t, dir, cd, cni)
		cfg.NodeName = nodeName
		cfg.Kubeconfig = c.WriteNodeKubeconfig(nodeName)
		cfg.ManifestDir = "-"
		testenv.StartAgent(t, dir, cfg)
	case Kubelet:
		cd := testenv.StartContainerd(t, testenv.ContainerdOptions{EnableCRI: true, CNI: cni})
		// The CRI plugin's sandbox image is the node's own, preloaded as on any node; the
		// suite's images are pulled from the registry.
		cd.ImportTestImages(context.Background(), "k8s.io")
		startKubelet(t, dir, c, cd)
	default:
		t.Fatalf("unknown agent %q", agent)
	}
	testenv.Eventually(t, 3*time.Minute, "node "+nodeName+" Ready", func() error {
		n, err := c.Admin.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("not Ready: %v", n.Status.Conditions)
	})
}

// kubeletConfig is bench's KubeletConfiguration (see bench/agents.go: what this machine
// needs, everything else at the kubelet's defaults) with the node API served as on a real
// node, on all addresses, to clients with a certificate of the cluster's CA (the apiserver
// for logs, exec, port-forward), since the suite uses it.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://{{.Socket}}
port: {{.Port}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{.HealthzPort}}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {{.ClientCA}}
authorization:
  mode: AlwaysAllow
makeIPTablesUtilChains: false
podLogsDir: {{.Dir}}/pods
volumePluginDir: {{.Dir}}/volume-plugins
`

func startKubelet(t testing.TB, dir string, c *Cluster, cd *testenv.Containerd) {
	t.Helper()
	ports := make([]string, 2)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	conf := strings.NewReplacer("{{.Socket}}", cd.Address, "{{.Port}}", ports[0], "{{.HealthzPort}}", ports[1],
		"{{.Dir}}", dir, "{{.ClientCA}}", c.CA.CertFile).Replace(kubeletConfig)
	confPath := filepath.Join(dir, "kubelet-config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// A mount namespace of its own, so that it never writes the shared host's /proc/sys.
	script, err := testenv.KubeletMountScript(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet mounts pod volumes (tmpfs for secrets and tokens) under its root directory
	// in its own mount namespace, and containerd, in the host's, must see them: the root
	// directory is a shared mount, so its copy in the kubelet's namespace propagates back.
	// The host's other mounts are private here, so the bind mounts above stay the kubelet's.
	rootDir := filepath.Join(dir, "root")
	if err := os.MkdirAll(rootDir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the kubelet and containerd have stopped
		if err := unmountUnder(dir); err != nil {
			t.Errorf("unmount the kubelet's volumes: %v", err)
		}
	})
	if err := unix.Mount(rootDir, rootDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", rootDir, err)
	}
	if err := unix.Mount("", rootDir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", rootDir, err)
	}
	p := testenv.NewProcess(Kubelet, filepath.Join(dir, "kubelet.log"),
		"unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script,
		kubeletPath(),
		"--config="+confPath,
		"--kubeconfig="+c.WriteNodeKubeconfig(nodeName),
		"--root-dir="+rootDir,
		"--cert-dir="+filepath.Join(dir, "pki"),
		"--hostname-override="+nodeName,
	)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log tail:\n%s", p.LogTail(40))
		}
		_ = p.Stop(syscall.SIGKILL, 0)
	})
	// Registered last, so it runs first: the kubelet stops before its volumes are unmounted.
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
}
