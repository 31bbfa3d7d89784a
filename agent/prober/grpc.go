package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// GRPCHandler runs grpc probes: the gRPC health protocol's Check (grpc.health.v1.Health)
// with the probe's service, on the pod's IP, without TLS, as kubelet does; success when the
// service answers SERVING.
type GRPCHandler struct {
	// UserAgent defaults to DefaultUserAgent().
	UserAgent string
}

// Probe calls Health.Check on t's grpc port.
func (h *GRPCHandler) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	g := t.Probe.GRPC
	if g.Port <= 0 || g.Port >= 65536 {
		return 0, "", fmt.Errorf("invalid port number: %d", g.Port)
	}
	if t.PodIP == "" {
		return 0, "", errors.New("the pod has no IP yet")
	}
	ua := h.UserAgent
	if ua == "" {
		ua = DefaultUserAgent()
	}
	addr := net.JoinHostPort(t.PodIP, strconv.Itoa(int(g.Port)))
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(ua),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return probeDialer().DialContext(ctx, "tcp", addr)
		}),
	)
	if err != nil {
		return Failure, fmt.Sprintf("error: failed to connect service at %q: %+v", addr, err), nil
	}
	defer conn.Close()
	service := ""
	if g.Service != nil {
		service = *g.Service
	}
	// The first call makes the connection: one still being made is waited for (up to the
	// timeout, as kubelet's blocking dial does), a refused one fails the attempt at once.
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if st, ok := status.FromError(err); ok {
			switch st.Code() {
			case codes.Unimplemented:
				return Failure, fmt.Sprintf("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): %s", st.Message()), nil
			case codes.DeadlineExceeded:
				return Failure, fmt.Sprintf("timeout: health rpc did not complete within %v", t.Timeout), nil
			}
		}
		return Failure, fmt.Sprintf("error: health rpc probe failed: %+v", err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return Failure, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String()), nil
	}
	return Success, "service is serving", nil
}
