package testenv

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	dockerconfig "github.com/containerd/containerd/v2/core/remotes/docker/config"
)

// TestRegistryServesPushedImages: the test images pushed into the registry resolve to the
// digests Push reported, over plain HTTP, and over TLS with basic auth through the hosts.toml
// WriteHostsDir writes (CA); without the credentials the registry refuses.
func TestRegistryServesPushedImages(t *testing.T) {
	RequireIntegration(t)
	for _, tc := range []struct {
		name string
		opts RegistryOptions
	}{
		{"http", RegistryOptions{}},
		{"tls-auth", RegistryOptions{TLS: true, Username: "gw", Password: "s3cret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := StartRegistry(t, tc.opts)
			digests := reg.PushTestImages(ctx)
			hostsDir := filepath.Join(t.TempDir(), "certs.d")
			reg.WriteHostsDir(hostsDir)
			resolve := func(ref, user, pass string) (string, error) {
				opts := dockerconfig.HostOptions{HostDir: dockerconfig.HostDirFromRoot(hostsDir)}
				if user != "" {
					opts.Credentials = func(string) (string, string, error) { return user, pass, nil }
				}
				r := docker.NewResolver(docker.ResolverOptions{Hosts: dockerconfig.ConfigureHosts(ctx, opts)})
				_, desc, err := r.Resolve(ctx, ref)
				return desc.Digest.String(), err
			}
			for ref, want := range digests {
				got, err := resolve(ref, tc.opts.Username, tc.opts.Password)
				if err != nil || got != want.String() {
					t.Errorf("resolve %s: %s, %v; want %s", ref, got, err, want)
				}
				if tc.opts.Username != "" {
					if _, err := resolve(ref, "", ""); err == nil {
						t.Errorf("resolve %s without credentials: no error", ref)
					}
				}
			}
		})
	}
}
