package conformance

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

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
		cfg.Authentication.X509.ClientCAFile = c.KubeletClientCAFile()
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

func startKubelet(t testing.TB, dir string, c *Cluster, cd *testenv.Containerd) {
	t.Helper()
	// The node API is served as on a real node, on all addresses, to clients with a
	// certificate of the apiserver's kubelet client CA (logs, exec, port-forward): the suite
	// uses it.
	// Its cgroup hierarchy at its defaults, below a cgroup of its own (the host is shared).
	root, err := cd.NewCgroupRoot()
	if err != nil {
		t.Fatal(err)
	}
	argv := testenv.KubeletCommand(t, testenv.KubeletOptions{
		Dir: dir, Bin: kubeletPath(), Socket: cd.Address, CgroupRoot: root,
		NodeName: nodeName, Kubeconfig: c.WriteNodeKubeconfig(nodeName), ClientCA: c.KubeletClientCAFile(),
	})
	p := testenv.NewProcess(Kubelet, filepath.Join(dir, "kubelet.log"), argv...)
	// Registered after KubeletCommand's, so it runs first: the kubelet stops before its
	// volumes are unmounted.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log tail:\n%s", p.LogTail(40))
		}
		_ = p.Stop(syscall.SIGKILL, 0)
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
}
