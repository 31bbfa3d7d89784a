package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/identity"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// bootstrapEnv is a cluster set up as kubeadm sets one up for node TLS bootstrap (bootstrap
// token auth, the cluster CA trusted for client certificates, kube-controller-manager's CSR
// approver and signer, a bootstrap token with kubeadm's RBAC bindings) and an agent given only
// a bootstrap kubeconfig. It returns the token's ID.
func bootstrapEnv(t *testing.T, signingDuration time.Duration, tune ...func(*config.Config)) (*env, string) {
	t.Helper()
	var tokenID string
	e := startEnvFor(t, &testenv.ControlPlaneOptions{ClusterCA: true, BootstrapTokenAuth: true}, func(e *env, c *config.Config) {
		e.cp.StartControllerManager(testenv.ControllerManagerOptions{ClusterSigningDuration: signingDuration})
		token := e.cp.CreateBootstrapToken()
		tokenID, _, _ = strings.Cut(token, ".")
		c.BootstrapKubeconfig = e.cp.WriteBootstrapKubeconfig(token)
		quickBackoff(c)
		c.NodeStatus.UpdateFrequency = config.D(time.Second)
		for _, f := range tune {
			f(c)
		}
	}, nil)
	return e, tokenID
}

// nodeCSRs returns the node client CSRs in the cluster, oldest first.
func nodeCSRs(t *testing.T, e *env) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	list, err := e.cp.Admin.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range list.Items {
		if csr.Spec.SignerName == certificatesv1.KubeAPIServerClientKubeletSignerName {
			out = append(out, csr)
		}
	}
	return out
}

// currentCert reads the agent's current certificate from its state dir, checking the files'
// permissions on the way.
func currentCert(t *testing.T, e *env) *x509.Certificate {
	t.Helper()
	path := filepath.Join(e.agent.Config.StateDir, "pki", identity.PairPrefix+"-current.pem")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("the node certificate: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600 (it holds the private key)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// nodeEvents returns the reasons of the Events about the Node.
func nodeEvents(t *testing.T, e *env) []string {
	t.Helper()
	list, err := e.cp.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == node {
			out = append(out, ev.Reason)
		}
	}
	return out
}

// TestTLSBootstrap: an agent with only a bootstrap token joins the cluster as kubelets do:
// its CSR (signer kube-apiserver-client-kubelet, CN system:node:NAME, O system:nodes) is
// approved by kube-controller-manager's approver and signed; the key and certificate land in
// the state dir (0600), the node kubeconfig is written pointing at them, and the agent is the
// node: registered, Ready, running pods, an Event saying so and the expiry condition False.
// Then, with the token deleted and the apiserver down, a restarted agent keeps its certificate
// and its pods, and on reconnect is Ready again without a new CSR.
func TestTLSBootstrap(t *testing.T) {
	e, tokenID := bootstrapEnv(t, 0)
	ctx := context.Background()

	testenv.Eventually(t, 2*time.Minute, "the node's CSR issued", func() error {
		csrs := nodeCSRs(t, e)
		if len(csrs) != 1 {
			return fmt.Errorf("%d node client CSRs", len(csrs))
		}
		if len(csrs[0].Status.Certificate) == 0 {
			return fmt.Errorf("CSR %s not issued yet: %+v", csrs[0].Name, csrs[0].Status.Conditions)
		}
		return nil
	})
	csr := nodeCSRs(t, e)[0]
	if want := "system:bootstrap:" + tokenID; csr.Spec.Username != want {
		t.Errorf("CSR requested by %q, want the bootstrap token's user %q", csr.Spec.Username, want)
	}
	e.waitNodeReady(t)
	cert := currentCert(t, e)
	if cert.Subject.CommonName != "system:node:"+node || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("certificate subject %s, want CN=system:node:%s, O=system:nodes", cert.Subject, node)
	}
	// Not set in the configuration: it defaults to <stateDir>/kubeconfig.
	kc, err := clientcmd.LoadFromFile(filepath.Join(e.agent.Config.StateDir, "kubeconfig"))
	if err != nil {
		t.Fatalf("the node kubeconfig: %v", err)
	}
	if auth := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]; !strings.HasSuffix(auth.ClientCertificate, identity.PairPrefix+"-current.pem") || auth.Token != "" {
		t.Errorf("node kubeconfig authenticates with %+v, want the current certificate", auth)
	}

	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, sleeperPod("joined", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.waitAPIRunning(t, "joined")["joined"].Status.ContainerStatuses[0]
	testenv.Eventually(t, time.Minute, "an Event about the certificate and the expiry condition", func() error {
		if evs := nodeEvents(t, e); !slices.Contains(evs, "ClientCertificateIssued") {
			return fmt.Errorf("node events %v", evs)
		}
		n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == identity.ConditionType {
				if c.Status != v1.ConditionFalse {
					return fmt.Errorf("condition %+v, want False", c)
				}
				return nil
			}
		}
		return fmt.Errorf("no %s condition in %+v", identity.ConditionType, n.Status.Conditions)
	})

	// Offline restart: the token is gone (operators delete them), the apiserver is down.
	if err := e.cp.Admin.CoreV1().Secrets("kube-system").Delete(ctx, "bootstrap-token-"+tokenID, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.cp.Stop()
	e.agent.Kill()
	e.agent.Start()
	testenv.Eventually(t, 2*time.Minute, "the agent restored its pod offline", func() error {
		views, err := e.agent.Pods(ctx)
		if err != nil {
			return err
		}
		for _, p := range views {
			if p.Name == "joined" {
				return nil
			}
		}
		return fmt.Errorf("pods %+v", views)
	})
	if got := currentCert(t, e); got.SerialNumber.Cmp(cert.SerialNumber) != 0 {
		t.Errorf("certificate changed offline: serial %s -> %s", cert.SerialNumber, got.SerialNumber)
	}
	e.cp.Start()
	e.waitNodeReady(t)
	after := e.waitAPIRunning(t, "joined")["joined"].Status.ContainerStatuses[0]
	if after.ContainerID != before.ContainerID {
		t.Errorf("the pod's container changed across the restart: %s -> %s", before.ContainerID, after.ContainerID)
	}
	if csrs := nodeCSRs(t, e); len(csrs) != 1 {
		t.Errorf("%d node client CSRs after the restart, want the first one only", len(csrs))
	}
}

