package prober

import (
	"context"
	"net"
	"strconv"
)

// TCPSocketHandler runs tcpSocket probes: success when a TCP connection to the port opens.
type TCPSocketHandler struct{}

// Probe dials t's tcpSocket port, on its host or the pod's IP.
func (TCPSocketHandler) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	port, err := resolvePort(t.Probe.TCPSocket.Port, t.Container)
	if err != nil {
		return 0, "", err
	}
	host, err := hostOr(t.Probe.TCPSocket.Host, t)
	if err != nil {
		return 0, "", err
	}
	conn, err := probeDialer().DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		// A refused or timed-out connection is the container's failure, not the probe's.
		return Failure, err.Error(), nil
	}
	_ = conn.Close()
	return Success, "", nil
}
