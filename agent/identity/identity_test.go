package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/holdfast-dev/holdfast/agent/identity/certificate"
)

// testCA signs node client certificates for the unit tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now().Add(-24 * time.Hour), NotAfter: time.Now().Add(50 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a node client certificate and key (PEM) valid from notBefore to notAfter.
func (ca *testCA) issue(t *testing.T, node string, serial int64, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.sign(t, &x509.Certificate{SerialNumber: big.NewInt(serial),
		Subject:   pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// sign returns the certificate of tmpl, signed by ca, for a new key, and the key (PEM).
func (ca *testCA) sign(t *testing.T, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// bootstrapKubeconfig writes a bootstrap kubeconfig naming an apiserver nobody listens on: the
// gateway is offline.
func bootstrapKubeconfig(t *testing.T, dir string, ca *testCA) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", CertificateAuthorityData: ca.pem}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "abcdef.0123456789abcdef"}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	path := filepath.Join(dir, "bootstrap-kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// A gateway without an RTC battery boots with its clock years behind: its certificate's
// NotBefore is "in the future". The certificate is kept and presented all the same, nothing is
// deleted, and no bootstrap is attempted (the token may be long gone).
func TestClockBehindKeepsCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	pki := filepath.Join(dir, "pki")
	store, err := certificate.NewFileStore(PairPrefix, pki, pki, "", "")
	if err != nil {
		t.Fatal(err)
	}
	issued := time.Now().Add(365 * 24 * time.Hour) // the clock is a year behind the CA's
	certPEM, keyPEM := ca.issue(t, "gw-1", 42, issued, issued.Add(365*24*time.Hour))
	if _, err := store.Update(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	id, err := New(Options{NodeName: "gw-1", Kubeconfig: kubeconfig, BootstrapKubeconfig: bootstrapKubeconfig(t, dir, ca), PKIDir: pki})
	if err != nil {
		t.Fatal(err)
	}
	cur := id.Current()
	if cur == nil || cur.SerialNumber.Int64() != 42 {
		t.Fatalf("current certificate %v, want the stored one (serial 42)", cur)
	}
	if c := id.Condition(); c.Status != v1.ConditionFalse || c.Reason != ReasonValid {
		t.Errorf("condition %+v, want False/%s", c, ReasonValid)
	}
	if b, err := os.ReadFile(filepath.Join(pki, PairPrefix+"-current.pem")); err != nil || !strings.Contains(string(b), strings.TrimSpace(string(certPEM))) {
		t.Errorf("the stored pair changed or went away: %v", err)
	}
	// Clients present it in their handshakes.
	tr, ok := id.RESTConfig().Transport.(*http.Transport)
	if !ok {
		t.Fatalf("transport %T", id.RESTConfig().Transport)
	}
	presented, err := tr.TLSClientConfig.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || presented.Leaf == nil || presented.Leaf.SerialNumber.Int64() != 42 {
		t.Errorf("handshake presents %+v (%v), want serial 42", presented, err)
	}
	// The node kubeconfig names the pair, for operators and tools; 0600.
	fi, err := os.Stat(kubeconfig)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig: %v %v", fi, err)
	}
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	auth := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
	if want, _ := filepath.Abs(filepath.Join(pki, PairPrefix+"-current.pem")); auth.ClientCertificate != want || auth.ClientKey != want {
		t.Errorf("kubeconfig names %q/%q, want %q", auth.ClientCertificate, auth.ClientKey, want)
	}
}

// No certificate yet: handshakes present none (the request is refused, not sent with stale
// credentials), the condition is Unknown, and the kubeconfig is written all the same.
func TestNoCertificateYet(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	id, err := New(Options{NodeName: "gw-1", Kubeconfig: filepath.Join(dir, "kubeconfig"), BootstrapKubeconfig: bootstrapKubeconfig(t, dir, ca), PKIDir: filepath.Join(dir, "pki")})
	if err != nil {
		t.Fatal(err)
	}
	if id.Current() != nil {
		t.Fatal("a certificate out of nowhere")
	}
	if c := id.Condition(); c.Status != v1.ConditionUnknown {
		t.Errorf("condition %+v, want Unknown", c)
	}
	tr := id.RESTConfig().Transport.(*http.Transport)
	presented, err := tr.TLSClientConfig.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || len(presented.Certificate) != 0 {
		t.Errorf("presented %+v (%v), want no certificate", presented, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "pki"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("pki dir: %v %v, want 0700", fi, err)
	}
}

func TestCondition(t *testing.T) {
	now := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	cert := func(notBefore, notAfter time.Time) *x509.Certificate {
		return &x509.Certificate{NotBefore: notBefore, NotAfter: notAfter}
	}
	day := 24 * time.Hour
	for _, tc := range []struct {
		name   string
		cert   *x509.Certificate
		status v1.ConditionStatus
		reason string
	}{
		{"none yet", nil, v1.ConditionUnknown, ReasonNone},
		{"fresh year", cert(now.Add(-day), now.Add(364*day)), v1.ConditionFalse, ReasonValid},
		{"year, 8 days left", cert(now.Add(-357*day), now.Add(8*day)), v1.ConditionFalse, ReasonValid},
		{"year, 6 days left", cert(now.Add(-359*day), now.Add(6*day)), v1.ConditionTrue, ReasonExpiring},
		{"hour, 7 minutes left", cert(now.Add(-53*time.Minute), now.Add(7*time.Minute)), v1.ConditionFalse, ReasonValid},
		{"hour, 5 minutes left", cert(now.Add(-55*time.Minute), now.Add(5*time.Minute)), v1.ConditionTrue, ReasonExpiring},
		{"expired", cert(now.Add(-2*day), now.Add(-time.Second)), v1.ConditionTrue, ReasonExpired},
		{"clock behind NotBefore", cert(now.Add(300*day), now.Add(665*day)), v1.ConditionFalse, ReasonValid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := conditionFor(tc.cert, now)
			if c.Type != ConditionType || c.Status != tc.status || c.Reason != tc.reason || c.Message == "" {
				t.Errorf("got %+v, want %s/%s", c, tc.status, tc.reason)
			}
		})
	}
}
