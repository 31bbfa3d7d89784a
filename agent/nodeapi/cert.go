package nodeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Serving certificate lifetime and renewal: a year, remade at start when less than a month is
// left, or when it does not name the node's current names and addresses.
const (
	servingCertLifetime = 365 * 24 * time.Hour
	servingCertRenewAt  = 30 * 24 * time.Hour
)

// Serving certificate files under the PKI directory (the kubelet's kubelet.crt/kubelet.key).
const (
	servingCertFile = "holdfast-serving.crt"
	servingKeyFile  = "holdfast-serving.key"
)

// servingCertificate returns the node API's self-signed serving certificate kept in dir,
// making (and keeping, 0600) a new one when there is none, it expires within a month, or its
// SANs miss one of names or ips. The apiserver does not verify it unless it is given
// --kubelet-certificate-authority; CSR-signed serving certificates are not implemented yet.
func servingCertificate(dir string, names []string, ips []net.IP, now time.Time) (tls.Certificate, error) {
	certPath, keyPath := filepath.Join(dir, servingCertFile), filepath.Join(dir, servingKeyFile)
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && c.Leaf != nil && covers(c.Leaf, names, ips, now) {
		return c, nil
	}
	certPEM, keyPEM, err := selfSigned(names, ips, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	if err := writeFileAtomic(keyPath, keyPEM); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	if err := writeFileAtomic(certPath, certPEM); err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

func covers(c *x509.Certificate, names []string, ips []net.IP, now time.Time) bool {
	if now.Before(c.NotBefore) || now.Add(servingCertRenewAt).After(c.NotAfter) {
		return false
	}
	for _, n := range names {
		if !slices.Contains(c.DNSNames, n) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func selfSigned(names []string, ips []net.IP, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate serial: %w", err)
	}
	cn := "holdfast"
	if len(names) > 0 {
		cn = names[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn + "@" + fmt.Sprint(now.Unix())},
		NotBefore:             now.Add(-time.Hour), // a gateway clock a little behind
		NotAfter:              now.Add(servingCertLifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // self-signed: it is its own CA, as the kubelet's
		DNSNames:              slices.Clone(names),
		IPAddresses:           slices.Clone(ips),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("serving key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// writeFileAtomic writes data to path (0600) through a synced temporary file and a rename.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
