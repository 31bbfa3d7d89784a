package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/holdfast-dev/holdfast/agent"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/internal/version"
)

// newHollowCmd runs hollow nodes: fleet simulations, never a gateway's agent.
func newHollowCmd(stderr io.Writer) *cobra.Command {
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "hollow CONFIG...",
		Short: "Run hollow nodes, for fleet simulations: real apiserver clients, containers simulated in memory",
		Long: `Run one hollow node per configuration file, all in this process: each is holdfast with
its own node name, identity (kubeconfig or bootstrap), state directory, Lease, pods and status
traffic, a real client of the apiserver, but with its containers and pod networks simulated in
memory (agent/runtime/hollow): nothing runs on this machine. For measuring what a fleet costs a control
plane (make fleet, docs/fleet.md); never for a gateway.

Each node's node API port and local health endpoint are off unless its file sets them (a
hundred nodes cannot share port 10250). A node that fails is reported and the others go on;
the command ends when all have stopped (SIGTERM, SIGINT).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, paths []string) error {
			log, err := newLogger(stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfgs := make([]config.Config, 0, len(paths))
			for _, p := range paths {
				cfg, err := config.LoadWith(p, hollowDefaults)
				if err != nil {
					return err
				}
				if cfg.Standalone() {
					return fmt.Errorf("config %s: a hollow node needs a kubeconfig or a bootstrap kubeconfig: it simulates a fleet's load on a control plane", p)
				}
				cfgs = append(cfgs, cfg)
			}
			// Once for every node, before any starts (klog's logger is global; see agent.Run).
			klog.SetSlogLogger(log.With("component", "client-go"))
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			var wg sync.WaitGroup
			errs := make([]error, len(cfgs))
			for i, cfg := range cfgs {
				wg.Go(func() {
					nodeLog := log.With("node", cfg.NodeName)
					if err := agent.NewHollow(cfg, nodeLog, version.Version).Run(ctx); err != nil && ctx.Err() == nil {
						nodeLog.Error("hollow node stopped", "err", err)
						errs[i] = fmt.Errorf("node %s: %w", cfg.NodeName, err)
					}
				})
			}
			log.Info("hollow nodes running", "nodes", len(cfgs))
			wg.Wait()
			return errors.Join(errs...)
		},
	}
	f := cmd.Flags()
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

// hollowDefaults turns off, unless the file sets them, what every node of the process would
// otherwise claim on the same address: the node API's port and the health endpoint.
func hollowDefaults(c *config.Config) {
	if c.Port == nil {
		off := 0
		c.Port = &off
	}
	if c.HealthzAddress == "" {
		c.HealthzAddress = "-"
	}
}
