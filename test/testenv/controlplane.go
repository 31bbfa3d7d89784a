package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// startTimeout bounds how long a daemon may take to become ready. Generous: under
// `go test -race ./...` several packages start control planes on two cores at once.
const startTimeout = 2 * time.Minute

// pollInterval is how often readiness is polled.
const pollInterval = 50 * time.Millisecond

// ControlPlaneOptions configures StartControlPlane.
type ControlPlaneOptions struct {
	// Nodes are node names that get a token each, authenticating as user system:node:NAME in
	// group system:nodes: the identity a kubelet has, limited by the Node authorizer and the
	// NodeRestriction admission plugin. See NodeConfig and WriteNodeKubeconfig. Defaults to none.
	Nodes []string
	// ServiceClusterIPRange is passed to --service-cluster-ip-range. Defaults to 10.0.0.0/24.
	ServiceClusterIPRange string
	// ExtraAPIServerArgs are appended to kube-apiserver's command line (a later flag wins).
	ExtraAPIServerArgs []string
	// ClusterCA makes a cluster CA (ControlPlane.ClusterCA) whose certificates the apiserver accepts as
	// client certificates (--client-ca-file), and StartControllerManager's signer signs with.
	ClusterCA bool
	// BootstrapTokenAuth enables bootstrap token authentication (see CreateBootstrapToken).
	BootstrapTokenAuth bool
	// Konnectivity starts a konnectivity server (ControlPlane.Konnectivity) and sends the
	// apiserver's "cluster" egress, its connections to nodes included, through it.
	Konnectivity bool
}

// ControlPlane is an etcd and a kube-apiserver serving on loopback, private to one test, with
// token authentication, Node and RBAC authorization and NodeRestriction admission. No
// controller-manager or scheduler runs: place pods by setting spec.nodeName. The namespace
// default has its default ServiceAccount, so pods can be created there.
type ControlPlane struct {
	// Host is the apiserver's URL, https://127.0.0.1:PORT. The port stays the same across
	// Stop and Start.
	Host string
	// AdminConfig authenticates as an admin (group system:masters). Copy it before changing it.
	AdminConfig *rest.Config
	// Admin is a clientset for AdminConfig.
	Admin kubernetes.Interface
	// Dir holds the control plane's files: etcd data, certificates, tokens, logs.
	Dir string
	// ClusterCA is the cluster CA of ControlPlaneOptions.ClusterCA (nil without it): the
	// apiserver trusts the client certificates it signs, and StartControllerManager's signer
	// signs with it.
	ClusterCA *CA
	// Konnectivity is the konnectivity server of ControlPlaneOptions.Konnectivity (nil without
	// it): node agents reach the apiserver's node traffic through it.
	Konnectivity *Konnectivity

	t          testing.TB
	etcd       *Process
	apiserver  *Process
	adminToken string
	caData     []byte            // the apiserver's self-signed serving certificate chain
	kubeletCA  *CA               // signs the apiserver's kubelet client certificate
	nodeTokens map[string]string // node name -> bearer token
}

