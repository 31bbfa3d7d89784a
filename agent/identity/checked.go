package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/holdfast-dev/holdfast/agent/identity/certificate"
)

// checkedStore keeps a node certificate only if it is for this node and for its use. client-go's
// certificate manager stores whatever certificate the CSR's status holds, and the store loads
// whatever pair the PKI directory holds: a signer that answers with another node's certificate
// (misconfigured, or an attacker's), or a PKI directory copied from another gateway, would make
// this node act as that one. A refused certificate is not stored (the manager asks again, as on
// any failure) and a refused stored one counts as none (a new one is requested); refused is
// told each time, to say so where an operator looks.
type checkedStore struct {
	certificate.Store
	check   func(*x509.Certificate) error
	refused func(error)
}

func (s *checkedStore) Current() (*tls.Certificate, error) {
	cert, err := s.Store.Current()
	if err != nil {
		return nil, err
	}
	if err := s.check(cert.Leaf); err != nil {
		err = fmt.Errorf("the stored certificate is not used: %w", err)
		s.refused(err)
		none := certificate.NoCertKeyError(err.Error())
		return nil, &none
	}
	return cert, nil
}

func (s *checkedStore) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the issued certificate and its key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("the issued certificate: %w", err)
	}
	if err := s.check(leaf); err != nil {
		err = fmt.Errorf("the issued certificate is refused: %w", err)
		s.refused(err)
		return nil, err
	}
	return s.Store.Update(certPEM, keyPEM)
}

// checkNodeCertificate checks that leaf is system:node:NAME in system:nodes, for usage.
func checkNodeCertificate(leaf *x509.Certificate, nodeName string, usage x509.ExtKeyUsage) error {
	if want := "system:node:" + nodeName; leaf.Subject.CommonName != want {
		return fmt.Errorf("it names %q, not this node (%q)", leaf.Subject.CommonName, want)
	}
	if !slices.Contains(leaf.Subject.Organization, "system:nodes") {
		return fmt.Errorf("its organizations %v lack system:nodes", leaf.Subject.Organization)
	}
	// No extended key usage, or any, allows every use (RFC 5280), as Go's verification has it.
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, usage) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return fmt.Errorf("its extended key usages %v lack %s", leaf.ExtKeyUsage, usageName(usage))
	}
	return nil
}

// checkServingNames checks that leaf's DNS names are the node's name or its host name. Its
// addresses are not checked: a gateway's change with DHCP or a failover between the request
// and its approval, or before a restart, would otherwise throw away a certificate the cluster
// approved by hand (the manager asks for a new one when the addresses change).
func checkServingNames(leaf *x509.Certificate, names []string) error {
	for _, n := range leaf.DNSNames {
		if !slices.ContainsFunc(names, func(m string) bool { return strings.EqualFold(m, n) }) {
			return fmt.Errorf("it names %q, which is not this node's (%v)", n, names)
		}
	}
	if len(leaf.EmailAddresses) > 0 || len(leaf.URIs) > 0 {
		return errors.New("it names e-mail addresses or URIs, which a node's serving certificate does not")
	}
	return nil
}

func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageClientAuth:
		return "client auth"
	case x509.ExtKeyUsageServerAuth:
		return "server auth"
	}
	return fmt.Sprintf("usage %d", u)
}

// clientStore is files checked for the node's client certificate.
func clientStore(files certificate.Store, nodeName string, refused func(error)) certificate.Store {
	return &checkedStore{Store: files, refused: refused, check: func(leaf *x509.Certificate) error {
		return checkNodeCertificate(leaf, nodeName, x509.ExtKeyUsageClientAuth)
	}}
}

// servingStore is files checked for the node API's serving certificate: this node's, for
// server auth, naming no host but the node and its host name.
func servingStore(files certificate.Store, nodeName string, refused func(error)) certificate.Store {
	return &checkedStore{Store: files, refused: refused, check: func(leaf *x509.Certificate) error {
		if err := checkNodeCertificate(leaf, nodeName, x509.ExtKeyUsageServerAuth); err != nil {
			return err
		}
		return checkServingNames(leaf, servingNames(nodeName))
	}}
}
