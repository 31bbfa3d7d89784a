package policy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	orascontent "oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/holdfast-dev/holdfast/agent/credentials"
)

// OCIScheme prefixes a module delivered from a registry: module:
// oci://registry.example:5000/policies/no-privileged@sha256:<hex>.
const OCIScheme = "oci://"

// Wasm layer media types accepted in a policy artifact's manifest: the one of
// Kubewarden and wasm-to-oci (and `oras push policy.wasm:<type>`), and the
// one of the CNCF TAG Runtime's Wasm OCI artifact layout (wkg).
const (
	MediaTypeWasmLayer     = "application/vnd.wasm.content.layer.v1+wasm"
	MediaTypeWasmLayerCNCF = "application/wasm"
)

// maxManifestBytes bounds the artifact's manifest (oras' default for
// metadata).
const maxManifestBytes = 4 << 20

// ModuleStore keeps the modules pulled from registries, keyed by the
// manifest digest policies.yaml pins, so that a boot with no network loads
// them. offline.Store is one.
type ModuleStore interface {
	PutPolicyModule(digest string, module []byte) error
	GetPolicyModule(digest string) ([]byte, error)
	PolicyModules() ([]string, error)
	DeletePolicyModule(digest string) error
}

// RegistryHost is one endpoint serving a registry's API: a mirror or the
// registry itself.
type RegistryHost struct {
	// Host is the host[:port] to reach.
	Host string
	// PlainHTTP: the endpoint speaks HTTP, not HTTPS.
	PlainHTTP bool
	// Client carries the endpoint's TLS configuration; nil: http.DefaultClient.
	Client *http.Client
}

// RegistryOptions say how registries are reached. The agent gives the ones
// image pulls use, so a registry is configured once for both.
type RegistryOptions struct {
	// Hosts lists the endpoints to try, in order, for a registry
	// ("host[:port]" of a module reference). Defaults to the registry itself
	// over HTTPS with the system's CAs.
	Hosts func(ctx context.Context, registry string) ([]RegistryHost, error)
	// CredentialsFile is a docker config.json with the node's registry
	// credentials, read at each pull. Defaults to none (anonymous pulls).
	CredentialsFile string
	// PullTimeout bounds one pull of one module, every host tried. Defaults
	// to DefaultPullTimeout.
	PullTimeout time.Duration
}

// DefaultPullTimeout bounds one pull when RegistryOptions.PullTimeout is 0.
const DefaultPullTimeout = 2 * time.Minute

// ociRef is a module reference pinned by digest.
type ociRef struct {
	ref    registry.Reference // ref.Reference is the digest
	digest digest.Digest
}

func (r ociRef) String() string { return OCIScheme + r.ref.String() }

// isOCI reports whether a module is delivered from a registry.
func isOCI(module string) bool { return strings.HasPrefix(module, OCIScheme) }

// parseOCIRef parses module: oci://HOST[:PORT]/REPO[:TAG]@sha256:HEX. A tag
// alone is refused: a fleet pins what it runs, and a tag can be moved.
func parseOCIRef(module string) (ociRef, error) {
	rest, ok := strings.CutPrefix(module, OCIScheme)
	if !ok {
		return ociRef{}, fmt.Errorf("module %q is not an %s reference", module, OCIScheme)
	}
	ref, err := registry.ParseReference(rest)
	if err != nil {
		return ociRef{}, fmt.Errorf("module %q: %w", module, err)
	}
	d, err := ref.Digest()
	if err != nil {
		return ociRef{}, fmt.Errorf("module %q is not pinned by digest: write %s%s/%s@sha256:<the manifest digest `oras push` printed> (a tag can be moved; the node runs exactly the digest its configuration names)",
			module, OCIScheme, ref.Registry, ref.Repository)
	}
	if d.Algorithm() != digest.SHA256 {
		return ociRef{}, fmt.Errorf("module %q: digest algorithm %s: only sha256 is supported", module, d.Algorithm())
	}
	return ociRef{ref: ref, digest: d}, nil
}

// fetcher pulls modules from registries.
type fetcher struct {
	opts RegistryOptions
}

