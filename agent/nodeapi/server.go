package nodeapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/lru"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/stats"
)

// maxStreams bounds the log, exec and port-forward requests served at once: each holds a
// goroutine or more, a file or a connection, for as long as the client wants.
const maxStreams = 64

// Pods is what the node runs: the pods with their latest statuses (status.Manager).
type Pods interface {
	Pods() []*v1.Pod
}

// Runtime is the container runtime the API reads and execs in (runtime.Runtime).
type Runtime interface {
	ListPod(ctx context.Context, podUID string) ([]runtime.Container, error)
	ExecStream(ctx context.Context, id string, cmd []string, s runtime.ExecStreams) (int, error)
	Attach(ctx context.Context, id string, s runtime.ExecStreams) error
}

// Config is what the node API needs.
type Config struct {
	// Address and Port are where it listens (all addresses when Address is empty).
	Address string
	Port    int
	// NodeName is the node the API serves: the name authorized on (nodes/NAME/proxy) and
	// named in the serving certificate.
	NodeName string
	// HostIPs returns the node's addresses, named in the serving certificate.
	HostIPs func() []string
	// PKIDir keeps the self-signed serving certificate and its key.
	PKIDir string
	// ServingCertificate returns the certificate issued by the cluster (serverTLSBootstrap),
	// nil while there is none: the self-signed one is served then. nil: always self-signed.
	ServingCertificate func() *tls.Certificate
	// ClientCAFile verifies client certificates; empty: only bearer tokens authenticate.
	ClientCAFile string
	// Client reviews tokens and authorizes requests; nil (standalone): only the local socket
	// is served.
	Client kube.Interface

	Pods    Pods
	Runtime Runtime
	// NetNS returns the network namespace of a pod that has its own network, "" without one.
	NetNS func(podUID string) string
	// Healthy is /healthz's answer: nil when the agent is healthy.
	Healthy func() error
	// Restart stops a pod's running containers so that they start again by their restart
	// policy; served on the local socket only (POST /restart/NS/POD).
	Restart func(uid types.UID, reason string) error
	// Admission and Events are what GET /describe/NS/POD adds to a pod on the local socket:
	// its admission decision and the agent's recent events about it.
	Admission func(uid types.UID) (admission.Result, bool)
	Events    func(uid types.UID) []v1.Event
	// Stats measures the node and its pods for /stats/summary and /metrics/resource; nil:
	// neither is served.
	Stats *stats.Provider
	// Metrics serves holdfast's own metrics at /metrics (authorized as nodes/metrics, as the
	// kubelet's); nil: not served.
	Metrics http.Handler
	Log     *slog.Logger
	// Now is the clock for caches and certificates; defaults to time.Now.
	Now func() time.Time
}

// Server is the node API.
type Server struct {
	cfg     Config
	authn   *authenticator
	authz   *authorizer
	streams chan struct{} // a token per running stream request
	handler http.Handler
	// active counts the handlers running, hijacked streams included, so that Run returns
	// only after the last one ended.
	active sync.WaitGroup
}

// New checks the configuration (the client CA file must be readable) and builds the server.
func New(cfg Config) (*Server, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.HostIPs == nil {
		cfg.HostIPs = func() []string { return nil }
	}
	s := &Server{
		cfg:     cfg,
		authn:   newAuthenticator(cfg.Client, cfg.Now),
		authz:   &authorizer{client: cfg.Client, nodeName: cfg.NodeName, now: cfg.Now, decisions: lru.New(maxCacheEntries)},
		streams: make(chan struct{}, maxStreams),
	}
	if cfg.ClientCAFile != "" {
		pem, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("node API client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("node API client CA %s: no PEM certificate in it", cfg.ClientCAFile)
		}
		s.authn.clientCAs = pool
	}
	s.handler = s.withAuth(s.routes())
	return s, nil
}

