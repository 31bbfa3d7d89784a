package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	dockerconfig "github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/holdfast-dev/holdfast/test/ociimage"
	"github.com/holdfast-dev/holdfast/test/testenv/testimages"
)

// RegistryVersion is the distribution registry hack/build-tools.sh builds (hack/tools/registry).
const RegistryVersion = "v3.1.2"

// RegistryPath returns the path of the registry binary in BinDir.
func RegistryPath() string { return filepath.Join(BinDir(), "registry-"+RegistryVersion) }

// RegistryOptions says how a test registry is served.
type RegistryOptions struct {
	// TLS serves HTTPS with a certificate for 127.0.0.1 signed by a CA of its own (CAFile);
	// without it the registry speaks plain HTTP.
	TLS bool
	// Username and Password, when set, turn on htpasswd basic auth: every request must carry
	// them. Use with TLS, as real registries do.
	Username, Password string
}

// Registry is a real OCI registry (the distribution project's, as behind most private
// registries) on a loopback port, with filesystem storage kept across Stop and Start so that
// a test can take it away and bring it back.
type Registry struct {
	// Host is host:port, the registry part of image references: Host + "/holdfast/busybox:test".
	Host string
	// CAFile is the PEM CA that signed the serving certificate (TLS only).
	CAFile string
	// Options are those it was started with.
	Options RegistryOptions

	t    testing.TB
	dir  string
	proc *Process
}

// StartRegistry starts a registry under the test's temporary directory and stops it when the
// test ends.
func StartRegistry(t testing.TB, opts RegistryOptions) *Registry {
	t.Helper()
	if err := checkExecutable(RegistryPath()); err != nil {
		t.Fatalf("%v (HOLDFAST_TEST_BIN=%s; built by hack/build-tools.sh)", err, BinDir())
	}
	dir := t.TempDir()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	r := &Registry{Host: fmt.Sprintf("127.0.0.1:%d", ports[0]), Options: opts, t: t, dir: dir}
	cfg := map[string]any{
		"version": 0.1,
		"log":     map[string]any{"level": "info"},
		"storage": map[string]any{
			"filesystem": map[string]any{"rootdirectory": filepath.Join(dir, "data")},
			"delete":     map[string]any{"enabled": true},
		},
		"http": map[string]any{"addr": r.Host, "secret": randomToken()},
	}
	if opts.TLS {
		certFile, keyFile, err := r.writeTLS()
		if err != nil {
			t.Fatalf("registry certificate: %v", err)
		}
		cfg["http"].(map[string]any)["tls"] = map[string]any{"certificate": certFile, "key": keyFile}
	}
	if opts.Username != "" {
		out, err := exec.Command(RegistryPath(), "htpasswd", opts.Username, opts.Password).Output()
		if err != nil {
			t.Fatalf("registry htpasswd: %v", err)
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, out, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg["auth"] = map[string]any{"htpasswd": map[string]any{"realm": "holdfast-test", "path": htpasswd}}
	}
	// The registry reads YAML; JSON is YAML.
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.proc = NewProcess("registry", filepath.Join(dir, "registry.log"), RegistryPath(), "serve", cfgPath)
	t.Cleanup(func() { _ = r.proc.Stop(syscall.SIGKILL, 0) })
	logTailOnFailure(t, r.proc)
	r.Start()
	return r
}

// Start starts a stopped registry on the same address, with the images it held.
func (r *Registry) Start() {
	r.t.Helper()
	if err := r.proc.Start(); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := poll(ctx, r.proc, r.ping); err != nil {
		r.t.Fatalf("registry on %s not ready: %v", r.Host, err)
	}
}

// Stop stops the registry: pulls then fail as with a registry out of reach (connection refused).
func (r *Registry) Stop() {
	r.t.Helper()
	if err := r.proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		r.t.Fatalf("stop registry: %v", err)
	}
}

