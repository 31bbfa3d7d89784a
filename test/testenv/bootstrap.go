package testenv

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// BootstrapTokenGroup is the extra group kubeadm gives its node bootstrap tokens, which its
// RBAC bindings (and CreateBootstrapToken's) name.
const BootstrapTokenGroup = "system:bootstrappers:kubeadm:default-node-token"

// clusterArgs prepares what ControlPlaneOptions.ClusterCA and BootstrapTokenAuth ask for and
// returns kube-apiserver's flags for them.
func (cp *ControlPlane) clusterArgs(opts ControlPlaneOptions) ([]string, error) {
	var args []string
	if opts.ClusterCA {
		ca, err := NewCA(cp.Dir, "cluster-ca", "testenv-cluster-ca")
		if err != nil {
			return nil, err
		}
		cp.ClusterCA = ca
		args = append(args, "--client-ca-file="+ca.CertFile)
	}
	if opts.BootstrapTokenAuth {
		args = append(args, "--enable-bootstrap-token-auth=true")
	}
	return args, nil
}

// CreateBootstrapToken creates a bootstrap token as `kubeadm token create` does (a Secret
// bootstrap-token-ID in kube-system, usable for authentication, in BootstrapTokenGroup) and the
// RBAC bindings `kubeadm init` creates for node TLS bootstrap: the token's group may create
// CSRs (system:node-bootstrapper) and have node client CSRs auto-approved (nodeclient), and
// nodes may have their renewal CSRs auto-approved (selfnodeclient). It returns the token,
// "ID.SECRET". The apiserver needs ControlPlaneOptions.BootstrapTokenAuth.
func (cp *ControlPlane) CreateBootstrapToken() string {
	cp.t.Helper()
	id, secret := randomString(6), randomString(16)
	ctx := context.Background()
	_, err := cp.Admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id":                       id,
			"token-secret":                   secret,
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              BootstrapTokenGroup,
			"expiration":                     time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		cp.t.Fatalf("create bootstrap token: %v", err)
	}
	for name, b := range map[string]struct{ role, kind, subject string }{
		"kubeadm:kubelet-bootstrap":                     {"system:node-bootstrapper", rbacv1.GroupKind, BootstrapTokenGroup},
		"kubeadm:node-autoapprove-bootstrap":            {"system:certificates.k8s.io:certificatesigningrequests:nodeclient", rbacv1.GroupKind, BootstrapTokenGroup},
		"kubeadm:node-autoapprove-certificate-rotation": {"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", rbacv1.GroupKind, "system:nodes"},
	} {
		_, err := cp.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: b.kind, Name: b.subject}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			cp.t.Fatalf("create ClusterRoleBinding %s: %v", name, err)
		}
	}
	return id + "." + secret
}

// WriteBootstrapKubeconfig writes a kubeconfig with the apiserver's CA and a bootstrap token
// (see CreateBootstrapToken) to a new file in the control plane's directory and returns its path.
func (cp *ControlPlane) WriteBootstrapKubeconfig(token string) string {
	cp.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: cp.CAData()}
	cfg.AuthInfos["tls-bootstrap-token-user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["tls-bootstrap"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: "tls-bootstrap-token-user"}
	cfg.CurrentContext = "tls-bootstrap"
	f, err := os.CreateTemp(cp.Dir, "bootstrap-kubeconfig-*")
	if err != nil {
		cp.t.Fatal(err)
	}
	path := f.Name()
	f.Close()
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		cp.t.Fatalf("write bootstrap kubeconfig: %v", err)
	}
	return path
}

// ControllerManagerOptions configures StartControllerManager.
type ControllerManagerOptions struct {
	// Controllers is kube-controller-manager's --controllers. Defaults to the CSR approver and
	// signer: csrapproving,csrsigning.
	Controllers []string
	// ClusterSigningDuration is the lifetime of the certificates the signer issues (the signer
	// backdates NotBefore by 5 minutes on top). Defaults to kube-controller-manager's one year.
	ClusterSigningDuration time.Duration
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// StartControllerManager starts kube-controller-manager against the control plane, as admin,
// signing with the cluster CA (ControlPlaneOptions.ClusterCA is required), and stops it when
// the test ends. It waits until its /healthz answers.
func (cp *ControlPlane) StartControllerManager(opts ControllerManagerOptions) {
	cp.t.Helper()
	if cp.ClusterCA == nil {
		cp.t.Fatalf("start kube-controller-manager: the control plane has no cluster CA (set ControlPlaneOptions.ClusterCA)")
	}
	if err := checkExecutable(KubeControllerManagerPath()); err != nil {
		cp.t.Fatalf("start kube-controller-manager: %v (built by hack/build-tools.sh)", err)
	}
	kubeconfig := filepath.Join(cp.Dir, "kube-controller-manager.kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: cp.CAData()}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cp.adminToken}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: "admin"}
	cfg.CurrentContext = "testenv"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		cp.t.Fatalf("start kube-controller-manager: %v", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		cp.t.Fatalf("start kube-controller-manager: %v", err)
	}
	controllers := opts.Controllers
	if len(controllers) == 0 {
		controllers = []string{"csrapproving", "csrsigning"}
	}
	args := []string{
		KubeControllerManagerPath(),
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(cp.Dir, "kube-controller-manager-certs"),
		"--leader-elect=false",
		"--controllers=" + strings.Join(controllers, ","),
		"--cluster-signing-cert-file=" + cp.ClusterCA.CertFile,
		"--cluster-signing-key-file=" + cp.ClusterCA.KeyFile,
		"--profiling=false",
	}
	if opts.ClusterSigningDuration > 0 {
		args = append(args, "--cluster-signing-duration="+opts.ClusterSigningDuration.String())
	}
	args = append(args, opts.ExtraArgs...)
	proc := NewProcess("kube-controller-manager", filepath.Join(cp.Dir, "kube-controller-manager.log"), args...)
	cp.t.Cleanup(func() {
		if err := proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			cp.t.Errorf("stop kube-controller-manager: %v", err)
		}
	})
	logTailOnFailure(cp.t, proc)
	if err := proc.Start(); err != nil {
		cp.t.Fatalf("start kube-controller-manager: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer httpClient.CloseIdleConnections()
	err = poll(ctx, proc, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		cp.t.Fatalf("start kube-controller-manager: %v", err)
	}
}

// randomString returns n characters of [a-z0-9], the alphabet of bootstrap token IDs and secrets.
func randomString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}