// ServeLocal serves the API on a unix socket at path, for holdfast's own CLI on the machine
// (`holdfast logs`, `exec`, `restart`, `describe`): the same handlers as the HTTPS API, plus
// restart and describe, with no apiserver involved, so that they work offline. The socket is
// root's alone (0600; by default in the agent's 0700 state directory): whoever can open it is
// root on the node already. Every request is written to the agent's log. It returns when ctx
// ends, after the last stream.
func (s *Server) ServeLocal(ctx context.Context, path string) error {
	ln, err := listenPrivate(path)
	if err != nil {
		s.cfg.Log.Error("local API not served", "socket", path, "err", err)
		return nil
	}
	s.cfg.Log.Info("local API serving", "socket", path)
	routes := http.NewServeMux()
	routes.Handle("/", s.routes())
	routes.HandleFunc("POST /restart/{ns}/{pod}", s.restart)
	routes.HandleFunc("GET /describe/{ns}/{pod}", s.describe)
	// Go's profiles of the agent itself (heap, goroutines, CPU), for measuring its footprint
	// on the gateway: root's socket only, never the network side.
	routes.HandleFunc("GET /debug/pprof/", serveProfileIndex)
	routes.HandleFunc("GET /debug/pprof/profile", serveCPUProfile)
	s.serve(ctx, ln, nil, "local API", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Done()
		s.cfg.Log.Info("local API request", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery)
		routes.ServeHTTP(w, r)
	}))
	_ = os.Remove(path)
	return nil
}

// listenPrivate listens on a unix socket at path that is root's alone from its first moment.
// bind creates a socket with the process's umask, and a chmod after it leaves a window in which
// any local user could connect, and keep the connection. The socket is bound in a new 0700
// directory beside path, made 0600 there, then renamed into place.
func listenPrivate(path string) (net.Listener, error) {
	// The rename replaces a previous agent's socket at path; anything else there is refused,
	// as bind refused it.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("%s exists and is not a socket (%v): move it away", path, fi.Mode().Type())
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".sock")
	if err != nil {
		return nil, fmt.Errorf("a private directory for the socket: %w", err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	// Closing must not unlink tmp: the socket is at path by then, removed by ServeLocal.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("put the socket in place: %w", err)
	}
	return ln, nil
}

// serve serves h on ln (over TLS when tlsCfg is set) until ctx ends, then closes the server
// and every connection (streams, follows and exec sessions, do not end by themselves), and
// returns once every handler returned.
func (s *Server) serve(ctx context.Context, ln net.Listener, tlsCfg *tls.Config, what string, h http.Handler) {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errCh := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			errCh <- srv.ServeTLS(ln, "", "")
		} else {
			errCh <- srv.Serve(ln)
		}
	}()
	select {
	case <-ctx.Done():
		_ = srv.Close()
		<-errCh
	case err := <-errCh:
		s.cfg.Log.Error(what+" stopped serving", "address", ln.Addr().String(), "err", err)
	}
	s.active.Wait()
}

// Handler is the API's handler, authentication and authorization included.
func (s *Server) Handler() http.Handler { return s.handler }

// tlsConfig is the server's TLS: its serving certificate, and client certificates requested
// (verified by the authenticator, so that a bad one gets a 401, not a handshake error).
func (s *Server) tlsConfig() (*tls.Config, error) {
	var ips []net.IP
	for _, a := range s.cfg.HostIPs() {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		}
	}
	names := []string{s.cfg.NodeName}
	if h, err := os.Hostname(); err == nil && h != s.cfg.NodeName {
		names = append(names, h)
	}
	selfSigned, err := servingCertificate(s.cfg.PKIDir, names, ips, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		// The cluster-issued certificate as soon as there is one, and its renewals as they
		// come: chosen at each handshake.
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if s.cfg.ServingCertificate != nil {
				if c := s.cfg.ServingCertificate(); c != nil {
					return c, nil
				}
			}
			return &selfSigned, nil
		},
		ClientAuth: tls.RequestClientCert,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}, // SPDY and WebSocket upgrades need HTTP/1.1
	}, nil
}

