package nodeapi

import (
	"context"
	"net"
)

// RunOn serves the HTTPS API, as Run does, on ln instead of the TCP port: the connections a
// konnectivity tunnel hands over (agent/tunnel), which reach the node through a stream the node
// dialed out. It closes ln when ctx ends and returns once every handler returned. As with Run,
// a standalone node (no apiserver to authorize requests) or a serving certificate that cannot be
// made leaves the API off, logged, and is not an error.
func (s *Server) RunOn(ctx context.Context, ln net.Listener) error {
	defer ln.Close()
	tlsCfg, ok := s.servingTLS("listener", ln.Addr().String())
	if !ok {
		return nil
	}
	s.cfg.Log.Info("node API serving", "listener", ln.Addr().String(), "clientCA", s.cfg.ClientCAFile)
	s.serve(ctx, ln, tlsCfg, "node API", s.handler)
	return nil
}
