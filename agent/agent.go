// Package agent wires holdfast's parts together and runs them: the runtime, the pod sources,
// the pod workers, status reporting, the node's registration and heartbeats, and the local
// health endpoint. See ../README.md for the data flow.
package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/events"
	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/agent/identity"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/nodeapi"
	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/agent/statekey"
	"github.com/holdfast-dev/holdfast/agent/stats"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/systemd"
	"github.com/holdfast-dev/holdfast/offline"
)

// Agent is one running holdfast.
type Agent struct {
	cfg     config.Config
	log     *slog.Logger
	version string
	// metrics are made by Run: one set per run of the agent.
	metrics *metrics.Metrics
	// hollow: containers and pod networks are simulated in memory (NewHollow).
	hollow bool
}

// New builds an agent from a validated configuration.
func New(cfg config.Config, log *slog.Logger, version string) *Agent {
	return &Agent{cfg: cfg, log: log, version: version}
}

// NewHollow builds a hollow agent, for fleet simulations (`holdfast hollow`, `make fleet`):
// a real client of the apiserver with its own identity, Lease, pods and status, whose
// containers and pod networks exist only in memory (agent/runtime/hollow). Several run in one
// process, each with its own configuration, state directory and metrics.
func NewHollow(cfg config.Config, log *slog.Logger, version string) *Agent {
	return &Agent{cfg: cfg, log: log, version: version, hollow: true}
}

// Run runs the agent until ctx ends. Ending it stops the agent, never the pods: containers
// keep running and are adopted by the next start.
//
// It starts in named steps, in the order they run (start.go): each builds what the next
// ones use and says what it guarantees before they run. What the steps start runs in one
// errgroup, which Run waits for; what they open is closed when Run returns, in reverse.
func (a *Agent) Run(ctx context.Context) error {
	r := a.newRun()
	if err := r.openState(); err != nil {
		return err
	}
	defer r.store.Close()
	if err := r.openRuntime(ctx); err != nil {
		return err
	}
	defer r.be.close()
	if err := r.connectAPI(); err != nil {
		return err
	}
	r.recordEvents(ctx)
	defer r.broadcaster.Shutdown()
	defer r.closePodCgroups()
	if err := r.buildPods(); err != nil {
		return err
	}
	if err := r.buildReclaim(); err != nil {
		return err
	}
	r.buildAdmission(ctx)
	if r.policies != nil {
		defer r.policies.Close(context.WithoutCancel(ctx))
	}
	r.buildProber()

	g, ctx := errgroup.WithContext(ctx)
	r.runPolicies(ctx, g)
	r.startFileSource(ctx, g)
	r.restore()
	r.startAPI(ctx, g)
	r.runPods(ctx, g)
	r.serve(ctx, g)
	r.trimMemory(ctx, g)
	r.boot.Done("start")
	a.log.Info("holdfast running", "node", a.cfg.NodeName, "version", a.version, "standalone", a.cfg.Standalone(),
		"manifests", a.cfg.ManifestDir, "containerd", a.cfg.Containerd.Address)
	return g.Wait()
}

// reservations returns what allocatable leaves out of a capacity, as kubelet computes it:
// systemReserved, kubeReserved and the hard memory.available and nodefs.available thresholds.
func (a *Agent) reservations() (func(capacity v1.ResourceList) v1.ResourceList, error) {
	reserved, err := a.cfg.Reserved()
	if err != nil {
		return nil, err
	}
	thresholds, err := a.cfg.EvictionThresholds()
	if err != nil {
		return nil, err
	}
	return func(capacity v1.ResourceList) v1.ResourceList {
		out := reserved.DeepCopy()
		for name, q := range eviction.HardReservation(thresholds, capacity) {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
		return out
	}, nil
}

// kubepodsLimits is what kubepods is capped at, as the kubelet caps it: with
// enforceNodeAllocatable naming pods, the capacity (and the node's PIDs) less systemReserved
// and kubeReserved
// (node.Allocatable, the computation the Node's reported allocatable also goes through,
// which leaves out the hard eviction thresholds besides: those stay inside kubepods so that
// the eviction manager acts before the OOM killer); without, the capacity itself.
func (a *Agent) kubepodsLimits(capacity v1.ResourceList) (v1.ResourceList, error) {
	limits := v1.ResourceList{}
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
		if q, ok := capacity[name]; ok {
			limits[name] = q
		}
	}
	// The kubelet's internal capacity adds the node's PIDs: kubepods' pids.max.
	if pids := eviction.PIDLimit("/proc"); pids > 0 {
		limits["pid"] = *resource.NewQuantity(pids, resource.DecimalSI)
	}
	if !a.cfg.Enforces(config.EnforcePods) {
		return limits, nil
	}
	reserved, err := a.cfg.Reserved()
	if err != nil {
		return nil, err
	}
	return node.Allocatable(limits, reserved), nil
}