// fetch pulls the module of r: its manifest by digest (verified against the
// digest pinned), then its one Wasm layer (verified against the manifest's
// descriptor, size included, and bounded by maxModuleBytes). Each endpoint of
// the registry is tried in turn.
func (f fetcher) fetch(ctx context.Context, r ociRef) (artifact, error) {
	timeout := f.opts.PullTimeout
	if timeout <= 0 {
		timeout = DefaultPullTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hosts := []RegistryHost{{Host: r.ref.Registry}}
	if f.opts.Hosts != nil {
		var err error
		if hosts, err = f.opts.Hosts(ctx, r.ref.Registry); err != nil {
			return artifact{}, err
		}
	}
	creds := f.credentials()
	var errs []error
	for _, h := range hosts {
		b, err := fetchFrom(ctx, h, creds, r)
		if err == nil {
			return b, nil
		}
		errs = append(errs, fmt.Errorf("host %s: %w", h.Host, err))
	}
	return artifact{}, errors.Join(errs...)
}

// credentials reads the node's credentials file at each pull, as image pulls
// do, so an edit needs no restart.
func (f fetcher) credentials() auth.CredentialFunc {
	return func(_ context.Context, hostport string) (auth.Credential, error) {
		if f.opts.CredentialsFile == "" {
			return auth.EmptyCredential, nil
		}
		var kr credentials.Keyring
		if err := kr.AddFile(f.opts.CredentialsFile); err != nil {
			return auth.EmptyCredential, err
		}
		user, secret, ok := kr.Lookup(hostport)
		switch {
		case !ok:
			return auth.EmptyCredential, nil
		case user == "":
			return auth.Credential{RefreshToken: secret}, nil
		default:
			return auth.Credential{Username: user, Password: secret}, nil
		}
	}
}

func fetchFrom(ctx context.Context, h RegistryHost, creds auth.CredentialFunc, r ociRef) (artifact, error) {
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	repo := &remote.Repository{
		Reference: registry.Reference{Registry: h.Host, Repository: r.ref.Repository, Reference: r.digest.String()},
		PlainHTTP: h.PlainHTTP,
		Client:    &auth.Client{Client: client, Credential: creds, Cache: auth.NewCache()},
	}
	desc, manifestBytes, err := oras.FetchBytes(ctx, repo, r.digest.String(), oras.FetchBytesOptions{MaxBytes: maxManifestBytes})
	if err != nil {
		return artifact{}, fmt.Errorf("fetch manifest: %w", err)
	}
	// oras verifies what it reads against the descriptor it resolved; the
	// digest pinned is checked here, so that no resolution step stands
	// between the configuration and the bytes.
	layer, err := pinnedLayer(r, desc.MediaType, manifestBytes)
	if err != nil {
		return artifact{}, err
	}
	// FetchAll checks the size and the digest of the layer's bytes against
	// the manifest's descriptor, which the pinned digest covers.
	b, err := orascontent.FetchAll(ctx, repo.Blobs(), layer)
	if err != nil {
		return artifact{}, fmt.Errorf("fetch module layer %s: %w", layer.Digest, err)
	}
	return artifact{mediaType: desc.MediaType, manifest: manifestBytes, module: b}, nil
}

// pinnedLayer checks an artifact's manifest against r (its digest is the one
// pinned) and returns the module's layer in it, bounded by maxModuleBytes.
func pinnedLayer(r ociRef, mediaType string, manifestBytes []byte) (ocispec.Descriptor, error) {
	if got := digest.FromBytes(manifestBytes); got != r.digest {
		return ocispec.Descriptor{}, fmt.Errorf("manifest digest is %s, not the %s pinned", got, r.digest)
	}
	layer, err := wasmLayer(mediaType, manifestBytes)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if layer.Size > maxModuleBytes {
		return ocispec.Descriptor{}, fmt.Errorf("module layer %s is %d bytes, over the %d MiB limit", layer.Digest, layer.Size, maxModuleBytes>>20)
	}
	return layer, nil
}

// artifact is a policy module as pulled, with the manifest that pins it. The
// store keeps both (encodeArtifact), so that every load, not only the pull,
// checks the module against the digest the configuration pins: a module
// altered on the disk, or put there under another's digest, is never run.
type artifact struct {
	mediaType string // the manifest's, as the registry served it ("": the manifest's own field)
	manifest  []byte
	module    []byte
}

// verify checks a against r: its manifest has the digest pinned, and its
// module is that manifest's one Wasm layer, digest and size.
func (a artifact) verify(r ociRef) error {
	layer, err := pinnedLayer(r, a.mediaType, a.manifest)
	if err != nil {
		return err
	}
	if got := digest.FromBytes(a.module); got != layer.Digest || int64(len(a.module)) != layer.Size {
		return fmt.Errorf("module is %d bytes of digest %s; its manifest names %d bytes of digest %s", len(a.module), got, layer.Size, layer.Digest)
	}
	return nil
}

// artifactMagic opens a stored artifact. Records kept before 2026-12-05 are
// the module's bytes alone (a Wasm module opens with "\x00asm"): they cannot be
// checked against their digest, so they are pulled again.
const artifactMagic = "holdfast policy artifact 1\n"

// encodeArtifact is the store's record of a: the magic, the media type and
// the manifest, each after its length (uvarint), then the module.
func encodeArtifact(a artifact) []byte {
	b := make([]byte, 0, len(artifactMagic)+2*binary.MaxVarintLen64+len(a.mediaType)+len(a.manifest)+len(a.module))
	b = append(b, artifactMagic...)
	b = binary.AppendUvarint(b, uint64(len(a.mediaType)))
	b = append(b, a.mediaType...)
	b = binary.AppendUvarint(b, uint64(len(a.manifest)))
	b = append(b, a.manifest...)
	return append(b, a.module...)
}

// decodeArtifact reads a record of encodeArtifact.
func decodeArtifact(b []byte) (artifact, error) {
	rest, ok := bytes.CutPrefix(b, []byte(artifactMagic))
	if !ok {
		return artifact{}, errors.New("the record holds no manifest to check the module against (kept by an older holdfast, or not by holdfast)")
	}
	field := func(what string, limit int) ([]byte, error) {
		n, size := binary.Uvarint(rest)
		if size <= 0 || n > uint64(limit) || n > uint64(len(rest)-size) {
			return nil, fmt.Errorf("the record's %s is cut or over %d bytes", what, limit)
		}
		f := rest[size : size+int(n)]
		rest = rest[size+int(n):]
		return f, nil
	}
	mediaType, err := field("media type", 256)
	if err != nil {
		return artifact{}, err
	}
	manifest, err := field("manifest", maxManifestBytes)
	if err != nil {
		return artifact{}, err
	}
	return artifact{mediaType: string(mediaType), manifest: manifest, module: rest}, nil
}

// wasmLayer finds the module in a policy artifact's manifest: exactly one
// layer of a Wasm media type.
func wasmLayer(mediaType string, manifestBytes []byte) (ocispec.Descriptor, error) {
	var m ocispec.Manifest
	if err := json.Unmarshal(manifestBytes, &m); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("decode manifest: %w", err)
	}
	if mediaType == "" {
		mediaType = m.MediaType
	}
	if mediaType != ocispec.MediaTypeImageManifest && mediaType != "application/vnd.docker.distribution.manifest.v2+json" {
		return ocispec.Descriptor{}, fmt.Errorf("manifest media type %q is not an image manifest (an index is not a policy artifact: pin the digest of the manifest itself)", mediaType)
	}
	var found []ocispec.Descriptor
	var others []string
	for _, l := range m.Layers {
		switch l.MediaType {
		case MediaTypeWasmLayer, MediaTypeWasmLayerCNCF:
			found = append(found, l)
		default:
			others = append(others, l.MediaType)
		}
	}
	if len(found) != 1 {
		return ocispec.Descriptor{}, fmt.Errorf("the artifact has %d Wasm layers (%s or %s), want exactly one (other layers: %v); push it with `oras push REF policy.wasm:%s`",
			len(found), MediaTypeWasmLayer, MediaTypeWasmLayerCNCF, others, MediaTypeWasmLayer)
	}
	return found[0], nil
}
