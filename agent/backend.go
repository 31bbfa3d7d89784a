package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/nodeapi"
	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/agent/runtime/cri"
	"github.com/holdfast-dev/holdfast/agent/runtime/hollow"
)

// backend is what the agent runs pods on: a container runtime with its image store, and the
// pods' networks. A gateway's is containerd and CNI (containerdBackend), or a CRI runtime that
// owns the pods' sandboxes and networks (criBackend, agent/runtime/cri); a hollow node's, for
// fleet simulations, keeps everything in memory (hollowBackend, agent/runtime/hollow).
type backend struct {
	runtime containerRuntime
	network podNetworks
	images  gc.Images
	imageFS gc.ImageFilesystem
	// usage measures running containers for the node API's stats and for eviction.
	usage eviction.ContainerUsage
	// preloaded are the image names imported from the firmware's tarballs, which image
	// collection pins.
	preloaded []string
	// run does, until ctx ends, what the backend does in the background; nil: nothing.
	run   func(ctx context.Context) error
	close func() error
}

// containerRuntime is what the agent's parts ask of the container runtime, each through
// the interface it declares.
type containerRuntime interface {
	runtime.Runtime
	prober.Execer
	nodeapi.Runtime
	// Version is the runtime's name and version as nodeInfo reports it.
	Version(ctx context.Context) (string, error)
}

// podNetworks is what the agent's parts ask of the pod networks.
type podNetworks interface {
	runtime.Network
	// Ready fails while pods with their own network cannot start (NetworkReady).
	Ready() error
	// NetNSPath is a set-up pod's network namespace, for the node API's port forwarding.
	NetNSPath(podUID string) string
	// Run releases, until ctx ends, what setups left to release later (CNI: the attachments
	// of previous boots).
	Run(ctx context.Context) error
}

// openBackend opens the agent's backend: hollow for `holdfast hollow`, else the configured
// runtime's.
func (a *Agent) openBackend(ctx context.Context, boot *metrics.Boot) (*backend, error) {
	switch {
	case a.hollow:
		return a.hollowBackend(), nil
	case a.cfg.Runtime == config.RuntimeCRI:
		return a.criBackend(ctx, boot)
	}
	return a.containerdBackend(ctx, boot)
}

// containerdBackend installs the container logger, connects to containerd (waiting for it),
// imports the preloaded images, and sets up CNI.
func (a *Agent) containerdBackend(ctx context.Context, boot *metrics.Boot) (*backend, error) {
	cfg := a.cfg
	// Before any container starts: the shim runs this binary as each container's logger.
	loggerPath, err := logs.Install(logs.Config{
		StateDir: cfg.StateDir,
		MaxSize:  cfg.ContainerLogMaxSizeBytes(),
		MaxFiles: cfg.ContainerLogMaxFiles,
	})
	if err != nil {
		return nil, err
	}
	a.log.Info("container logger installed", "path", loggerPath, "maxSize", cfg.ContainerLogMaxSize, "maxFiles", cfg.ContainerLogMaxFiles)
	boot.Done("install_logger")

	rt, err := a.connectRuntime(ctx, cfg.Containerd.Address, cfg.Containerd.Namespace)
	if err != nil {
		return nil, err
	}
	boot.Done("connect_runtime")
	preloaded := a.preloadImages(ctx, rt)
	boot.Done("preload_images")
	return &backend{
		runtime:   rt,
		network:   network.NewManager(cfg.CNI.ConfDir, cfg.CNI.BinDirs, cfg.CNI.NetNSDir, cfg.StateDir),
		images:    containerd.NewImages(rt.Client(), cfg.Containerd.Namespace),
		imageFS:   containerd.NewImageFilesystem(rt.Client(), cfg.GC.ImageFSPath),
		usage:     eviction.CgroupUsage{Cgroups: cgroups.Host()},
		preloaded: preloaded,
		close:     rt.Close,
	}, nil
}

// hollowBackend is an in-memory runtime and network: nothing runs, nothing is installed.
func (a *Agent) hollowBackend() *backend {
	rt := hollow.NewRuntime()
	a.log.Info("hollow node: containers and pod networks are simulated in memory", "runtime", hollow.Version)
	return &backend{
		runtime: rt,
		network: hollow.NewNetwork(a.cfg.NodeName),
		images:  rt.Images(),
		imageFS: hollow.Filesystem{Dir: filepath.Clean(a.cfg.StateDir)},
		usage:   eviction.CgroupUsage{Cgroups: cgroups.Host()}, // no container has a pid: none measured
		close:   func() error { return nil },
	}
}

// criNamespace is the containerd namespace of containerd's CRI plugin.
const criNamespace = "k8s.io"