// TestClientCertificateRotation: with certificates signed for 2m30s (plus the signer's 5
// minutes of backdating), the agent renews its certificate at 70-90% of the lifetime with a CSR
// authenticated by the certificate itself (approved as selfnodeclient), switches to the new
// one, says so in an Event, and the node stays Ready with its Lease renewed under the new
// identity.
func TestClientCertificateRotation(t *testing.T) {
	e, _ := bootstrapEnv(t, 150*time.Second)
	ctx := context.Background()
	e.waitNodeReady(t)
	first := currentCert(t, e)

	testenv.Eventually(t, 4*time.Minute, "a renewed certificate in use", func() error {
		if cur := currentCert(t, e); cur.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return fmt.Errorf("still serial %s (NotAfter %s)", cur.SerialNumber, cur.NotAfter)
		}
		return nil
	})
	renewed := time.Now()
	csrs := nodeCSRs(t, e)
	if len(csrs) < 2 {
		t.Fatalf("%d node client CSRs, want the bootstrap one and a renewal", len(csrs))
	}
	var renewal *certificatesv1.CertificateSigningRequest
	for i := range csrs {
		if csrs[i].Spec.Username == "system:node:"+node {
			renewal = &csrs[i]
		}
	}
	if renewal == nil {
		t.Fatalf("no CSR requested by system:node:%s (the renewal authenticates with the current certificate)", node)
	}
	testenv.Eventually(t, time.Minute, "ClientCertificateRenewed event", func() error {
		if evs := nodeEvents(t, e); !slices.Contains(evs, "ClientCertificateRenewed") {
			return fmt.Errorf("node events %v", evs)
		}
		return nil
	})
	testenv.Eventually(t, time.Minute, "Lease renewed after the rotation", func() error {
		l, err := e.cp.Admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(renewed.Add(time.Second)) {
			return fmt.Errorf("lease renewed at %v", l.Spec.RenewTime)
		}
		return nil
	})
	e.waitNodeReady(t)
}

// TestServingCertificateByCSR: with serverTLSBootstrap the node API serves its self-signed
// certificate until the cluster approves the node's kubernetes.io/kubelet-serving CSR (made
// with the node's own identity, for its name and InternalIP), then the issued one, signed by
// the cluster CA, without a restart.
func TestServingCertificateByCSR(t *testing.T) {
	e, _ := bootstrapEnv(t, 0, func(c *config.Config) { c.ServerTLSBootstrap = true })
	ctx := context.Background()
	n := e.waitNodeReady(t)
	var nodeIP string
	for _, a := range n.Status.Addresses {
		if a.Type == v1.NodeInternalIP {
			nodeIP = a.Address
		}
	}
	addr := net.JoinHostPort(nodeIP, strconv.Itoa(e.agent.Config.NodeAPIPort()))
	served := func() (*x509.Certificate, error) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	var csr certificatesv1.CertificateSigningRequest
	testenv.Eventually(t, 60*time.Second, "the node's serving CSR", func() error {
		list, err := e.cp.Admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, c := range list.Items {
			if c.Spec.SignerName == certificatesv1.KubeletServingSignerName {
				csr = c
				return nil
			}
		}
		return fmt.Errorf("none among %d CSRs", len(list.Items))
	})
	if csr.Spec.Username != "system:node:"+node {
		t.Errorf("serving CSR requested by %q, want the node's identity", csr.Spec.Username)
	}
	if cert, err := served(); err != nil || cert.Issuer.String() != cert.Subject.String() {
		t.Fatalf("before approval: %v, %v; want the self-signed certificate", cert, err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: v1.ConditionTrue, Reason: "TestApproval", Message: "approved by the test, as a cluster's approver would"})
	if _, err := e.cp.Admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, &csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(e.cp.ClusterCA.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	testenv.Eventually(t, 60*time.Second, "the issued certificate served", func() error {
		cert, err := served()
		if err != nil {
			return err
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: nodeIP, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("served %s: %w", cert.Subject, err)
		}
		return nil
	})
}
