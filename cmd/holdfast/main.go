// Command holdfast is the node agent: `holdfast run` runs it, `holdfast pods` shows the pods of
// a running agent, `holdfast logs`, `exec`, `restart` and `describe` act on them through the agent's local
// socket (with no apiserver), `holdfast version` prints its version, and `holdfast policy`
// helps policy authors test their Wasm modules.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/holdfast-dev/holdfast/agent"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/nodeapi"
	"github.com/holdfast-dev/holdfast/internal/version"
)

func main() {
	nodeapi.ConfigureHeapProfiling(os.Getenv("GODEBUG"))
	if calledAsLogger(os.Args[0]) {
		// containerd's shim runs holdfast as a container's logger (see logger.go).
		os.Exit(logs.Main(os.Args[1:], os.Stderr))
	}
	os.Exit(doMain(os.Args[1:], os.Stdout, os.Stderr))
}

// doMain runs the CLI with the given arguments and streams and returns the exit code.
func doMain(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		var ec exitCoder
		if asExitCoder(err, &ec) {
			return ec.ExitCode()
		}
		fmt.Fprintln(stderr, "holdfast:", err)
		return 1
	}
	return 0
}

// exitCoder is an error that carries its own exit code (a denied policy decision is 1 with
// nothing more to print).
type exitCoder interface {
	error
	ExitCode() int
}

func asExitCoder(err error, target *exitCoder) bool {
	ec, ok := err.(exitCoder)
	if ok {
		*target = ec
	}
	return ok
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "holdfast",
		Short:         "A node agent for edge gateways: a kubelet that holds fast when the cluster is out of reach",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newRunCmd(stderr), newVersionCmd(stdout), newPodsCmd(stdout), newPolicyCmd(),
		newLogsCmd(stdout), newExecCmd(stdout, stderr), newRestartCmd(stdout), newDescribeCmd(stdout),
		newHollowCmd(stderr))
	return root
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print holdfast's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(stdout, "holdfast", version.Version)
			return err
		},
	}
}

func newRunCmd(stderr io.Writer) *cobra.Command {
	var (
		configPath string
		logLevel   string
		logFormat  string
		over       config.Config
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node agent",
		Long: `Run the node agent. Configuration comes from --config (YAML, see firmware/config.yaml)
with flags overriding it. Without a kubeconfig holdfast runs standalone from the static
manifest directory. Stopping holdfast (SIGTERM, SIGINT) never stops the pods: the next
start adopts the containers that run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(cmd, configPath, over)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err = agent.New(cfg, log, version.Version).Run(ctx)
			if err != nil && ctx.Err() == nil {
				return err
			}
			log.Info("holdfast stopped; pods keep running")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "path of the YAML configuration file")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&over.NodeName, "node-name", "", "node name (overrides nodeName)")
	f.StringVar(&over.Kubeconfig, "kubeconfig", "", "kubeconfig with the node identity (overrides kubeconfig)")
	f.StringVar(&over.ManifestDir, "manifest-dir", "", "static pod manifest directory (overrides manifestDir)")
	f.StringVar(&over.StateDir, "state-dir", "", "state directory (overrides stateDir)")
	f.StringVar(&over.PodLogDir, "pod-log-dir", "", "container log root (overrides podLogDir)")
	f.StringVar(&over.ImagePreloadDir, "image-preload-dir", "", "image tarballs to import at boot (overrides imagePreloadDir)")
	f.StringVar(&over.Containerd.Address, "containerd-address", "", "containerd socket (overrides containerd.address)")
	f.StringVar(&over.Containerd.Namespace, "containerd-namespace", "", "containerd namespace (overrides containerd.namespace)")
	f.StringVar(&over.CNI.ConfDir, "cni-conf-dir", "", "CNI configuration dir (overrides cni.confDir)")
	f.StringSliceVar(&over.CNI.BinDirs, "cni-bin-dir", nil, "CNI plugin dirs (overrides cni.binDirs)")
	f.StringVar(&over.CNI.NetNSDir, "netns-dir", "", "pod network namespace dir (overrides cni.netnsDir)")
	f.StringVar(&over.HealthzAddress, "healthz-address", "", `local health endpoint address, "-" to disable (overrides healthzAddress)`)
	return cmd
}

// loadConfig reads the file and lays the flags that were set over it.
func loadConfig(cmd *cobra.Command, path string, over config.Config) (config.Config, error) {
	cfg, err := config.LoadWith(path, func(c *config.Config) {
		f := cmd.Flags()
		set := func(name string, dst *string, v string) {
			if f.Changed(name) {
				*dst = v
			}
		}
		set("node-name", &c.NodeName, over.NodeName)
		set("kubeconfig", &c.Kubeconfig, over.Kubeconfig)
		set("manifest-dir", &c.ManifestDir, over.ManifestDir)
		set("state-dir", &c.StateDir, over.StateDir)
		set("pod-log-dir", &c.PodLogDir, over.PodLogDir)
		set("image-preload-dir", &c.ImagePreloadDir, over.ImagePreloadDir)
		set("containerd-address", &c.Containerd.Address, over.Containerd.Address)
		set("containerd-namespace", &c.Containerd.Namespace, over.Containerd.Namespace)
		set("cni-conf-dir", &c.CNI.ConfDir, over.CNI.ConfDir)
		set("netns-dir", &c.CNI.NetNSDir, over.CNI.NetNSDir)
		set("healthz-address", &c.HealthzAddress, over.HealthzAddress)
		if f.Changed("cni-bin-dir") {
			c.CNI.BinDirs = over.CNI.BinDirs
		}
	})
	return cfg, err
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
