package containerd

import (
	"context"
	"fmt"
	"net/http"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Option configures a Runtime at Connect.
type Option func(*Runtime)

// WithRegistryConfigPath makes pulls read registry host configuration from dir, laid out as
// containerd's own (config_path of its CRI plugin, `ctr --hosts-dir`):
// <dir>/<host[:port]>/hosts.toml, or Docker's certs.d files. It is read by containerd's own
// package at every pull, so an operator's edit needs no restart and the format is exactly the
// one containerd users already write. A missing dir, or a registry without a directory,
// means the defaults: HTTPS with the system's CAs (plain HTTP tried for localhost:port).
func WithRegistryConfigPath(dir string) Option {
	return func(r *Runtime) { r.registryConfigPath = dir }
}

// WithNodeSecurity is what the node contributes to every container's confinement: the
// seccomp profile root, AppArmor, a cgroup namespace. Defaults to none of them.
func WithNodeSecurity(node NodeSecurity) Option {
	return func(r *Runtime) { r.node = node }
}

// WithIODir makes dir the directory of the FIFOs that feed the stdin of containers with
// stdin: true (one per container, removed with it). Without it such containers cannot start.
func WithIODir(dir string) Option {
	return func(r *Runtime) { r.ioDir = dir }
}

// WithExecFIFODir makes dir the directory of the FIFOs each exec's output goes through (an exec
// probe, kubectl exec): three made and removed per exec. Without it containerd's client makes
// them under the system's temporary directory, which on a gateway is often the flash: an exec
// probe every second cost 530-620 KiB a minute of file system metadata there (make bench's
// flash-wear phase, 2026-12-06). The default configuration puts them on tmpfs.
func WithExecFIFODir(dir string) Option {
	return func(r *Runtime) { r.execFIFODir = dir }
}

// resolver returns the resolver one pull uses: the host configuration of
// registryConfigPath, with creds for the registries that ask for authentication, its requests
// watched by progress (nil: not watched).
func (r *Runtime) resolver(ctx context.Context, creds runtime.Credentials, progress *pullProgress) remotes.Resolver {
	opts := hostOptions(r.registryConfigPath)
	if progress != nil {
		opts.UpdateClient = func(c *http.Client) error {
			c.Transport = progress.transport(c.Transport)
			return nil
		}
	}
	if creds != nil {
		opts.Credentials = func(host string) (string, string, error) {
			u, s, _ := creds(host)
			return u, s, nil
		}
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, opts)})
}

// hostOptions reads the host configuration of dir (WithRegistryConfigPath's; "": none).
func hostOptions(dir string) config.HostOptions {
	opts := config.HostOptions{}
	if dir != "" {
		opts.HostDir = config.HostDirFromRoot(dir)
	}
	return opts
}

// RegistryEndpoint is one endpoint serving a registry's API: a mirror or the registry itself.
type RegistryEndpoint struct {
	// Host is the host[:port] to reach.
	Host string
	// PlainHTTP: the endpoint speaks HTTP, not HTTPS.
	PlainHTTP bool
	// Client carries the endpoint's TLS configuration (CA, client certificate, skip_verify).
	Client *http.Client
}

// PullEndpoints returns the endpoints a pull from registry ("host[:port]") tries, in the order
// image pulls try them, by the host configuration of dir (laid out as WithRegistryConfigPath's;
// "": none): for the clients other than containerd's (Wasm policies pulled from registries), so
// that one configuration serves every pull. Endpoints without the pull capability, or whose API
// is not under /v2 (which a plain registry client cannot reach), are left out.
func PullEndpoints(ctx context.Context, dir, registry string) ([]RegistryEndpoint, error) {
	hosts, err := config.ConfigureHosts(ctx, hostOptions(dir))(registry)
	if err != nil {
		return nil, fmt.Errorf("registry host configuration of %s: %w", registry, err)
	}
	var out []RegistryEndpoint
	for _, h := range hosts {
		if h.Capabilities&docker.HostCapabilityPull == 0 || (h.Path != "" && h.Path != "/v2") {
			continue
		}
		out = append(out, RegistryEndpoint{Host: h.Host, PlainHTTP: h.Scheme == "http", Client: h.Client})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no endpoint of %s can pull (see its hosts.toml: capabilities, and a path other than /v2)", registry)
	}
	return out, nil
}
