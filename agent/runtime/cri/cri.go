package cri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Labels put on every sandbox and container, as the kubelet puts them, so that crictl and
// any tool written for kubelet nodes finds holdfast's pods where it looks.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
	// labelManaged marks what holdfast made: the runtime may run sandboxes of other clients.
	labelManaged = "io.holdfast.managed"
)

// Annotations holdfast keeps on its containers: what the runtime's own status does not say.
const (
	annotationSpecHash     = "io.holdfast.container.spec-hash"
	annotationImage        = "io.holdfast.container.image"
	annotationRestartCount = "io.kubernetes.container.restartCount"
	annotationTermination  = "io.kubernetes.container.terminationMessagePath"
	// annotationStdin is "true" for a container with stdin: true, "once" with stdinOnce too.
	annotationStdin = "io.holdfast.container.stdin"
	// annotationStatic is "true" on a static pod's container (runtime.ContainerConfig.Static).
	annotationStatic = "io.holdfast.pod.static"
	// annotationMemoryRequest is the container's memory request in bytes
	// (runtime.ContainerConfig.MemoryRequest).
	annotationMemoryRequest = "io.holdfast.container.memory-request"
)

// maxMsgSize bounds a message from the runtime (an exec's output, a long list), as the
// kubelet's CRI client does.
const maxMsgSize = 16 << 20

// Config is what the CRI backend needs beside its endpoint.
type Config struct {
	// Endpoint is the runtime's CRI socket: unix:///run/containerd/containerd.sock, or a path.
	Endpoint string
	// RequestTimeout bounds each call but pulls and streams (kubelet's runtimeRequestTimeout;
	// see callBound).
	RequestTimeout time.Duration
	// PodLogDir is where pod log directories are (/var/log/pods): each sandbox's log
	// directory, which the runtime writes container logs below.
	PodLogDir string
	// ClusterDomain names pods' hostnames' domain (for a pod's subdomain).
	ClusterDomain string
	// EventPoll is how often containers are listed for exits when the runtime does not stream
	// container events (containerd before 1.7). Defaults to 1s.
	EventPoll time.Duration
	// LogMaxSize is the size in bytes past which a container's log is rotated (0: never), and
	// LogMaxFiles how many files of it are kept, the live one included.
	LogMaxSize  int64
	LogMaxFiles int
	// SeccompProfileRoot holds the profiles of seccompProfile type Localhost (kubelet's
	// <root-dir>/seccomp): the runtime is given the full path.
	SeccompProfileRoot string
	// PodCgroupParent is the cgroup of a pod's sandbox, hence of its containers (the CRI gives
	// a container the cgroup parent of its sandbox): the same computation as
	// runtime.ContainerConfig.CgroupParent (agent/podcgroups Manager.PodDir), asked when the
	// sandbox is made. nil or "": the runtime's default.
	PodCgroupParent func(*v1.Pod) string
	// CgroupDriver is the agent's cgroupDriver, "cgroupfs" or "systemd": with a
	// PodCgroupParent, Connect fails when the runtime reports another (checkCgroupDriver).
	CgroupDriver string
}

// Runtime runs holdfast's pods on a CRI runtime: a sandbox per pod, made by the runtime with
// its own pause container and networking, and the pod's containers in it. The runtime is the
// source of truth: sandboxes and containers carry the kubelet's labels, and after an agent
// restart every answer comes from listing them.
type Runtime struct {
	cfg  Config
	log  *slog.Logger
	conn *grpc.ClientConn
	rs   criapi.RuntimeServiceClient
	is   criapi.ImageServiceClient
	// cgroups is the host's hierarchy, detected once: containers' task counts are read there.
	cgroups cgroups.Hierarchy

	mu sync.Mutex
	// sandboxes are the current sandbox of each pod by UID, as the last Setup or list found.
	sandboxes map[string]*sandbox
	// stale are the IDs of each pod's earlier sandboxes (of boots before), removed once empty.
	stale map[string][]string
	// statuses are the last container statuses read, kept while the state they were read in
	// lasts: an exited container's status never changes, a running one's only by exiting.
	statuses map[string]*containerStatus
	// stdinUsed are the stdinOnce containers whose stdin a first attach used, and closed: the
	// runtime would take a second attach's stdin and give it to no one.
	stdinUsed map[string]bool
}

