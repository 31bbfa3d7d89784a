package runtime

import (
	"context"
	"net/http"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
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

// WithIODir makes dir the directory of the FIFOs that feed the stdin of containers with
// stdin: true (one per container, removed with it). Without it such containers cannot start.
func WithIODir(dir string) Option {
	return func(r *Runtime) { r.ioDir = dir }
}

// Credentials answers the username and password (or "" and an identity token) for a
// registry host, as a docker config.json gives them; ok is false when it knows none.
type Credentials func(host string) (username, secret string, ok bool)

// resolver returns the resolver one pull uses: the host configuration of
// registryConfigPath, with creds for the registries that ask for authentication, its requests
// watched by progress (nil: not watched).
func (r *Runtime) resolver(ctx context.Context, creds Credentials, progress *pullProgress) remotes.Resolver {
	opts := config.HostOptions{}
	if progress != nil {
		opts.UpdateClient = func(c *http.Client) error {
			c.Transport = progress.transport(c.Transport)
			return nil
		}
	}
	if r.registryConfigPath != "" {
		opts.HostDir = config.HostDirFromRoot(r.registryConfigPath)
	}
	if creds != nil {
		opts.Credentials = func(host string) (string, string, error) {
			u, s, _ := creds(host)
			return u, s, nil
		}
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: config.ConfigureHosts(ctx, opts)})
}
