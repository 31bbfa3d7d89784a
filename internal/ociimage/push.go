package ociimage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Push builds img and uploads it to the registry its Name points at, over the OCI distribution
// API (HEAD to skip blobs already there, a monolithic POST+PUT upload per missing blob, then PUT
// of the manifest under the name's tag), so that a test pulls it back as any registry client
// would. img.Name must be HOST[:PORT]/REPOSITORY:TAG; scheme is "http" or "https". No
// authentication: it is meant for a registry private to a test run. Returns the manifest digest.
func Push(ctx context.Context, hc *http.Client, scheme string, img Image) (digest.Digest, error) {
	host, repo, tag, err := splitName(img.Name)
	if err != nil {
		return "", err
	}
	var blobs []blob
	manifest, err := buildImage(img, func(mediaType string, data []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		blobs = append(blobs, blob{desc: d, data: data})
		return d
	})
	if err != nil {
		return "", fmt.Errorf("push %s: %w", img.Name, err)
	}
	base := scheme + "://" + host + "/v2/" + repo
	// The manifest was added last; every other blob is a layer or the config.
	for _, b := range blobs[:len(blobs)-1] {
		if err := pushBlob(ctx, hc, base, b); err != nil {
			return "", fmt.Errorf("push %s: blob %s: %w", img.Name, b.desc.Digest, err)
		}
	}
	m := blobs[len(blobs)-1]
	if _, err := do(ctx, hc, http.MethodPut, base+"/manifests/"+tag, m.desc.MediaType, m.data, http.StatusCreated); err != nil {
		return "", fmt.Errorf("push %s: manifest: %w", img.Name, err)
	}
	return manifest.Digest, nil
}

func pushBlob(ctx context.Context, hc *http.Client, base string, b blob) error {
	resp, err := do(ctx, hc, http.MethodHead, base+"/blobs/"+b.desc.Digest.String(), "", nil, http.StatusOK, http.StatusNotFound)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	resp, err = do(ctx, hc, http.MethodPost, base+"/blobs/uploads/", "", nil, http.StatusAccepted)
	if err != nil {
		return err
	}
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("upload session without location: %w", err)
	}
	q := loc.Query()
	q.Set("digest", b.desc.Digest.String())
	loc.RawQuery = q.Encode()
	_, err = do(ctx, hc, http.MethodPut, loc.String(), "application/octet-stream", b.data, http.StatusCreated)
	return err
}

// do sends one request and fails unless the answer has one of the wanted status codes. The
// body is read and closed: only the status and headers are returned.
func do(ctx context.Context, hc *http.Client, method, u, contentType string, body []byte, want ...int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	for _, w := range want {
		if resp.StatusCode == w {
			return resp, nil
		}
	}
	return nil, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, strings.TrimSpace(string(msg)))
}

// splitName splits HOST[:PORT]/REPOSITORY:TAG.
func splitName(name string) (host, repo, tag string, err error) {
	host, rest, ok := strings.Cut(name, "/")
	if !ok || !strings.ContainsAny(host, ".:") {
		return "", "", "", fmt.Errorf("push %s: the name does not start with a registry host", name)
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 || strings.Contains(rest[i:], "/") {
		return "", "", "", fmt.Errorf("push %s: the name has no tag", name)
	}
	if _, err := url.Parse("http://" + host); err != nil {
		return "", "", "", fmt.Errorf("push %s: %w", name, err)
	}
	return host, rest[:i], rest[i+1:], nil
}
