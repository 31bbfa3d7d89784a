package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"net"
	"os"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/holdfast-dev/holdfast/agent/identity/certificate"
	"github.com/holdfast-dev/holdfast/agent/kube"
)

// ServingPrefix names the node API's serving certificate files in the PKI directory:
// holdfast-server-current.pem is a symlink to the pair in use.
const ServingPrefix = "holdfast-server"

// Serving is the node API's serving certificate as the kubelet's serverTLSBootstrap gets it:
// requested by CSR from the kubernetes.io/kubelet-serving signer, for the node's name and
// addresses, and renewed before it expires (when the addresses change too). The signer's CSRs
// are not approved by kube-controller-manager: the cluster approves them (an operator, or an
// approver such as kubelet-csr-approver). Until one is issued, Current is nil and the node
// API serves its self-signed certificate.
type Serving struct {
	mgr certificate.Manager
}

// NewServing loads the serving certificate kept in pkiDir and prepares its requests, made with
// client (the node's identity). addresses are the node's IPs, named in the certificate with
// the node name and the host name.
func NewServing(nodeName, pkiDir string, addresses func() []string, client kube.Interface, log *slog.Logger) (*Serving, error) {
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", pkiDir, err)
	}
	files, err := certificate.NewFileStoreWithLogger(klogFor(log), ServingPrefix, pkiDir, pkiDir, "", "")
	if err != nil {
		return nil, fmt.Errorf("serving certificate store in %s: %w", pkiDir, err)
	}
	store := servingStore(files, nodeName, func(err error) {
		log.Error("node API serving certificate: "+err.Error()+"; the self-signed one is served meanwhile", "pkiDir", pkiDir)
	})
	mgr, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kube.Interface, error) { return client, nil },
		GetTemplate: func() *x509.CertificateRequest {
			return servingTemplate(nodeName, addresses())
		},
		SignerName:       certificatesv1.KubeletServingSignerName,
		GetUsages:        certificate.DefaultKubeletServingGetUsages,
		CertificateStore: store,
		Name:             "holdfast-server",
	})
	if err != nil {
		return nil, fmt.Errorf("serving certificate manager: %w", err)
	}
	return &Serving{mgr: mgr}, nil
}

// servingTemplate is the kubelet's serving CSR: system:node:NAME in system:nodes, for the node
// name, the host name and the node's IPs; nil (no request) without an address.
func servingTemplate(nodeName string, addresses []string) *x509.CertificateRequest {
	var ips []net.IP
	for _, a := range addresses {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return nil
	}
	return &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}},
		DNSNames:    servingNames(nodeName),
		IPAddresses: ips,
	}
}

// servingNames are the DNS names of the serving certificate: the node's name and its host name.
func servingNames(nodeName string) []string {
	names := []string{nodeName}
	if h, err := os.Hostname(); err == nil && h != nodeName {
		names = append(names, h)
	}
	return names
}

// Current is the issued serving certificate, nil before the first one.
func (s *Serving) Current() *tls.Certificate { return s.mgr.Current() }

// Run requests and renews the certificate until ctx ends.
func (s *Serving) Run(ctx context.Context) error {
	// The manager's goroutine ends with Stop; it owns no state of ours beyond the store.
	s.mgr.Start()
	defer s.mgr.Stop()
	<-ctx.Done()
	return nil
}