// ping asks /v2/, which answers 200, or 401 with auth on: either way it serves.
func (r *Registry) ping(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL()+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := r.httpClient().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("GET /v2/: %s", resp.Status)
	}
	return nil
}

// URL is the registry's base URL (http:// or https://).
func (r *Registry) URL() string {
	if r.Options.TLS {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

func (r *Registry) httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if r.Options.TLS {
		pool := x509.NewCertPool()
		if b, err := os.ReadFile(r.CAFile); err == nil {
			pool.AppendCertsFromPEM(b)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// WriteHostsDir writes the registry's host configuration into dir in containerd's certs.d
// layout (dir/HOST:PORT/hosts.toml), as an operator would for a registry of this kind: the
// plain HTTP server for a registry without TLS, its CA for one with. dir is what the agent's
// containerd.registryConfigPath names (and, on the CRI backend, the runtime's config_path).
func (r *Registry) WriteHostsDir(dir string) {
	r.t.Helper()
	hostDir := filepath.Join(dir, r.Host)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	// The registry alone, no mirror: a pull that fails here has nowhere else to go. It is
	// named as a host entry too, with its CA there: containerd 1.6's CRI plugin (Debian 12's)
	// refuses a hosts.toml with no [host."..."] table ("invalid `host` tree") and then pulls
	// as if there were none (plain HTTP, for a registry on loopback).
	var ca string
	if r.Options.TLS {
		ca = fmt.Sprintf("ca = %q\n", r.CAFile)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server = %q\n%s\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  %s", r.URL(), ca, r.URL(), ca)
	if err := os.WriteFile(filepath.Join(hostDir, "hosts.toml"), []byte(b.String()), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// Ref returns the reference of repo:tag in this registry: Ref("holdfast/busybox:test").
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// TestImageRefs are where PushTestImages puts the busybox and pause images.
func (r *Registry) TestImageRefs() (busybox, pause string) {
	return r.Ref("holdfast/busybox:test"), r.Ref("holdfast/pause:3.6")
}

// PushTestImages pushes the busybox and pause test images (from ImagesDir, as built by
// hack/mkimage) under TestImageRefs and returns the digest of each manifest by reference.
func (r *Registry) PushTestImages(ctx context.Context) map[string]digest.Digest {
	r.t.Helper()
	busybox, pause := r.TestImageRefs()
	out := map[string]digest.Digest{}
	for ref, file := range map[string]string{busybox: BusyboxImageFile, pause: PauseImageFile} {
		f, err := os.Open(filepath.Join(ImagesDir(), file))
		if err != nil {
			r.t.Fatal(err)
		}
		d, err := r.pushLayout(ctx, ref, f)
		f.Close()
		if err != nil {
			r.t.Fatalf("push %s: %v", ref, err)
		}
		out[ref] = d
	}
	return out
}

// Push pushes img (built with test/ociimage) as ref and returns its manifest digest. A
// test makes a new digest under the same tag by pushing an image with different content.
func (r *Registry) Push(ctx context.Context, ref string, img ociimage.Image) digest.Digest {
	r.t.Helper()
	var buf bytes.Buffer
	img.Name = ref
	if err := ociimage.WriteLayout(&buf, img); err != nil {
		r.t.Fatalf("build image %s: %v", ref, err)
	}
	d, err := r.pushLayout(ctx, ref, &buf)
	if err != nil {
		r.t.Fatalf("push %s: %v", ref, err)
	}
	return d
}

// BusyboxVariant returns the busybox test image with one more file, /variant, holding
// content: same tag, another digest.
func BusyboxVariant(t testing.TB, content string) ociimage.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("read the host's static busybox: %v", err)
	}
	img := testimages.Images(bb)[BusyboxImageFile]
	img.Layers = append(img.Layers, []ociimage.Entry{ociimage.File("variant", 0o644, []byte(content))})
	return img
}

// pushLayout pushes the one image of an OCI layout tarball as ref, with containerd's own
// pusher (the same docker resolver holdfast pulls with) through a content store on disk.
func (r *Registry) pushLayout(ctx context.Context, ref string, layout io.Reader) (digest.Digest, error) {
	store, err := local.NewStore(filepath.Join(r.dir, "push-content"))
	if err != nil {
		return "", err
	}
	indexDesc, err := archive.ImportIndex(ctx, store, layout)
	if err != nil {
		return "", fmt.Errorf("read layout: %w", err)
	}
	var index ocispec.Index
	b, err := content.ReadBlob(ctx, store, indexDesc)
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal(b, &index); err != nil {
		return "", err
	}
	if len(index.Manifests) != 1 {
		return "", fmt.Errorf("layout holds %d images, want 1", len(index.Manifests))
	}
	manifest := index.Manifests[0]
	hostsDir := filepath.Join(r.dir, "certs.d")
	if _, err := os.Stat(filepath.Join(hostsDir, r.Host)); errors.Is(err, os.ErrNotExist) {
		r.WriteHostsDir(hostsDir)
	}
	opts := dockerconfig.HostOptions{HostDir: dockerconfig.HostDirFromRoot(hostsDir)}
	if r.Options.Username != "" {
		opts.Credentials = func(string) (string, string, error) { return r.Options.Username, r.Options.Password, nil }
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: dockerconfig.ConfigureHosts(ctx, opts)})
	pusher, err := resolver.Pusher(ctx, ref)
	if err != nil {
		return "", err
	}
	if err := remotes.PushContent(ctx, pusher, manifest, store, nil, platforms.All, nil); err != nil {
		return "", err
	}
	return manifest.Digest, nil
}

// writeTLS makes a CA (CAFile) and a serving certificate for 127.0.0.1 signed by it.
func (r *Registry) writeTLS() (certFile, keyFile string, err error) {
	ca, err := NewCA(r.dir, "ca", "holdfast test registry CA")
	if err != nil {
		return "", "", err
	}
	r.CAFile = ca.CertFile
	return ca.IssueServing(r.dir, "registry", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
}

// PushArtifact pushes an OCI artifact of one layer, as `oras push REF FILE:MEDIATYPE` does
// (an OCI 1.1 manifest with an empty config), to repoTag ("policies/deny:v1") and returns
// its manifest digest: what a Wasm policy delivered from a registry is pinned by.
func (r *Registry) PushArtifact(ctx context.Context, repoTag, layerMediaType string, layer []byte) digest.Digest {
	r.t.Helper()
	ref, err := registry.ParseReference(r.Ref(repoTag))
	if err != nil {
		r.t.Fatalf("push artifact %s: %v", repoTag, err)
	}
	repo := &remote.Repository{Reference: ref, PlainHTTP: !r.Options.TLS, Client: &auth.Client{
		Client:     r.httpClient(),
		Credential: auth.StaticCredential(r.Host, auth.Credential{Username: r.Options.Username, Password: r.Options.Password}),
	}}
	layerDesc, err := oras.PushBytes(ctx, repo, layerMediaType, layer)
	if err != nil {
		r.t.Fatalf("push artifact %s: layer: %v", repoTag, err)
	}
	manifest, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, "application/vnd.holdfast.test.artifact", oras.PackManifestOptions{
		Layers: []ocispec.Descriptor{layerDesc},
		// Reproducible: the same layer gives the same digest.
		ManifestAnnotations: map[string]string{ocispec.AnnotationCreated: "2026-01-01T00:00:00Z"},
	})
	if err != nil {
		r.t.Fatalf("push artifact %s: manifest: %v", repoTag, err)
	}
	if err := repo.Tag(ctx, manifest, ref.Reference); err != nil {
		r.t.Fatalf("push artifact %s: tag: %v", repoTag, err)
	}
	return manifest.Digest
}
