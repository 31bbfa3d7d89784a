package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/connrotation"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/identity/certificate"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// PairPrefix names the key and certificate files in the PKI directory:
// holdfast-client-current.pem is a symlink to the pair in use (certificate then key, PEM).
const PairPrefix = "holdfast-client"

// checkPeriod is how often the current certificate is compared with the one in use (to close
// connections made with the old one) and its expiry judged. Cheap: a pointer comparison.
const checkPeriod = time.Second

// Options configures New.
type Options struct {
	// NodeName is the node the identity is for: the certificate's CN is system:node:NodeName.
	NodeName string
	// Kubeconfig is the node's kubeconfig: read when it exists; written (pointing at the
	// certificate in PKIDir) when BootstrapKubeconfig is set.
	Kubeconfig string
	// BootstrapKubeconfig holds the bootstrap token used to request the first certificate (and
	// a new one if the current one has expired). Empty: Kubeconfig is used as it is.
	BootstrapKubeconfig string
	// PKIDir is where the key and certificates are kept (created 0700).
	PKIDir string
	// Log receives what happens to the identity.
	Log *slog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

// Identity is the node's client identity. Build it with New, run it with Run.
type Identity struct {
	opts   Options
	config *rest.Config // what clients use; its transport presents the current certificate

	// Only with a bootstrap kubeconfig:
	certs  certificate.Manager
	dialer *connrotation.Dialer

	mu       sync.Mutex // protects inUse, expiring, recorder
	inUse    *tls.Certificate
	expiring bool
	recorder record.EventRecorder // set by Run
}

// New loads the node's identity. With a bootstrap kubeconfig it does not wait for a
// certificate: Run requests one in the background while the agent runs its pods, and clients
// made from RESTConfig authenticate as soon as it arrives.
func New(opts Options) (*Identity, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.BootstrapKubeconfig == "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig %s: %w", opts.Kubeconfig, err)
		}
		// Connections through a dialer that can close them all, as the kubelet's
		// (CloseAllConns), when the kubeconfig leaves the transport to client-go.
		id := &Identity{opts: opts, config: cfg}
		if cfg.Transport == nil && cfg.Dial == nil {
			id.dialer = connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
			cfg.Dial = id.dialer.DialContext
		}
		return id, nil
	}
	return newBootstrapped(opts)
}

func newBootstrapped(opts Options) (*Identity, error) {
	if opts.NodeName == "" || opts.Kubeconfig == "" || opts.PKIDir == "" {
		return nil, errors.New("identity: NodeName, Kubeconfig and PKIDir are required with a bootstrap kubeconfig")
	}
	if err := os.MkdirAll(opts.PKIDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", opts.PKIDir, err)
	}
	// The cluster (server, CA) comes from the node's kubeconfig when there is one (an operator
	// may have pointed it elsewhere since), else from the bootstrap kubeconfig. A node
	// kubeconfig naming certificate files (the kubelet's, or one the operator wrote) makes
	// them the pair to start from.
	var certFile, keyFile string
	server, err := loadServer(opts.Kubeconfig)
	if err == nil {
		certFile, keyFile = server.CertFile, server.KeyFile
	} else if server, err = loadServer(opts.BootstrapKubeconfig); err != nil {
		return nil, fmt.Errorf("neither the node kubeconfig nor the bootstrap kubeconfig is usable: %w", err)
	}
	files, err := certificate.NewFileStoreWithLogger(klogFor(opts.Log), PairPrefix, opts.PKIDir, opts.PKIDir, certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("certificate store in %s: %w", opts.PKIDir, err)
	}
	id := &Identity{opts: opts}
	store := clientStore(files, opts.NodeName, id.refused)
	id.dialer = connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	if id.config, err = id.rotatingConfig(server); err != nil {
		return nil, err
	}
	id.certs, err = certificate.NewManager(&certificate.Config{
		ClientsetFn: id.clientsetFor,
		Template: &x509.CertificateRequest{Subject: pkix.Name{
			CommonName:   "system:node:" + opts.NodeName,
			Organization: []string{"system:nodes"},
		}},
		SignerName:       certificatesv1.KubeAPIServerClientKubeletSignerName,
		GetUsages:        certificate.DefaultKubeletClientGetUsages,
		CertificateStore: store,
		Name:             "holdfast-client",
	})
	if err != nil {
		return nil, fmt.Errorf("certificate manager: %w", err)
	}
	if cur := id.certs.Current(); cur != nil {
		opts.Log.Info("node client certificate loaded", "subject", cur.Leaf.Subject.String(),
			"notBefore", cur.Leaf.NotBefore, "notAfter", cur.Leaf.NotAfter, "path", filepath.Join(opts.PKIDir, PairPrefix+"-current.pem"))
		if now := opts.Now(); now.Before(cur.Leaf.NotBefore) {
			opts.Log.Warn("the clock is before the certificate's NotBefore (a clock that jumped back?); keeping the certificate",
				"now", now, "notBefore", cur.Leaf.NotBefore)
		}
	} else {
		opts.Log.Info("no valid node client certificate yet: requesting one with the bootstrap kubeconfig",
			"bootstrapKubeconfig", opts.BootstrapKubeconfig)
	}
	if err := id.writeKubeconfig(server); err != nil {
		return nil, err
	}
	return id, nil
}