// enforceReservedCgroups caps kubeReservedCgroup and systemReservedCgroup at their
// reservations where enforceNodeAllocatable names them (the kubelet's enforceExistingCgroup):
// the cgroups must exist, made by whoever runs the agent and the system.
func (a *Agent) enforceReservedCgroups(h podcgroups.Driver) error {
	for _, r := range []struct {
		key, cgroup string
		reserved    map[string]string
	}{
		{config.EnforceKubeReserved, a.cfg.KubeReservedCgroup, a.cfg.KubeReserved},
		{config.EnforceSystemReserved, a.cfg.SystemReservedCgroup, a.cfg.SystemReserved},
	} {
		if !a.cfg.Enforces(r.key) {
			continue
		}
		if !h.Exists(r.cgroup) {
			return fmt.Errorf("enforceNodeAllocatable %s: cgroup %s does not exist", r.key, r.cgroup)
		}
		list := v1.ResourceList{}
		for name, v := range r.reserved {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", r.key, name, err)
			}
			list[v1.ResourceName(name)] = q
		}
		if err := h.Update(r.cgroup, podcgroups.NodeAllocatableResources(list)); err != nil {
			return fmt.Errorf("enforce %s on %s: %w", r.key, r.cgroup, err)
		}
		a.log.Info("reservation enforced", "on", r.key, "cgroup", r.cgroup)
	}
	return nil
}

// podCgroupParent is the pod's cgroup for a backend that asks for it when it makes the pod's
// sandbox (CRI): the cgroup driver's Layout.PodDir, the computation the pod workers'
// containers get theirs from (a slice's path with the systemd driver, which containerd's CRI
// plugin turns into its systemd form, as it does the kubelet's). nil with cgroupsPerQOS off.
func (a *Agent) podCgroupParent() func(*v1.Pod) string {
	if a.hollow || !*a.cfg.CgroupsPerQOS {
		return nil
	}
	layout := podcgroups.Layout{Root: a.cfg.CgroupRoot, Systemd: a.cfg.CgroupDriver == podcgroups.DriverSystemd}
	return layout.PodDir
}

// evictionManager builds the node-pressure eviction manager: the host's signals against the
// configured thresholds, pods measured from their containers' usage and their directories, and image and
// container collection as the node-level reclaim that comes before evicting for disk.
func (a *Agent) evictionManager(rt eviction.ContainerLister, usage eviction.ContainerUsage, host eviction.HostObserver, podMgr *pods.Manager, collector *gc.GC, recorder record.EventRecorder) (*eviction.Manager, error) {
	thresholds, err := a.cfg.EvictionThresholds()
	if err != nil {
		return nil, err
	}
	a.log.Info("eviction thresholds", "thresholds", fmt.Sprint(thresholds))
	return eviction.NewManager(eviction.Config{
		Thresholds:               thresholds,
		PressureTransitionPeriod: a.cfg.EvictionPressureTransitionPeriod.Duration,
		MonitoringInterval:       a.cfg.EvictionMonitoringPeriod.Duration,
		MaxPodGracePeriod:        time.Duration(a.cfg.EvictionMaxPodGracePeriod) * time.Second,
	}, host, podMgr,
		eviction.HostStats{Runtime: rt, Usage: usage, PodsDir: filepath.Join(a.cfg.StateDir, "pods"), PodLogDir: a.cfg.PodLogDir},
		collector, recorder, a.log.With("component", "eviction")), nil
}

// statusLine is the agent's one-line state for systemd's STATUS.
func statusLine(pods int, apiReachable func() error) string {
	if apiReachable == nil {
		return fmt.Sprintf("%d pods, standalone", pods)
	}
	if err := apiReachable(); err != nil {
		return fmt.Sprintf("%d pods, apiserver unreachable: %v", pods, err)
	}
	return fmt.Sprintf("%d pods, apiserver reachable", pods)
}