// StartControlPlane starts etcd and kube-apiserver for t and stops them when t ends. It fails
// t if they do not become ready within a couple of minutes, printing the tail of their logs.
func StartControlPlane(t testing.TB, opts ControlPlaneOptions) *ControlPlane {
	t.Helper()
	RequireIntegration(t)
	start := time.Now()

	dir := t.TempDir()
	cp := &ControlPlane{Dir: dir, t: t, nodeTokens: map[string]string{}}

	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	etcdClientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.Host = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	cp.etcd = NewProcess("etcd", filepath.Join(dir, "etcd.log"), EtcdPath(),
		"--name=default",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdClientURL,
		"--advertise-client-urls="+etcdClientURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=default="+etcdPeerURL,
		// Test data does not need to survive a power cut; fsync would dominate on a loaded disk.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	t.Cleanup(func() {
		if err := cp.etcd.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Errorf("control plane cleanup: %v", err)
		}
	})
	logTailOnFailure(t, cp.etcd)
	if err := cp.etcd.Start(); err != nil {
		t.Fatalf("start control plane: %v", err)
	}

	adminToken := randomToken()
	tokens := []string{csvLine(adminToken, "admin", "admin", "system:masters")}
	for _, node := range opts.Nodes {
		if _, dup := cp.nodeTokens[node]; dup {
			t.Fatalf("start control plane: node %q listed twice", node)
		}
		cp.nodeTokens[node] = randomToken()
		tokens = append(tokens, csvLine(cp.nodeTokens[node], "system:node:"+node, "node-"+node, "system:nodes"))
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		t.Fatalf("start control plane: write token file: %v", err)
	}
	saKeyFile := filepath.Join(dir, "service-account.key")
	if err := writeRSAKey(saKeyFile); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	serviceRange := opts.ServiceClusterIPRange
	if serviceRange == "" {
		serviceRange = "10.0.0.0/24"
	}
	certDir := filepath.Join(dir, "apiserver-certs")
	args := []string{
		KubeAPIServerPath(),
		"--etcd-servers=" + etcdClientURL,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + certDir, // it writes a self-signed apiserver.crt/key there and keeps them across restarts
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKeyFile,
		"--service-account-signing-key-file=" + saKeyFile,
		"--service-cluster-ip-range=" + serviceRange,
		"--allow-privileged=true",
		"--profiling=false",
	}
	clusterArgs, err := cp.clusterArgs(opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	args = append(args, clusterArgs...)
	kubeletArgs, err := cp.kubeletClientArgs()
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	args = append(args, kubeletArgs...)
	if opts.Konnectivity {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		egressArgs, err := cp.startKonnectivity(ctx)
		cancel()
		if err != nil {
			t.Fatalf("start control plane: %v", err)
		}
		args = append(args, egressArgs...)
	}
	args = append(args, opts.ExtraAPIServerArgs...)
	cp.apiserver = NewProcess("kube-apiserver", filepath.Join(dir, "kube-apiserver.log"), args...)
	t.Cleanup(func() {
		if err := cp.apiserver.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Errorf("control plane cleanup: %v", err)
		}
	})
	logTailOnFailure(t, cp.apiserver)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitEtcd(ctx, etcdClientURL, cp.etcd); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	if err := cp.apiserver.Start(); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	cp.adminToken = adminToken
	if err := cp.waitReady(ctx); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	// The apiserver wrote its self-signed serving certificate before it started serving, and
	// keeps it across restarts: it is the CA its clients trust.
	caData, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		t.Fatalf("start control plane: read the apiserver's serving certificate: %v", err)
	}
	cp.caData = caData
	cp.AdminConfig = cp.tokenConfig(adminToken)
	cp.Admin, err = kubernetes.NewForConfig(cp.AdminConfig)
	if err != nil {
		t.Fatalf("start control plane: admin client: %v", err)
	}
	if err := cp.createDefaultServiceAccount(ctx); err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Logf("control plane ready at %s in %v (files in %s)", cp.Host, time.Since(start).Round(time.Millisecond), dir)
	return cp
}

// Stop stops the apiserver, leaving etcd and every object in it, so a test can take the
// control plane out of a node's reach. SIGTERM first, as an orderly shutdown would; clients see
// their connections close and new ones refused.
func (cp *ControlPlane) Stop() {
	cp.t.Helper()
	if err := cp.apiserver.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		cp.t.Fatalf("stop apiserver: %v", err)
	}
}