// Connect dials the runtime's CRI endpoint and checks that it answers the v1 API.
func Connect(ctx context.Context, cfg Config, log *slog.Logger) (*Runtime, error) {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = runtime.DefaultRequestTimeout
	}
	if cfg.EventPoll <= 0 {
		cfg.EventPoll = time.Second
	}
	target := cfg.Endpoint
	if !strings.Contains(target, "://") {
		target = "unix://" + target
	}
	// Every call is bounded in one place (callBound), and a call the runtime hung is logged by
	// name ("CRI call timed out", call=/runtime.v1.RuntimeService/ListContainers).
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
	}, runtime.CallDeadlines(log, "CRI", callBound(cfg.RequestTimeout))...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: %w", cfg.Endpoint, err)
	}
	r := &Runtime{
		cfg: cfg, log: log, conn: conn,
		rs:        criapi.NewRuntimeServiceClient(conn),
		is:        criapi.NewImageServiceClient(conn),
		cgroups:   cgroups.Host(),
		sandboxes: map[string]*sandbox{},
		stale:     map[string][]string{},
		statuses:  map[string]*containerStatus{},
		stdinUsed: map[string]bool{},
	}
	if _, err := r.Version(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	if cfg.PodCgroupParent != nil && cfg.CgroupDriver != "" {
		note, err := checkCgroupDriver(ctx, r.rs, cfg.CgroupDriver)
		if err != nil {
			conn.Close()
			return nil, err
		}
		if note != "" {
			log.Warn(note)
		}
	}
	if err := r.loadSandboxes(ctx, ""); err != nil {
		conn.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the connection.
func (r *Runtime) Close() error { return r.conn.Close() }

// callBound is how long one call to the runtime may take (runtime.CallDeadlines): the request
// timeout, but for what lasts by nature. A pull has no deadline but its caller's (a slow link
// may take hours); StopContainer lasts the grace period it gives and the kill after it; an
// ExecSync its own timeout (none: as long as the command runs, as the kubelet's client); the
// container event stream as long as the connection.
func callBound(request time.Duration) runtime.CallBound {
	return func(_ string, stream bool, req any) time.Duration {
		switch req := req.(type) {
		case *criapi.PullImageRequest:
			return 0
		case *criapi.StopContainerRequest:
			return time.Duration(req.Timeout)*time.Second + request
		case *criapi.ExecSyncRequest:
			if req.Timeout <= 0 {
				return 0
			}
			return time.Duration(req.Timeout)*time.Second + request
		}
		if stream {
			return 0
		}
		return request
	}
}

// Version is the runtime's name and version as the kubelet reports it: "containerd://1.6.20".
func (r *Runtime) Version(ctx context.Context) (string, error) {
	v, err := r.version(ctx)
	if err != nil {
		return "", err
	}
	return v.RuntimeName + "://" + strings.TrimPrefix(v.RuntimeVersion, "v"), nil
}

// RuntimeName is the runtime's own name ("containerd", "cri-o").
func (r *Runtime) RuntimeName(ctx context.Context) (string, error) {
	v, err := r.version(ctx)
	if err != nil {
		return "", err
	}
	return v.RuntimeName, nil
}

func (r *Runtime) version(ctx context.Context) (*criapi.VersionResponse, error) {
	v, err := r.rs.Version(ctx, &criapi.VersionRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI version at %s: %w", r.cfg.Endpoint, err)
	}
	return v, nil
}

// condition returns the runtime status condition of that type.
func (r *Runtime) condition(ctx context.Context, typ string) (*criapi.RuntimeCondition, error) {
	resp, err := r.rs.Status(ctx, &criapi.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI status: %w", err)
	}
	for _, c := range resp.GetStatus().GetConditions() {
		if c.Type == typ {
			return c, nil
		}
	}
	return nil, fmt.Errorf("CRI status has no %s condition", typ)
}

func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }

// notFoundMessage: runtimes say "not found" in other codes too (containerd 1.6 answers
// Unknown for a container it no longer has in some calls).
func notFoundMessage(err error) bool {
	return isNotFound(err) || err != nil && strings.Contains(err.Error(), "not found")
}

var errNoSandbox = errors.New("the pod has no sandbox")

func isUnimplemented(err error) bool { return status.Code(err) == codes.Unimplemented }