// Run serves until ctx ends, then closes the listener and every connection, and returns once
// every handler returned. The node API is not worth stopping the agent, and with it the node's
// heartbeat, for: a port that cannot be bound (another kubelet on it) is retried, and a serving
// certificate that cannot be made is logged and the API left off.
func (s *Server) Run(ctx context.Context) error {
	tlsCfg, ok := s.servingTLS("port", s.cfg.Port)
	if !ok {
		return nil
	}
	addr := net.JoinHostPort(s.cfg.Address, strconv.Itoa(s.cfg.Port))
	var ln net.Listener
	var err error
	delay := time.Second
	for {
		ln, err = net.Listen("tcp", addr)
		if err == nil {
			break
		}
		s.cfg.Log.Error("node API: cannot listen; retrying", "address", addr, "err", err, "retryIn", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
	s.cfg.Log.Info("node API serving", "address", ln.Addr().String(), "clientCA", s.cfg.ClientCAFile)
	s.serve(ctx, ln, tlsCfg, "node API", s.handler)
	return nil
}

// servingTLS is the TLS the HTTPS API serves with, and whether it is served at all: not on a
// standalone node (no apiserver to authorize requests), nor without a serving certificate;
// either is logged, with where the API would have been (key, value), and is not an error.
func (s *Server) servingTLS(key string, where any) (*tls.Config, bool) {
	if s.cfg.Client == nil {
		s.cfg.Log.Info("node API not served over HTTPS: standalone, no apiserver to authorize requests", key, where)
		return nil, false
	}
	tlsCfg, err := s.tlsConfig()
	if err != nil {
		s.cfg.Log.Error("node API not served: no serving certificate", "dir", s.cfg.PKIDir, "err", err)
		return nil, false
	}
	return tlsCfg, true
}

// withAuth authenticates and authorizes every request before h sees it.
func (s *Server) withAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Done()
		if reason := ambiguousPath(r.URL); reason != "" {
			http.Error(w, reason, http.StatusBadRequest)
			return
		}
		u, err := s.authn.authenticate(r)
		switch {
		case errors.Is(err, errReviewUnavailable):
			s.cfg.Log.Warn("node API: authentication unavailable", "path", r.URL.Path, "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case errors.Is(err, errTooManyReviews):
			w.Header().Set("Retry-After", "1")
			http.Error(w, err.Error(), http.StatusTooManyRequests)
			return
		case err != nil:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs := requestAttributes(r.Method, r.URL.Path)
		var reviewErr error
		for _, a := range attrs {
			ok, _, err := s.authz.authorize(r.Context(), u, a)
			if err != nil {
				reviewErr = err
				continue
			}
			if ok {
				s.cfg.Log.Debug("node API request", "method", r.Method, "path", r.URL.Path, "user", u.Name)
				h.ServeHTTP(w, r)
				return
			}
		}
		if reviewErr != nil {
			s.cfg.Log.Warn("node API: authorization unavailable", "path", r.URL.Path, "user", u.Name, "err", reviewErr)
			http.Error(w, reviewErr.Error(), http.StatusServiceUnavailable)
			return
		}
		subs := make([]string, 0, len(attrs))
		for _, a := range attrs {
			subs = append(subs, a.Subresource)
		}
		verb := ""
		if len(attrs) > 0 {
			verb = attrs[0].Verb
		}
		http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource(s)=%v)", u.Name, verb, subs), http.StatusForbidden)
	})
}

// ambiguousPath says why a request's path could be read two ways, or returns "". The verb and
// subresource are judged on the decoded path, and the router matches the escaped one segment by
// segment: a segment that decodes to "." or "..", or holds an escaped slash, would let the two
// disagree (GET /exec/ns/pod/..%2F..%2F..%2Fpods/c reached exec authorized as get on pods, stopped
// only by the pod UID check). No path the node API serves has either.
func ambiguousPath(u *url.URL) string {
	if strings.Contains(strings.ToLower(u.EscapedPath()), "%2f") {
		return "an escaped slash in the path"
	}
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." {
			return "a . or .. segment in the path"
		}
	}
	return ""
}

// acquireStream takes one of the stream slots, or answers 429.
func (s *Server) acquireStream(w http.ResponseWriter) (release func(), ok bool) {
	select {
	case s.streams <- struct{}{}:
		return func() { <-s.streams }, true
	default:
		http.Error(w, fmt.Sprintf("too many log, exec and port-forward requests on this node (%d); retry later", maxStreams), http.StatusTooManyRequests)
		return nil, false
	}
}
