package cri

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// EnsureImage makes the image available per the pull policy, pulling through the runtime
// with the credentials creds has for the image's registry. As the containerd backend, Always
// with the registry out of reach uses the image present and says so (ImageResult.Stale).
func (r *Runtime) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy, creds runtime.Credentials) (runtime.ImageResult, error) {
	name := runtime.NormalizeImageRef(ref)
	resp, err := r.is.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: name, UserSpecifiedImage: ref}})
	if err != nil {
		return runtime.ImageResult{}, fmt.Errorf("%w: look up image %q: %v", runtime.ErrImagePull, ref, err)
	}
	present := resp.GetImage()
	switch {
	case present != nil && policy != v1.PullAlways:
		return runtime.ImageResult{Digest: imageDigest(present)}, nil
	case present == nil && policy == v1.PullNever:
		return runtime.ImageResult{}, fmt.Errorf("%w: container image %q is not present with pull policy of Never", runtime.ErrImageNeverPull, ref)
	}
	req := &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: name, UserSpecifiedImage: ref}}
	// No ServerAddress, as the kubelet sends none: containerd reads it as a URL, and a bare
	// "HOST:PORT" fails every pull ("parse server address: ... first path segment in URL
	// cannot contain colon").
	if host := registryHost(name); creds != nil {
		if user, secret, ok := creds(host); ok {
			req.Auth = &criapi.AuthConfig{Username: user, Password: secret}
			if user == "" {
				req.Auth = &criapi.AuthConfig{IdentityToken: secret}
			}
		}
	}
	// A pull has no deadline but its caller's: a slow link may take hours.
	pulled, pullErr := r.is.PullImage(ctx, req)
	if pullErr == nil {
		resp, err := r.is.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: pulled.ImageRef}})
		d := pulled.ImageRef
		if err == nil && resp.GetImage() != nil {
			d = imageDigest(resp.GetImage())
		}
		return runtime.ImageResult{Digest: d, Pulled: present == nil || imageDigest(present) != d}, nil
	}
	if present != nil && unreachable(pullErr) {
		return runtime.ImageResult{Digest: imageDigest(present), Stale: pullErr}, nil
	}
	return runtime.ImageResult{}, fmt.Errorf("%w: %v", runtime.ErrImagePull, pullErr)
}

// imageDigest is the image's manifest digest where the runtime knows it (a pulled image), its
// ID otherwise (an imported one).
func imageDigest(img *criapi.Image) string {
	for _, rd := range img.RepoDigests {
		if _, d, ok := strings.Cut(rd, "@"); ok {
			return d
		}
	}
	return img.Id
}

// registryHost is the registry of a normalized reference (docker.io/library/busybox:1).
func registryHost(name string) string {
	host, _, _ := strings.Cut(name, "/")
	return host
}

// unreachable tells, from the runtime's message (the error crossed a gRPC boundary and lost
// its type), a registry out of reach from one that answered.
func unreachable(err error) bool {
	msg := err.Error()
	for _, s := range []string{"dial tcp", "no such host", "i/o timeout", "connection refused", "network is unreachable",
		"no route to host", "context deadline exceeded", "TLS handshake timeout", "connection reset"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
