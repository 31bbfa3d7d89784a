package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
)

// NodeAPIDialer connects the dials the server asks for to ln when they are for the node API,
// the node's name or one of its addresses (hosts) at port, the address the apiserver dials for
// logs, exec, port-forward and the node proxy, and refuses every other: the tunnel exists for
// the node API, and would otherwise open the gateway's own network, every pod and every host
// the gateway reaches, to whoever can send through the konnectivity server.
func NodeAPIDialer(ln *Listener, nodeName string, hosts func() []string, port int) DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, p, err := net.SplitHostPort(address)
		if err != nil {
			return nil, fmt.Errorf("holdfast tunnel: %w", err)
		}
		if (network == "tcp" || network == "tcp4" || network == "tcp6") && p == strconv.Itoa(port) && isNode(host, nodeName, hosts()) {
			return ln.Dial(ctx)
		}
		return nil, fmt.Errorf("holdfast tunnel of node %s serves only its node API (port %d), not %s %s", nodeName, port, network, address)
	}
}

func isNode(host, nodeName string, addrs []string) bool {
	if host == nodeName {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	for _, a := range addrs {
		if ip.Equal(net.ParseIP(a)) {
			return true
		}
	}
	return false
}

// Identifiers are the agent identifiers of a node, in the form the server parses
// (header.GenAgentIdentifiers): host=NAME and ipv4=IP or ipv6=IP for each of its addresses. A
// server with --proxy-strategies=destHost sends the agent the connections to any of them.
func Identifiers(nodeName string, addrs []string) string {
	v := url.Values{}
	if nodeName != "" {
		v.Add("host", nodeName)
	}
	for _, a := range addrs {
		ip := net.ParseIP(a)
		switch {
		case ip == nil:
		case ip.To4() != nil:
			v.Add("ipv4", ip.String())
		default:
			v.Add("ipv6", ip.String())
		}
	}
	return v.Encode()
}

// ClientTLS is the TLS of the agent's connection to the server: the server's certificate
// verified against caFile (for serverName, when set), and the client certificate of certFile and
// keyFile (none when both are empty), read again at each connection so that a certificate
// renewed on disk is used without a restart.
func ClientTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tunnel CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tunnel CA %s: no PEM certificate in it", caFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if certFile != "" || keyFile != "" {
		// Loaded once now, so that a bad pair is an error at start, not a silent failure later.
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("tunnel client certificate: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("tunnel client certificate: %w", err)
			}
			return &c, nil
		}
	}
	return cfg, nil
}