// loadStateKey reads the key that encrypts the Secrets and tokens kept in the state store,
// unsealed by the TPM if one is configured. A gateway without one still runs; it only keeps
// them on tmpfs, and says what that costs.
func (a *Agent) loadStateKey() *offline.Key {
	path := a.cfg.StateKeyFile
	if name := a.cfg.StateKeyCredential; name != "" {
		var err error
		if path, err = statekey.CredentialPath(name); err != nil {
			a.log.Error("state key unusable: Secrets and service account tokens are kept on tmpfs only; after a reboot, pods that use them wait for the apiserver", "err", err)
			return nil
		}
	}
	key, made, err := statekey.Load(path, a.cfg.StateKeyTPM)
	switch {
	case err == nil:
		if made {
			a.log.Info("new state key made and sealed by the TPM", "file", path, "tpm", a.cfg.StateKeyTPM)
		}
		sealedBy := cmp.Or(a.cfg.StateKeyTPM, "none (the file is the key)")
		if a.cfg.StateKeyCredential != "" {
			sealedBy = "systemd (credential " + a.cfg.StateKeyCredential + ")"
		}
		a.log.Info("state key loaded: Secrets, service account tokens and pod records are kept encrypted for offline reboots", "file", path,
			"keyID", key.ID(), "sealedBy", sealedBy, "sealConfigMaps", a.cfg.SealConfigMaps)
		return key
	case errors.Is(err, fs.ErrNotExist):
		a.log.Warn("no state key file: Secrets and service account tokens are kept on tmpfs only; after a reboot, pods that use them wait for the apiserver",
			"file", path)
	default:
		a.log.Error("state key unusable: Secrets and service account tokens are kept on tmpfs only; after a reboot, pods that use them wait for the apiserver",
			"file", path, "err", err)
	}
	return nil
}

// reportStore logs what opening the state database found and returns the node condition
// that tells the cluster about a database that had to be moved aside.
func (a *Agent) reportStore(r offline.OpenReport) []v1.NodeCondition {
	switch {
	case r.Recovered != nil:
		a.log.Error("state database was unusable: moved aside and started empty; rebuilding from containerd, manifests and the apiserver",
			"path", r.Path, "kind", r.Recovered.Kind, "movedTo", r.Recovered.MovedTo, "err", r.Recovered.Err, "olderCopiesRemoved", r.Recovered.Removed)
		return []v1.NodeCondition{{
			Type:    node.ConditionStateRecovered,
			Status:  v1.ConditionTrue,
			Reason:  "StateDatabase" + string(r.Recovered.Kind),
			Message: fmt.Sprintf("state database %s was unusable (%v); kept at %s; running containers were kept and the cache is being rebuilt", r.Path, r.Recovered.Err, r.Recovered.MovedTo),
		}}
	case r.MigratedFrom != 0:
		a.log.Info("state database migrated", "path", r.Path, "from", r.MigratedFrom, "to", r.SchemaVersion)
	case r.Created:
		a.log.Info("state database created", "path", r.Path)
	default:
		// Said at every start: after a power cut, this is the line that tells the operator the
		// database survived it.
		a.log.Info("state database opened", "path", r.Path, "schemaVersion", r.SchemaVersion)
	}
	for key, reason := range r.Quarantined {
		a.log.Warn("state record quarantined", "key", key, "reason", reason)
	}
	if r.Sealed > 0 {
		a.log.Info("state records kept in the clear before the state key was configured are now encrypted with it", "records", r.Sealed)
	}
	if r.KeyChangedFrom != "" {
		a.log.Warn("the state key changed: the pods, Secrets and tokens the old key encrypted are not restored offline; they are read again from the apiserver",
			"oldKeyID", r.KeyChangedFrom)
	}
	if r.KeyMissing != "" {
		a.log.Error("the state database is encrypted with a state key that is not loaded: pods are not kept for offline reboots (none is written in the clear) until the key is back; to run without encryption, remove the database",
			"keyID", r.KeyMissing, "path", r.Path)
	}
	return nil
}