// criBackend connects to the CRI runtime (waiting for it). The runtime makes the pods'
// sandboxes, networks and logs. With containerd's CRI plugin, which serves containerd's own
// API on the same socket, the preloaded images are imported into the plugin's namespace and
// image collection reads it; another CRI runtime has no API for either, and is refused until
// holdfast collects images through the CRI.
func (a *Agent) criBackend(ctx context.Context, boot *metrics.Boot) (*backend, error) {
	cfg := a.cfg
	rt, err := waitFor(ctx, a, "the CRI runtime", cfg.CRIEndpoint, func() (*cri.Runtime, error) {
		return cri.Connect(ctx, cri.Config{
			Endpoint:           cfg.CRIEndpoint,
			RequestTimeout:     cfg.Containerd.RequestTimeout.Duration,
			PodLogDir:          cfg.PodLogDir,
			ClusterDomain:      cfg.ClusterDomain,
			SeccompProfileRoot: cfg.SeccompProfileRoot,
			LogMaxSize:         cfg.ContainerLogMaxSizeBytes(),
			LogMaxFiles:        cfg.ContainerLogMaxFiles,
			PodCgroupParent:    a.podCgroupParent(),
			CgroupDriver:       cfg.CgroupDriver,
		}, a.log.With("component", "cri"))
	})
	if err != nil {
		return nil, err
	}
	boot.Done("connect_runtime")
	name, err := rt.RuntimeName(ctx)
	if err != nil {
		rt.Close()
		return nil, err
	}
	if name != "containerd" {
		rt.Close()
		return nil, fmt.Errorf("runtime: cri at %s is %s: holdfast's CRI backend needs containerd's CRI plugin for now (preloaded images and image collection go through containerd's own API on the same socket)", cfg.CRIEndpoint, name)
	}
	cd, err := a.connectRuntime(ctx, strings.TrimPrefix(cfg.CRIEndpoint, "unix://"), criNamespace)
	if err != nil {
		rt.Close()
		return nil, err
	}
	preloaded := a.preloadImages(ctx, cd)
	boot.Done("preload_images")
	return &backend{
		runtime:   rt,
		network:   rt.Network(),
		images:    containerd.NewImages(cd.Client(), criNamespace),
		imageFS:   containerd.NewImageFilesystem(cd.Client(), cfg.GC.ImageFSPath),
		usage:     rt,
		preloaded: preloaded,
		// The runtime writes the containers' logs; holdfast rotates them.
		run:   rt.RotateLogs,
		close: func() error { return errors.Join(rt.Close(), cd.Close()) },
	}, nil
}

// connectRuntime waits for containerd at address, in namespace: at boot it may come up after
// the agent.
func (a *Agent) connectRuntime(ctx context.Context, address, namespace string) (*containerd.Runtime, error) {
	node, err := nodeSecurity(a.cfg)
	if err != nil {
		return nil, err
	}
	return waitFor(ctx, a, "containerd", address, func() (*containerd.Runtime, error) {
		return containerd.Connect(ctx, address, namespace, a.log.With("component", "runtime"),
			containerd.WithRegistryConfigPath(a.cfg.Containerd.RegistryConfigPath),
			containerd.WithRequestTimeout(a.cfg.Containerd.RequestTimeout.Duration),
			containerd.WithPullProgressTimeout(a.cfg.Containerd.ImagePullProgressTimeout.Duration),
			// The stdin FIFOs of containers with stdin: true (kubectl attach -i).
			containerd.WithIODir(filepath.Join(a.cfg.StateDir, "io")),
			containerd.WithExecFIFODir(a.cfg.ExecFIFODir),
			containerd.WithNodeSecurity(node))
	})
}

// preloadImages imports the firmware's image tarballs before any pod starts and returns the
// names imported (or found present), which image collection pins. A bad tarball is reported
// with its path and skipped; the pods that need it will say ErrImageNeverPull.
func (a *Agent) preloadImages(ctx context.Context, rt *containerd.Runtime) []string {
	if a.cfg.ImagePreloadDir == "" {
		return nil
	}
	results, err := rt.ImportDir(ctx, a.cfg.ImagePreloadDir)
	if err != nil {
		a.log.Error("preload images", "dir", a.cfg.ImagePreloadDir, "err", err)
		return nil
	}
	var names []string
	for _, r := range results {
		names = append(names, r.Images...) // a tarball that failed half-way still pins what it imported
		if r.Err != nil {
			a.log.Error("preload image tarball; skipped", "path", r.Path, "err", r.Err)
			continue
		}
		if r.Skipped {
			a.log.Info("preloaded images already present", "path", r.Path, "images", r.Images)
			continue
		}
		a.log.Info("preloaded images", "path", r.Path, "images", r.Images)
	}
	return names
}

// registryHosts are the endpoints a pull from registry tries, by the registry host
// configuration image pulls use (containerd's hosts.toml layout): Wasm policies pulled from
// registries reach them as images do.
func (a *Agent) registryHosts(ctx context.Context, registry string) ([]policy.RegistryHost, error) {
	endpoints, err := containerd.PullEndpoints(ctx, a.cfg.Containerd.RegistryConfigPath, registry)
	hosts := make([]policy.RegistryHost, 0, len(endpoints))
	for _, ep := range endpoints {
		hosts = append(hosts, policy.RegistryHost(ep))
	}
	return hosts, err
}

// nodeSecurity is what this host contributes to its containers' confinement on containerd.
// Without the host's cgroup mount options the agent does not start: a privileged container
// would clear them for the whole host (containerd.NodeSecurity.CgroupMountOptions).
func nodeSecurity(cfg config.Config) (containerd.NodeSecurity, error) {
	host := cgroups.Host()
	options, err := host.MountOptions()
	if err != nil {
		return containerd.NodeSecurity{}, err
	}
	return containerd.NodeSecurity{
		SeccompProfileRoot: cfg.SeccompProfileRoot,
		AppArmor:           runtime.AppArmorEnabled(),
		CgroupNamespace:    host.Mode == cgroups.Unified,
		CgroupMountOptions: options,
	}, nil
}
