package wasm

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/holdfast-dev/holdfast/policies/abi"
)

// netTarget is one address a guest may reach during a call.
type netTarget struct {
	addr  netip.Addr
	ports []int
}

// WithNetwork lets http_request and tcp_dial reach ip on the given ports
// during this call (for a probe: the pod's IP and its declared ports). The
// guest must name ip literally; host names are not resolved. Without this
// option no address is reachable, whatever the grants. An invalid ip allows
// nothing.
func WithNetwork(ip string, ports ...int) CallOption {
	return func(o *callOptions) {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return
		}
		o.network = append(o.network, netTarget{addr: a.Unmap(), ports: slices.Clone(ports)})
	}
}

// allowed reports whether hostport ("ip:port") is a target of the call.
func (o *callOptions) allowed(hostport string) error {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return &targetError{fmt.Sprintf("%.256q is not an IP address and port; only the call's targets may be reached, named by IP", hostport)}
	}
	for _, t := range o.network {
		if t.addr == ap.Addr().Unmap() && slices.Contains(t.ports, int(ap.Port())) {
			return nil
		}
	}
	return &targetError{fmt.Sprintf("%s is not among the targets allowed for this call (%s)", hostport, o.describeTargets())}
}

// targetError refuses an address that is not a target of the call.
type targetError struct{ msg string }

func (e *targetError) Error() string { return e.msg }

func (o *callOptions) describeTargets() string {
	if len(o.network) == 0 {
		return "none"
	}
	var parts []string
	for _, t := range o.network {
		ps := make([]string, len(t.ports))
		for i, p := range t.ports {
			ps[i] = strconv.Itoa(p)
		}
		parts = append(parts, t.addr.String()+" ports "+strings.Join(ps, ","))
	}
	return strings.Join(parts, "; ")
}

// HTTPRequest is abi.HTTPRequest (see policies/abi).
type HTTPRequest = abi.HTTPRequest

// HTTPResponse is abi.HTTPResponse (see policies/abi).
type HTTPResponse = abi.HTTPResponse

var (
	transportOnce sync.Once
	transport     *http.Transport
)

// probeTransport is shared by all calls. Like kubelet's HTTP probes it does
// not keep connections alive and does not verify TLS certificates (a pod's
// serving certificate is rarely valid for its IP). It never uses a proxy.
// Its dialer checks every address, redirects included, against the
// targets of the call carried by the request's context.
func probeTransport() *http.Transport {
	transportOnce.Do(func() {
		d := &net.Dialer{}
		transport = &http.Transport{
			Proxy:             nil,
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as kubelet's HTTPS probes
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				st := stateFrom(ctx)
				if st == nil {
					return nil, errors.New("no call state")
				}
				if err := st.opts.allowed(addr); err != nil {
					return nil, err
				}
				return d.DialContext(ctx, network, addr)
			},
			MaxResponseHeaderBytes: 64 << 10,
		}
	})
	return transport
}

func (e *Engine) httpRequest(ctx context.Context, st *callState, raw []byte) any {
	var req HTTPRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return hostError{Error: "request: " + err.Error(), Code: "invalid"}
	}
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return hostError{Error: fmt.Sprintf("url %.256q must be http:// or https:// with an IP address", req.URL), Code: "invalid"}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if err := st.opts.allowed(net.JoinHostPort(u.Hostname(), port)); err != nil {
		return hostError{Error: err.Error(), Code: "denied"}
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hreq, err := http.NewRequestWithContext(ctx, method, u.String(), strings.NewReader(req.Body))
	if err != nil {
		return hostError{Error: err.Error(), Code: "invalid"}
	}
	hreq.Header.Set("User-Agent", "holdfast-probe/1")
	for k, v := range req.Headers {
		hreq.Header.Set(k, v)
	}
	client := &http.Client{
		Transport: probeTransport(),
		CheckRedirect: func(_ *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			return nil
		},
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return netError(ctx, err)
	}
	defer resp.Body.Close()
	// The escaped body is at least as long as the body: reading more than
	// the answer's limit would be for nothing.
	limit := st.m.limits.HostResponseBytes
	if req.MaxBodyBytes > 0 && req.MaxBodyBytes < limit {
		limit = req.MaxBodyBytes
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return netError(ctx, err)
	}
	out := HTTPResponse{Status: resp.StatusCode, Headers: map[string][]string{}}
	if len(body) > limit {
		body, out.Truncated = body[:limit], true
	}
	out.Body = string(body)
	size := 0
	for k, vs := range resp.Header {
		for _, v := range vs {
			size += len(k) + len(v)
		}
		if size > 2048 {
			break
		}
		out.Headers[k] = vs
	}
	fitAnswer(&out, &out.Body, &out.Truncated, st.m.limits.HostResponseBytes)
	return out
}

func netError(ctx context.Context, err error) hostError {
	var te *targetError
	if errors.As(err, &te) {
		return hostError{Error: err.Error(), Code: "denied"}
	}
	if ctx.Err() != nil {
		return hostError{Error: err.Error(), Code: "timeout"}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return hostError{Error: err.Error(), Code: "timeout"}
	}
	return hostError{Error: err.Error(), Code: "io"}
}

// TCPRequest is abi.TCPRequest (see policies/abi).
type TCPRequest = abi.TCPRequest

// TCPResponse is abi.TCPResponse (see policies/abi).
type TCPResponse = abi.TCPResponse

func tcpDial(ctx context.Context, st *callState, raw []byte) any {
	var req TCPRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return hostError{Error: "request: " + err.Error(), Code: "invalid"}
	}
	if err := st.opts.allowed(req.Address); err != nil {
		return hostError{Error: err.Error(), Code: "denied"}
	}
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", req.Address)
	if err != nil {
		return netError(ctx, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Unblock reads when the call is canceled without a deadline.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	out := TCPResponse{Connected: true}
	if req.Send != "" {
		if _, err := io.WriteString(conn, req.Send); err != nil {
			out.Error = err.Error()
			return out
		}
	}
	limit := min(max(req.ReadBytes, 0), st.m.limits.HostResponseBytes)
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for got.Len() < limit {
		n, err := conn.Read(buf[:min(len(buf), limit-got.Len())])
		got.Write(buf[:n])
		if req.ReadUntil != "" && bytes.Contains(got.Bytes(), []byte(req.ReadUntil)) {
			break
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out.Error = err.Error()
			}
			break
		}
	}
	out.Received = got.String()
	fitAnswer(&out, &out.Received, &out.Truncated, st.m.limits.HostResponseBytes)
	return out
}