// openPolicies loads the node's Wasm policies, if it has any. A policies.yaml that cannot be
// read or parsed is an error: the caller then refuses new pods (running without the owner's
// admission policies would admit what they exist to refuse) and keeps the running ones.
func (a *Agent) openPolicies(ctx context.Context, store policy.ModuleStore, recorder record.EventRecorder) (*policy.Manager, error) {
	if a.cfg.PolicyDir == "" {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(a.cfg.PolicyDir, "policies.yaml")); os.IsNotExist(err) {
		return nil, nil
	}
	pm, err := policy.Open(ctx, policy.Options{
		Dir:      a.cfg.PolicyDir,
		CacheDir: a.cfg.PolicyCacheDir,
		Logger:   a.log.With("component", "policy"),
		Metrics:  a.metrics,
		// Modules delivered from registries (module: oci://...) are kept for offline boots,
		// and reached as image pulls reach registries: one configuration for both.
		Modules: store,
		Registry: policy.RegistryOptions{
			Hosts:           a.registryHosts,
			CredentialsFile: a.cfg.Containerd.RegistryCredentialsFile,
		},
		OnFailure: func(f policy.Failure) {
			serving := "no module serves: its failurePolicy applies"
			if f.Serving != "" {
				serving = "the previous module " + f.Serving + " keeps serving"
			}
			recorder.Eventf(a.nodeRef(), v1.EventTypeWarning, ReasonPolicyLoadFailed, "%v; %s", f.Err, serving)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("load policies from %s: %w", a.cfg.PolicyDir, err)
	}
	a.log.Info("policies loaded", "dir", a.cfg.PolicyDir)
	return pm, nil
}

// waitFor connects to the container runtime what names at address, retrying with back-off
// until ctx ends: at boot it may come up after the agent.
func waitFor[R interface {
	Version(context.Context) (string, error)
}](ctx context.Context, a *Agent, what, address string, connect func() (R, error)) (R, error) {
	delay := 500 * time.Millisecond
	for {
		rt, err := connect()
		if err == nil {
			v, _ := rt.Version(ctx)
			a.log.Info("connected to container runtime", "address", address, "version", v)
			return rt, nil
		}
		a.log.Warn("container runtime not reachable; retrying", "address", address, "err", err, "retryIn", delay)
		// Waiting for the runtime is progress, not a hang: systemd's start timeout waits too.
		systemd.ExtendStartTimeout(a.log, 2*delay+30*time.Second, "waiting for "+what+" at "+address)
		select {
		case <-ctx.Done():
			return rt, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// servingCertificate prepares the node API's cluster-issued serving certificate
// (serverTLSBootstrap), nil when it is not asked for or the node API is not served. A failure
// leaves the self-signed certificate in use, and says so.
func (a *Agent) servingCertificate(client kube.Interface, hostIPs func() []string) *identity.Serving {
	cfg := a.cfg
	if !cfg.ServerTLSBootstrap || cfg.NodeAPIPort() == 0 || client == nil {
		return nil
	}
	serving, err := identity.NewServing(cfg.NodeName, filepath.Join(cfg.StateDir, "pki"), hostIPs, client, a.log.With("component", "serving-certificate"))
	if err != nil {
		a.log.Error("node API serving certificate not requested; serving a self-signed one", "err", err)
		return nil
	}
	return serving
}

// nodeAPI builds the kubelet API server (agent/nodeapi), nil when neither its port nor the
// local socket is enabled. Standalone (no apiserver to authorize requests) it serves the local
// socket only.
func (a *Agent) nodeAPI(client kube.Interface, hostIPs func() []string, statusMgr *status.Manager, rt nodeapi.Runtime,
	netMgr podNetworks, podMgr *pods.Manager, usage *stats.Provider, serving *identity.Serving, recent *events.Recent) (*nodeapi.Server, error) {
	cfg := a.cfg
	if cfg.NodeAPIPort() == 0 && cfg.LocalAPISocket == "" {
		return nil, nil
	}
	var servingCert func() *tls.Certificate
	if serving != nil {
		servingCert = serving.Current
	}
	return nodeapi.New(nodeapi.Config{
		Address:            cfg.Address,
		Port:               cfg.NodeAPIPort(),
		NodeName:           cfg.NodeName,
		HostIPs:            hostIPs,
		PKIDir:             filepath.Join(cfg.StateDir, "pki"),
		ServingCertificate: servingCert,
		ClientCAFile:       cfg.Authentication.X509.ClientCAFile,
		Client:             client,
		Pods:               statusMgr,
		Runtime:            rt,
		NetNS:              netMgr.NetNSPath,
		Healthy:            podMgr.RelistHealthy,
		Restart:            podMgr.Restart,
		Admission:          podMgr.Admission,
		Events:             recent.For,
		Stats:              usage,
		Metrics:            a.metrics.Handler(),
		Log:                a.log.With("component", "nodeapi"),
	})
}

// serveHealthz serves /healthz (200 when the runtime relist is healthy) on the configured
// address, and nothing else: like the kubelet's 10248 it answers without authentication, to
// any local process and hostNetwork pod, so what pods run and how is only on the local API
// socket (root only) and the authenticated node API.
func (a *Agent) serveHealthz(ctx context.Context, podMgr *pods.Manager) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := podMgr.RelistHealthy(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	ln, err := net.Listen("tcp", a.cfg.HealthzAddress)
	if err != nil {
		return fmt.Errorf("listen on healthz address %s: %w", a.cfg.HealthzAddress, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutCtx)
		<-errCh
		return nil
	case err := <-errCh:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("healthz server: %w", err)
	}
}
