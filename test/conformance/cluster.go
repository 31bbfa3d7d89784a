package conformance

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Cluster is a control plane as a real cluster runs it around one node: etcd and
// kube-apiserver, the controller-manager (service accounts and their tokens, namespace
// deletion, garbage collection, the node lifecycle) and the scheduler, each authenticating
// with a client certificate as its own user, and the apiserver reaching kubelets with a client
// certificate of its own.
type Cluster struct {
	*testenv.ControlPlane
	// AdminKubeconfig is a kubeconfig file for an admin (group system:masters): the suite's.
	AdminKubeconfig string
}

// StartCluster starts the cluster for node, whose token the node agent uses. Everything stops
// when t ends.
func StartCluster(t testing.TB, node string) *Cluster {
	t.Helper()
	pkiDir := t.TempDir()
	// The cluster CA signs the controller-manager's and the scheduler's client certificates.
	// testenv also gives the apiserver its kubelet client certificate (KubeletClientCAFile) and
	// has it dial nodes at their InternalIP: conformance-node resolves nowhere.
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{Nodes: []string{node}, ClusterCA: true})
	c := &Cluster{ControlPlane: cp}

	// The apiserver's serving certificate: the root CA the controller-manager publishes in
	// every namespace (kube-root-ca.crt) for pods' service account tokens.
	rootCA := filepath.Join(pkiDir, "apiserver-ca.crt")
	if err := os.WriteFile(rootCA, cp.CAData(), 0o644); err != nil {
		t.Fatal(err)
	}
	c.AdminKubeconfig = c.writeKubeconfig(t, pkiDir, "admin", &clientcmdapi.AuthInfo{Token: cp.AdminConfig.BearerToken})

	kcmConfig := c.clientKubeconfig(t, pkiDir, "kube-controller-manager", "system:kube-controller-manager")
	kcm := testenv.NewProcess("kube-controller-manager", filepath.Join(cp.Dir, "kube-controller-manager.log"),
		testenv.KubeControllerManagerPath(),
		"--kubeconfig="+kcmConfig,
		"--authentication-kubeconfig="+kcmConfig,
		"--authorization-kubeconfig="+kcmConfig,
		"--secure-port=0",
		"--leader-elect=false",
		// Each controller with its own service account, as kubeadm runs it: RBAC's bootstrap
		// roles are written for that.
		"--use-service-account-credentials=true",
		// The key the apiserver verifies service account tokens with (test/testenv writes
		// it in the control plane's directory).
		"--service-account-private-key-file="+filepath.Join(cp.Dir, "service-account.key"),
		"--root-ca-file="+rootCA,
		"--controllers=*",
	)
	startDaemon(t, kcm)

	schedConfig := c.clientKubeconfig(t, pkiDir, "kube-scheduler", "system:kube-scheduler")
	sched := testenv.NewProcess("kube-scheduler", filepath.Join(cp.Dir, "kube-scheduler.log"),
		testenv.KubeSchedulerPath(),
		"--kubeconfig="+schedConfig,
		"--authentication-kubeconfig="+schedConfig,
		"--authorization-kubeconfig="+schedConfig,
		"--secure-port=0",
		"--leader-elect=false",
	)
	startDaemon(t, sched)
	return c
}

// startDaemon starts p and stops it when t ends; its log tail is printed if t failed.
func startDaemon(t testing.TB, p *testenv.Process) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log tail:\n%s", filepath.Base(p.LogPath()), p.LogTail(40))
		}
		if err := p.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Errorf("stop %s: %v", filepath.Base(p.LogPath()), err)
		}
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
}

// clientKubeconfig issues a client certificate for user and writes a kubeconfig using it.
func (c *Cluster) clientKubeconfig(t testing.TB, dir, name, user string) string {
	t.Helper()
	certFile, keyFile, err := c.ClusterCA.IssueClient(dir, name, user)
	if err != nil {
		t.Fatal(err)
	}
	return c.writeKubeconfig(t, dir, name, &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile})
}

func (c *Cluster) writeKubeconfig(t testing.TB, dir, name string, auth *clientcmdapi.AuthInfo) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["conformance"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData()}
	cfg.AuthInfos[name] = auth
	cfg.Contexts["conformance"] = &clientcmdapi.Context{Cluster: "conformance", AuthInfo: name}
	cfg.CurrentContext = "conformance"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