// RESTConfig returns a copy of the configuration clients of the apiserver use.
func (id *Identity) RESTConfig() *rest.Config { return rest.CopyConfig(id.config) }

// CloseAllConns closes every connection to the apiserver made with the identity, so that
// requests and watches hung on a dead link (no reset: a NAT entry gone, a modem that lost its
// carrier) fail and reconnect, as the kubelet does when its heartbeats keep failing.
func (id *Identity) CloseAllConns() {
	if id.dialer != nil { // a kubeconfig with a transport of its own
		id.dialer.CloseAll()
	}
}

// Bootstrapped reports whether the identity is a certificate holdfast requests and renews.
func (id *Identity) Bootstrapped() bool { return id.certs != nil }

// Current returns the certificate in use, nil before the first one (or with a static
// kubeconfig).
func (id *Identity) Current() *x509.Certificate {
	if id.certs == nil {
		return nil
	}
	if c := id.certs.Current(); c != nil {
		return c.Leaf
	}
	return nil
}

// Run renews the certificate until ctx ends, closing the connections made with a previous
// certificate when a new one arrives and reporting issue, renewal and approaching expiry to
// recorder (may be nil) as Events on the Node. With a static kubeconfig it only waits for ctx.
func (id *Identity) Run(ctx context.Context, recorder record.EventRecorder) error {
	if id.certs == nil {
		<-ctx.Done()
		return nil
	}
	id.mu.Lock()
	id.recorder = recorder
	id.mu.Unlock()
	// The manager's goroutine ends with Stop; it owns no state of ours beyond the store.
	id.certs.Start()
	defer id.certs.Stop()
	id.mu.Lock()
	id.inUse = id.certs.Current()
	id.mu.Unlock()
	ticker := time.NewTicker(checkPeriod)
	defer ticker.Stop()
	for {
		id.check(recorder)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// refused says that a client certificate was not used because it is not this node's: in the
// log, and as a Warning event on the Node once Run has a recorder.
func (id *Identity) refused(err error) {
	id.opts.Log.Error("node client certificate: "+err.Error(), "pkiDir", id.opts.PKIDir)
	id.mu.Lock()
	recorder := id.recorder
	id.mu.Unlock()
	if recorder != nil {
		node := &v1.ObjectReference{Kind: "Node", Name: id.opts.NodeName, UID: types.UID(id.opts.NodeName)}
		recorder.Eventf(node, v1.EventTypeWarning, "ClientCertificateRefused", "%s", err.Error())
	}
}

// check notices a new certificate and a change in how close expiry is.
func (id *Identity) check(recorder record.EventRecorder) {
	cur := id.certs.Current()
	id.mu.Lock()
	prev := id.inUse
	changed := cur != nil && cur != prev
	if changed {
		id.inUse = cur
	}
	id.mu.Unlock()
	node := &v1.ObjectReference{Kind: "Node", Name: id.opts.NodeName, UID: types.UID(id.opts.NodeName)}
	if changed {
		// Connections made with the previous certificate (or with none) would keep its
		// identity: close them so the next requests handshake with the new one.
		id.dialer.CloseAll()
		reason, what := "ClientCertificateRenewed", "renewed"
		if prev == nil {
			reason, what = "ClientCertificateIssued", "issued"
		}
		id.opts.Log.Info("node client certificate "+what, "subject", cur.Leaf.Subject.String(), "serial", cur.Leaf.SerialNumber.String(),
			"notBefore", cur.Leaf.NotBefore, "notAfter", cur.Leaf.NotAfter)
		if recorder != nil {
			recorder.Eventf(node, v1.EventTypeNormal, reason, "node client certificate %s, valid until %s", what, cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	cond := id.Condition()
	expiring := cond.Status == v1.ConditionTrue
	id.mu.Lock()
	turned := expiring && !id.expiring
	id.expiring = expiring
	id.mu.Unlock()
	if turned {
		id.opts.Log.Warn("node client certificate close to expiry and not renewed yet", "reason", cond.Reason, "message", cond.Message)
		if recorder != nil {
			recorder.Eventf(node, v1.EventTypeWarning, cond.Reason, "%s", cond.Message)
		}
	}
}

// clientsetFor is the certificate manager's client for CSRs: the current certificate while it
// is valid, the bootstrap token otherwise (the kubelet does the same).
func (id *Identity) clientsetFor(current *tls.Certificate) (kube.Interface, error) {
	var cfg *rest.Config
	if current != nil {
		cfg = id.RESTConfig()
	} else {
		var err error
		if cfg, err = clientcmd.BuildConfigFromFlags("", id.opts.BootstrapKubeconfig); err != nil {
			return nil, fmt.Errorf("no valid client certificate, and the bootstrap kubeconfig is not usable: %w", err)
		}
	}
	cfg.UserAgent = "holdfast-certificate-manager"
	return kube.NewForConfig(cfg)
}

// server is the cluster a kubeconfig names, and the client certificate files it names if any.
type server struct {
	rest.Config
}

func loadServer(path string) (server, error) {
	if _, err := os.Stat(path); err != nil {
		return server{}, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return server{}, fmt.Errorf("load %s: %w", path, err)
	}
	return server{*cfg}, nil
}

// rotatingConfig is a rest.Config for the cluster whose TLS handshakes present the current
// certificate of the manager (none before the first), through a dialer whose connections are
// closed when the certificate changes.
func (id *Identity) rotatingConfig(s server) (*rest.Config, error) {
	cluster := &rest.Config{
		Host:            s.Host,
		APIPath:         s.APIPath,
		TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile, CAData: s.CAData, ServerName: s.ServerName, Insecure: s.Insecure},
	}
	tlsConfig, err := rest.TLSConfigFor(cluster)
	if err != nil {
		return nil, fmt.Errorf("TLS configuration for %s: %w", s.Host, err)
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{}
	}
	tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if id.certs != nil {
			if c := id.certs.Current(); c != nil {
				return c, nil
			}
		}
		return &tls.Certificate{}, nil // no certificate yet: the request is anonymous and refused
	}
	return &rest.Config{
		Host:    s.Host,
		APIPath: s.APIPath,
		Transport: utilnet.SetTransportDefaults(&http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSHandshakeTimeout: 10 * time.Second,
			TLSClientConfig:     tlsConfig,
			MaxIdleConnsPerHost: 25,
			DialContext:         id.dialer.DialContext,
		}),
	}, nil
}

// writeKubeconfig writes the node kubeconfig pointing at the current pair, as the kubelet
// does after its bootstrap, so that operators and tools find the node's identity where the
// configuration says. Written only when its content changes, atomically, 0600.
func (id *Identity) writeKubeconfig(s server) error {
	pair := filepath.Join(id.opts.PKIDir, PairPrefix+"-current.pem")
	if abs, err := filepath.Abs(pair); err == nil {
		pair = abs
	}
	caData := s.CAData
	if len(caData) == 0 && s.CAFile != "" {
		b, err := os.ReadFile(s.CAFile)
		if err != nil {
			return fmt.Errorf("read the cluster CA %s: %w", s.CAFile, err)
		}
		caData = b
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default-cluster"] = &clientcmdapi.Cluster{Server: s.Host, CertificateAuthorityData: caData,
		TLSServerName: s.ServerName, InsecureSkipTLSVerify: s.Insecure}
	cfg.AuthInfos["default-auth"] = &clientcmdapi.AuthInfo{ClientCertificate: pair, ClientKey: pair}
	cfg.Contexts["default-context"] = &clientcmdapi.Context{Cluster: "default-cluster", AuthInfo: "default-auth"}
	cfg.CurrentContext = "default-context"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	if old, err := os.ReadFile(id.opts.Kubeconfig); err == nil && string(old) == string(b) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(id.opts.Kubeconfig), 0o755); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	if err := fsutil.WriteFileAtomic(id.opts.Kubeconfig, b, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", id.opts.Kubeconfig, err)
	}
	return nil
}
