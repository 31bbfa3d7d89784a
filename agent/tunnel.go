package agent

import (
	"context"
	"net"

	"golang.org/x/sync/errgroup"

	"github.com/holdfast-dev/holdfast/agent/nodeapi"
	"github.com/holdfast-dev/holdfast/agent/tunnel"
)

// runTunnel serves the node API through the konnectivity server of the tunnel section: the
// embedded agent dials out and hands each connection the server forwards for the node API to
// an in-memory listener the node API serves (agent/tunnel). It returns when ctx ends, once both
// have stopped. A tunnel that cannot be set up (an unreadable CA or client certificate) is
// logged and left off: the node API is not worth stopping the agent, and with it the node's
// heartbeat, for.
func (a *Agent) runTunnel(ctx context.Context, api *nodeapi.Server, hostIPs func() []string) error {
	t := a.cfg.Tunnel
	log := a.log.With("component", "tunnel")
	serverName := t.ServerName
	if serverName == "" {
		serverName, _, _ = net.SplitHostPort(t.Server)
	}
	tlsCfg, err := tunnel.ClientTLS(t.CAFile, t.CertFile, t.KeyFile, serverName)
	if err != nil {
		log.Error("tunnel not started: fix the configuration and restart holdfast", "server", t.Server, "err", err)
		return nil
	}
	identifiers := func() string { return tunnel.Identifiers(a.cfg.NodeName, hostIPs()) }
	if t.AgentIdentifiers != "" {
		identifiers = func() string { return t.AgentIdentifiers }
	}
	ln := tunnel.NewListener("konnectivity:" + t.Server)
	agent := tunnel.New(tunnel.Config{
		Server:      t.Server,
		TLS:         tlsCfg,
		TokenFile:   t.TokenFile,
		AgentID:     t.AgentID,
		Identifiers: identifiers,
		Dial:        tunnel.NodeAPIDialer(ln, a.cfg.NodeName, hostIPs, a.cfg.NodeAPIPort()),
		Log:         log,
	})
	var g errgroup.Group
	g.Go(func() error { return api.RunOn(ctx, ln) })
	g.Go(func() error { return agent.Run(ctx) })
	return g.Wait()
}
