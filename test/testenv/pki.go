package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// caLifetime is long enough that no test outlives a certificate: the controller-manager's
// signer cuts the certificates it issues at its CA's expiry.
const caLifetime = 10 * 365 * 24 * time.Hour

// CA is a certificate authority made for one test: the cluster CA (ControlPlaneOptions.ClusterCA),
// the CA of the apiserver's kubelet client certificate, a test registry's.
type CA struct {
	// CertFile and KeyFile hold the CA's certificate and its private key (PEM, PKCS #8).
	CertFile, KeyFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA called commonName and writes it to dir/NAME.crt and dir/NAME.key.
func NewCA(dir, name, commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", name, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key"), cert: cert, key: key}
	if err := writeKeyPair(ca.CertFile, ca.KeyFile, der, key); err != nil {
		return nil, fmt.Errorf("CA %s: %w", name, err)
	}
	return ca, nil
}

// IssueClient writes a client certificate for user (its CN) in groups (its O), and its key, to
// dir/NAME.crt and dir/NAME.key, and returns their paths.
func (ca *CA) IssueClient(dir, name, user string, groups ...string) (certFile, keyFile string, err error) {
	return ca.issue(dir, name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// IssueServing writes a serving certificate for ips and dnsNames (the first name, or the first
// address, is its CN), and its key, to dir/NAME.crt and dir/NAME.key, and returns their paths.
func (ca *CA) IssueServing(dir, name string, ips []net.IP, dnsNames []string) (certFile, keyFile string, err error) {
	cn := ""
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	} else if len(ips) > 0 {
		cn = ips[0].String()
	}
	return ca.issue(dir, name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		IPAddresses: ips,
		DNSNames:    dnsNames,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

func (ca *CA) issue(dir, name string, tmpl *x509.Certificate) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	if tmpl.SerialNumber, err = randomSerial(); err != nil {
		return "", "", err
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), ca.cert.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writeKeyPair(certFile, keyFile, der, key); err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	return certFile, keyFile, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

// writeKeyPair writes a certificate (readable by all: it is public) and its key (owner only).
func writeKeyPair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}