// Start starts the apiserver again after Stop, on the same port with the same etcd, tokens and
// serving certificate, and waits until it is ready.
func (cp *ControlPlane) Start() {
	cp.t.Helper()
	if err := cp.apiserver.Start(); err != nil {
		cp.t.Fatalf("restart apiserver: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := cp.waitReady(ctx); err != nil {
		cp.t.Fatalf("restart apiserver: %v", err)
	}
}

// Running reports whether the apiserver is running (between Start and Stop).
func (cp *ControlPlane) Running() bool { return cp.apiserver.Running() }

// APIServerPid and EtcdPid are the processes' ids, for measuring what they use (/proc).
func (cp *ControlPlane) APIServerPid() int { return cp.apiserver.Pid() }

// EtcdPid: see APIServerPid.
func (cp *ControlPlane) EtcdPid() int { return cp.etcd.Pid() }

// CAData returns the PEM certificates that verify the apiserver's serving certificate.
func (cp *ControlPlane) CAData() []byte { return slices.Clone(cp.caData) }

// NodeToken returns the bearer token of a node listed in ControlPlaneOptions.Nodes, failing
// the test for any other name.
func (cp *ControlPlane) NodeToken(name string) string {
	cp.t.Helper()
	token, ok := cp.nodeTokens[name]
	if !ok {
		cp.t.Fatalf("node %q has no token: list it in ControlPlaneOptions.Nodes", name)
	}
	return token
}

// NodeConfig returns a client config authenticating as node name (user system:node:NAME,
// group system:nodes). The node must be listed in ControlPlaneOptions.Nodes.
func (cp *ControlPlane) NodeConfig(name string) *rest.Config {
	cp.t.Helper()
	return cp.tokenConfig(cp.NodeToken(name))
}

// WriteNodeKubeconfig writes a kubeconfig for node name to a new file in the test's directory
// and returns its path. It embeds the apiserver's CA and the node's token, so the file is all a
// node agent needs. The node must be listed in ControlPlaneOptions.Nodes.
func (cp *ControlPlane) WriteNodeKubeconfig(name string) string {
	cp.t.Helper()
	return cp.writeKubeconfig(name, cp.NodeToken(name))
}

// WriteAdminKubeconfig writes a kubeconfig for the admin of AdminConfig (group
// system:masters) to a new file in the test's directory and returns its path: what kubectl
// is given (KUBECONFIG) to act as a cluster operator.
func (cp *ControlPlane) WriteAdminKubeconfig() string {
	cp.t.Helper()
	return cp.writeKubeconfig("admin", cp.AdminConfig.BearerToken)
}

func (cp *ControlPlane) writeKubeconfig(name, token string) string {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: cp.CAData()}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: name}
	cfg.CurrentContext = "testenv"
	f, err := os.CreateTemp(cp.Dir, "kubeconfig-"+name+"-*")
	if err != nil {
		cp.t.Fatalf("write kubeconfig for node %q: %v", name, err)
	}
	path := f.Name()
	f.Close()
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		cp.t.Fatalf("write kubeconfig for node %q: %v", name, err)
	}
	return path
}

func (cp *ControlPlane) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CAData()},
		// Tests create objects in bursts; client-side throttling would only slow them down.
		QPS:   200,
		Burst: 400,
	}
}

// waitReady polls /readyz as admin until it answers ok, failing early if the apiserver exits.
// It does not verify the serving certificate: on the first start the certificate file may be
// half-written until the apiserver serves.
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	httpClient := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer httpClient.CloseIdleConnections()
	err := poll(ctx, cp.apiserver, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.Host+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cp.adminToken)
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
			return fmt.Errorf("/readyz: %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for kube-apiserver /readyz: %w", err)
	}
	return nil
}

// createDefaultServiceAccount does what the service account controller would: without it,
// creating a pod in namespace default is refused.
func (cp *ControlPlane) createDefaultServiceAccount(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	err := poll(ctx, cp.apiserver, func(ctx context.Context) error {
		_, err := cp.Admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err // namespace default may not exist for a moment after /readyz
	})
	if err != nil {
		return fmt.Errorf("create ServiceAccount default/default: %w", err)
	}
	return nil
}

// poll calls check until it returns nil, ctx ends, or p (if not nil) exits. The error says
// which, with check's last error.
func poll(ctx context.Context, p *Process, check func(context.Context) error) error {
	var exited <-chan struct{}
	if p != nil {
		exited = p.exitedChan()
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-exited:
			return fmt.Errorf("%w (last error: %v)", p.ExitError(), err)
		case <-ticker.C:
		}
	}
}

// waitEtcd polls etcd's /health until it reports healthy.
func waitEtcd(ctx context.Context, clientURL string, etcd *Process) error {
	client := &http.Client{Timeout: 2 * time.Second}
	err := poll(ctx, etcd, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("/health: %s %s", resp.Status, body)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for etcd: %w", err)
	}
	return nil
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago. All listeners
// are held until every port is chosen, so the n are distinct.
func freePorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b)
}

// csvLine is one line of the apiserver's --token-auth-file: token,user,uid,"group1,group2".
func csvLine(token, user, uid string, groups ...string) string {
	return fmt.Sprintf("%s,%s,%s,%q", token, user, uid, strings.Join(groups, ","))
}

// rsaKeyOnce shares one service account key among the control planes of a test binary:
// generating RSA keys is slow under -race and the key protects nothing.
var rsaKeyOnce = sync.OnceValues(func() ([]byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode service account key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
})

func writeRSAKey(path string) error {
	data, err := rsaKeyOnce()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write service account key: %w", err)
	}
	return nil
}
