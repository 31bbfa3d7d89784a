package prober

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// maxHTTPBody is how much of a response body kubelet reads (10 KiB).
const maxHTTPBody = 10 << 10

// HTTPGetHandler runs httpGet probes as kubelet does: GET scheme://host:port/path, host
// defaulting to the pod's IP, with the probe's httpHeaders, User-Agent kube-probe/<major>.
// <minor> and Accept */* unless the probe sets them; success on a status from 200 to 399. HTTPS
// does not verify the certificate. Redirects are followed to the same host only (at most 10);
// a redirect to another host is not followed and counts as a success with a warning.
type HTTPGetHandler struct {
	// UserAgent defaults to DefaultUserAgent().
	UserAgent string

	once      sync.Once
	transport *http.Transport
}

// DefaultUserAgent is kubelet's probe User-Agent for the Kubernetes version whose API holdfast
// is built against ("kube-probe/1.37"): applications and their logs that recognise kubelet's
// probes recognise holdfast's.
func DefaultUserAgent() string { return defaultUserAgent() }

var defaultUserAgent = sync.OnceValue(func() string {
	minor := "37"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path != "k8s.io/api" {
				continue
			}
			// k8s.io/api v0.N.x goes with Kubernetes 1.N.
			if parts := strings.Split(strings.TrimPrefix(dep.Version, "v"), "."); len(parts) >= 2 && parts[0] == "0" {
				if _, err := strconv.Atoi(parts[1]); err == nil {
					minor = parts[1]
				}
			}
		}
	}
	return "kube-probe/1." + minor
})

func (h *HTTPGetHandler) client() *http.Client {
	h.once.Do(func() {
		h.transport = &http.Transport{
			// Like kubelet's: no certificate check, a connection per probe, no proxy (the
			// pod is local), no transparent gzip.
			TLSClientConfig:    &tls.Config{InsecureSkipVerify: true},
			DisableKeepAlives:  true,
			DisableCompression: true,
			DialContext:        probeDialer().DialContext,
		}
		if h.UserAgent == "" {
			h.UserAgent = DefaultUserAgent()
		}
	})
	return &http.Client{Transport: h.transport, CheckRedirect: sameHostRedirects}
}

// sameHostRedirects follows redirects to the probed host only, at most 10.
func sameHostRedirects(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// Probe GETs t's httpGet URL.
func (h *HTTPGetHandler) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	client := h.client()
	g := t.Probe.HTTPGet
	port, err := resolvePort(g.Port, t.Container)
	if err != nil {
		return 0, "", err
	}
	host, err := hostOr(g.Host, t)
	if err != nil {
		return 0, "", err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	u := probeURL(scheme, host, port, g.Path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, "", fmt.Errorf("httpGet probe URL %s: %w", u, err)
	}
	req.Header = probeHeaders(g.HTTPHeaders, h.UserAgent)
	req.Host = req.Header.Get("Host")

	resp, err := client.Do(req)
	if err != nil {
		// Refused, reset, timed out: the container's failure.
		return Failure, err.Error(), nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPBody))
	if err != nil {
		return Failure, fmt.Sprintf("read response body: %v", err), nil
	}
	body := string(b)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return Success, body, nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return Warning, fmt.Sprintf("Probe terminated redirects, Response body: %v", body), nil
	}
	// Like kubelet, the body stays out of the message: it may carry what an event must not.
	return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode), nil
}

// probeURL builds kubelet's probe URL: the path may carry a query.
func probeURL(scheme, host string, port int, path string) *url.URL {
	u, err := url.Parse(path)
	if err != nil {
		u = &url.URL{Path: path}
	}
	u.Scheme = scheme
	u.Host = net.JoinHostPort(host, strconv.Itoa(port))
	return u
}

func probeHeaders(in []v1.HTTPHeader, userAgent string) http.Header {
	h := http.Header{}
	for _, hh := range in {
		h.Add(hh.Name, hh.Value)
	}
	if _, ok := h["User-Agent"]; !ok {
		h.Set("User-Agent", userAgent)
	}
	if _, ok := h["Accept"]; !ok {
		h.Set("Accept", "*/*")
	} else if h.Get("Accept") == "" {
		h.Del("Accept") // set empty on purpose: send none
	}
	return h
}
