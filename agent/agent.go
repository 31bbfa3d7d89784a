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

	"github.com/containerd/containerd/v2/pkg/apparmor"
	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/events"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/agent/identity"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/nodeapi"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/services"
	"github.com/holdfast-dev/holdfast/agent/sources"
	"github.com/holdfast-dev/holdfast/agent/statekey"
	"github.com/holdfast-dev/holdfast/agent/stats"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/systemd"
	"github.com/holdfast-dev/holdfast/agent/volumes"
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
// containers and pod networks exist only in memory (agent/hollow). Several run in one
// process, each with its own configuration, state directory and metrics.
func NewHollow(cfg config.Config, log *slog.Logger, version string) *Agent {
	return &Agent{cfg: cfg, log: log, version: version, hollow: true}
}

// Run runs the agent until ctx ends. Ending it stops the agent, never the pods: containers
// keep running and are adopted by the next start.
func (a *Agent) Run(ctx context.Context) error {
	cfg := a.cfg
	a.metrics = metrics.New()
	boot := a.metrics.Boot()
	if !a.hollow {
		// klog's logger is the process's, and setting it races with anything logging: the
		// hollow command, whose nodes share one process, sets it once before they start.
		klog.SetSlogLogger(a.log.With("component", "client-go"))
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	// The state database first: its lock keeps a second agent on the same state directory
	// from touching anything (the logger, the PKI, the containers) before it gives up.
	stateKey := a.loadStateKey()
	store, report, err := offline.Open(filepath.Join(cfg.StateDir, "state.db"), offline.Options{Key: stateKey, SealConfigMaps: a.cfg.SealConfigMaps})
	if err != nil {
		return fmt.Errorf("%w (is another holdfast running with state dir %s?)", err, cfg.StateDir)
	}
	defer store.Close()
	boot.Done("open_store")

	be, err := a.openBackend(ctx, boot)
	if err != nil {
		return err
	}
	defer be.close()
	rt, netMgr := be.runtime, be.network

	var client, heartbeatClient kubernetes.Interface
	reach := &node.Reachability{Metrics: a.metrics}
	var id *identity.Identity
	if !cfg.Standalone() {
		// The node's identity: a kubeconfig as it is, or a certificate bootstrapped with a
		// token and renewed (agent/identity). Never waits for the apiserver.
		id, err = identity.New(identity.Options{
			NodeName:            cfg.NodeName,
			Kubeconfig:          cfg.Kubeconfig,
			BootstrapKubeconfig: cfg.BootstrapKubeconfig,
			PKIDir:              filepath.Join(cfg.StateDir, "pki"),
			Log:                 a.log.With("component", "identity"),
		})
		if err != nil {
			return err
		}
		restCfg := id.RESTConfig()
		restCfg.UserAgent = "holdfast/" + a.version
		restCfg.QPS, restCfg.Burst = 50, 100
		httpClient, err := rest.HTTPClientFor(restCfg)
		if err != nil {
			return fmt.Errorf("apiserver client: %w", err)
		}
		if client, err = kubernetes.NewForConfigAndClient(restCfg, httpClient); err != nil {
			return fmt.Errorf("apiserver client: %w", err)
		}
		// The heartbeats (Lease, node status) get a client of their own with a deadline on
		// every request, the kubelet's: on a link that died without a reset a request would
		// otherwise hang until the connection's health check gave up (76 s measured by
		// TestApiserverBlackhole), past the Lease's duration. It shares the other client's
		// transport, so both use one HTTP/2 connection, which the watches keep open: a
		// transport of its own would close its connection after 90 s idle, and each Lease
		// renewal of the metered profile (every 2m) would pay a new TLS handshake, several
		// times the renewal's bytes (docs/benchmarks.md, "Uplink").
		hbCfg := rest.CopyConfig(restCfg)
		hbCfg.QPS = -1 // never throttled behind the other requests
		hbHTTP := &http.Client{
			// Its answers say whether the apiserver is reachable: the node status is written
			// only when it changed, so the Lease renewals are the requests made whatever happens.
			Transport: reach.Wrap(httpClient.Transport),
			Timeout:   min(cfg.NodeStatus.UpdateFrequency.Duration, cfg.NodeStatus.LeaseDuration.Duration),
		}
		if heartbeatClient, err = kubernetes.NewForConfigAndClient(hbCfg, hbHTTP); err != nil {
			return fmt.Errorf("apiserver heartbeat client: %w", err)
		}
		boot.Done("identity")
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	// The agent's recent events, for `holdfast describe` when the apiserver is out of reach.
	recent := events.NewRecent(20, 2000)
	broadcaster.StartEventWatcher(func(e *v1.Event) {
		a.log.Info("event", "object", e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name,
			"type", e.Type, "reason", e.Reason, "message", e.Message)
		recent.Add(e)
	})
	// Events recorded while the apiserver is out of reach wait in a bounded backlog.
	var eventBacklog *events.Backlog
	if client != nil {
		eventBacklog = events.NewBacklog(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, events.DefaultBacklogSize, a.log.With("component", "events"))
		broadcaster.StartRecordingToSink(eventBacklog)
		a.metrics.WatchEventBacklog(eventBacklog)
	}
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "holdfast", Host: cfg.NodeName})

	hostIPs := node.NewAddressKeeper(cfg.NodeIP, cfg.StateDir).IPs
	a.metrics.WatchStore(store, store.Path())
	stateCondition := a.reportStore(report)
	for _, c := range stateCondition {
		recorder.Eventf(a.nodeRef(), v1.EventTypeWarning, c.Reason, "%s", c.Message)
	}

	statusMgr := status.NewManager(client, store, cfg.NodeName, a.log.With("component", "status"))
	a.metrics.WatchOutbox(statusMgr.Pending)
	reserved, err := a.reservations()
	if err != nil {
		return err
	}
	// Allocatable is the capacity, which does not change while the agent runs, less what is
	// reserved: what resourceFieldRef without limits reads, as with kubelet.
	capacity, err := node.Capacity(cfg.StateDir, cfg.MaxPods)
	if err != nil {
		a.log.Warn("measure node capacity; resourceFieldRef without limits will read 0", "err", err)
	}
	allocatable := node.Allocatable(capacity, reserved(capacity))
	volMgr := volumes.NewManager(filepath.Join(cfg.StateDir, "pods"), client, recorder, a.log.With("component", "volumes"), volumes.Options{
		ResyncPeriod:   cfg.Pods.VolumeResyncPeriod.Duration,
		Allocatable:    func() v1.ResourceList { return allocatable },
		Cache:          store,
		PersistSecrets: stateKey != nil,
		APIDown:        reach.Down,
		PlainDirs:      a.hollow,
	})
	svcCache := services.NewCache(client, cfg.StateDir, a.log.With("component", "services"))
	podMgr := pods.NewManager(pods.Config{
		StateDir:        cfg.StateDir,
		PodLogDir:       cfg.PodLogDir,
		RelistPeriod:    cfg.Pods.RelistPeriod.Duration,
		RelistThreshold: cfg.Pods.RelistThreshold.Duration,
		BackOffBase:     cfg.Pods.BackOffBase.Duration,
		BackOffMax:      cfg.Pods.BackOffMax.Duration,
		HostIPs:         hostIPs,
		Volumes:         volMgr,
		Security:        nodeSecurity(cfg),

		ImagePullBackOffBase:    cfg.Pods.ImagePullBackOffBase.Duration,
		ImagePullBackOffMax:     cfg.Pods.ImagePullBackOffMax.Duration,
		RegistryCredentialsFile: cfg.Containerd.RegistryCredentialsFile,

		NodeName:       cfg.NodeName,
		DNS:            network.DNSSettings{ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain},
		Services:       svcCache,
		MemoryCapacity: capacity.Memory().Value(),
		NoSwap:         cgroups.Host().SwapController(),
		Metrics:        a.metrics,
	}, rt, netMgr, statusMgr, recorder, a.log.With("component", "pods"))
	svcCache.OnKnown(podMgr.ResyncAll)

	imageFS := be.imageFS
	collector, err := gc.New(gc.Config{
		Period:                    cfg.GC.Period.Duration,
		MaxDeadPerContainer:       cfg.GC.MaxDeadPerContainer,
		PodLogDir:                 cfg.PodLogDir,
		ImageHighThresholdPercent: cfg.GC.ImageHighThresholdPercent,
		ImageLowThresholdPercent:  cfg.GC.ImageLowThresholdPercent,
		ImageMinAge:               cfg.GC.ImageMinAge.Duration,
		PinnedImages:              append(append([]string{}, cfg.GC.PinnedImages...), be.preloaded...),
	}, rt, be.images,
		imageFS, podMgr, a.log.With("component", "gc"))
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}

	// What the node has and uses: eviction's signals, and the node API's stats.
	host := eviction.HostObserver{NodeFS: cfg.StateDir, ImageFS: imageFS.Root}
	activePods := func() []*v1.Pod { pods, _ := podMgr.ActivePods(); return pods }
	usage := &stats.Provider{NodeName: cfg.NodeName, Usage: be.usage, Pods: activePods, Runtime: rt, Host: host}
	evictionMgr, err := a.evictionManager(rt, be.usage, host, podMgr, collector, recorder)
	if err != nil {
		return err
	}

	adm := &admitter{nodeName: cfg.NodeName, nodeLabels: cfg.NodeLabels, storageDir: cfg.StateDir, maxPods: cfg.MaxPods,
		sysctls: allowedSysctls(cfg), appArmor: apparmor.HostSupports(), pressure: evictionMgr, reserved: reserved}
	policies, err := a.openPolicies(ctx, store, recorder)
	if err != nil {
		// Fail closed for new pods only: running pods were admitted and keep running.
		a.log.Error("policies unusable: new pods are refused until the configuration is fixed and the agent restarted", "err", err)
		adm.policyErr = err
	}
	if policies != nil {
		defer policies.Close(context.WithoutCancel(ctx))
		adm.policies = policies
	}
	podMgr.SetAdmission(adm, store)
	boot.Done("load_policies")

	var probePolicies prober.PolicyProber // a nil interface, not a nil *policy.Manager
	if policies != nil {
		probePolicies = policies
	}
	handlers := prober.NewHandlers(rt, probePolicies)
	probeMgr := prober.NewManager(prober.Config{
		Handler:              handlers,
		Recorder:             recorder,
		OnStatusChange:       podMgr.Resync,
		OnContainerUnhealthy: func(uid types.UID, _, _, _ string) { podMgr.Resync(uid) },
		Log:                  a.log.With("component", "prober"),
	})
	podMgr.SetProber(probeMgr, handlers)

	g, ctx := errgroup.WithContext(ctx)
	if policies != nil {
		g.Go(func() error { return policies.Run(ctx) })
	}
	var ready []func() bool
	var apiReachable func() error // nil: standalone
	if cfg.ManifestDir != "" {
		fs := &sources.FileSource{Dir: cfg.ManifestDir, NodeName: cfg.NodeName, Sink: podMgr, Log: a.log.With("component", "static"), Recorder: recorder}
		ready = append(ready, fs.Ready)
		g.Go(func() error { return fs.Run(ctx) })
	}
	if client != nil {
		api := &sources.APISource{Client: client, NodeName: cfg.NodeName, Sink: podMgr, Store: store,
			Log: a.log.With("component", "apisource"), Recorder: recorder, OnMirrorDeleted: statusMgr.MirrorDeleted, OnStatus: statusMgr.Observed,
			Orphans: &sources.OrphanedMirrors{AllReady: podMgr.SourcesReady, StaticPodRuns: podMgr.RunsStaticPod, DeleteOrphan: statusMgr.DeleteOrphanedMirror}}
		// Boot from the cache first, with no apiserver call on the path; the informer then
		// reconciles when the apiserver answers.
		if n := api.Restore(); n > 0 {
			a.log.Info("restored cached pods", "pods", n)
		}
		if n := statusMgr.RestoreOutbox(); n > 0 {
			a.log.Info("status updates waiting for the apiserver", "pods", n)
		}
		boot.Done("restore_pods")
		factory := api.Start()
		ready = append(ready, api.Ready)
		g.Go(func() error { return api.Run(ctx, factory) })
		g.Go(func() error { return id.Run(ctx, recorder) })
		conditions := func() []v1.NodeCondition { return policyConditions(policies, adm.policyErr) }
		if id.Bootstrapped() {
			conditions = func() []v1.NodeCondition {
				return append([]v1.NodeCondition{id.Condition()}, policyConditions(policies, adm.policyErr)...)
			}
		}
		nc := node.NewController(node.Config{
			NodeName:        cfg.NodeName,
			AgentVersion:    a.version,
			NodeIP:          cfg.NodeIP,
			HostIPs:         hostIPs,
			Labels:          cfg.NodeLabels,
			MaxPods:         cfg.MaxPods,
			StorageDir:      cfg.StateDir,
			LeaseDuration:   cfg.NodeStatus.LeaseDuration.Duration,
			RenewInterval:   cfg.NodeStatus.LeaseRenewInterval.Duration,
			UpdateFrequency: cfg.NodeStatus.UpdateFrequency.Duration,
			ReportFrequency: cfg.NodeStatus.ReportFrequency.Duration,
			ExtraConditions: stateCondition,
			Conditions:      conditions,
			UnderPressure:   evictionMgr.UnderPressure,
			Reserved:        reserved,
			KubeletPort:     int32(cfg.NodeAPIPort()),
			Metrics:         a.metrics,
			// As the kubelet: repeated Lease failures close every connection, so that the
			// informer's watch, hung on a dead link, reconnects.
			OnRepeatedHeartbeatFailure: id.CloseAllConns,
			// The Node from a watch, not a GET every UpdateFrequency.
			Watch:        client,
			Reachability: reach,
		}, heartbeatClient, rt.Version, func() error {
			if err := podMgr.RelistHealthy(); err != nil {
				return err
			}
			if err := netMgr.Ready(); err != nil {
				return err
			}
			return nil
		}, a.log.With("component", "node"))
		g.Go(func() error { return nc.Run(ctx) })
		apiReachable = nc.APIReachable
	}
	podMgr.SetSourcesReady(func() bool {
		for _, r := range ready {
			if !r() {
				return false
			}
		}
		return true
	})
	if eventBacklog != nil {
		g.Go(func() error { return eventBacklog.Run(ctx) })
	}
	g.Go(func() error { return podMgr.Run(ctx) })
	g.Go(func() error { return netMgr.Run(ctx) })
	if be.run != nil {
		g.Go(func() error { return be.run(ctx) })
	}
	g.Go(func() error { return collector.Run(ctx) })
	g.Go(func() error { return evictionMgr.Run(ctx) })
	g.Go(func() error { return volMgr.Run(ctx) })
	g.Go(func() error { return svcCache.Run(ctx) })
	g.Go(func() error { return probeMgr.Run(ctx) })
	g.Go(func() error { return statusMgr.Run(ctx) })
	if cfg.HealthzAddress != "" {
		g.Go(func() error { return a.serveHealthz(ctx, podMgr) })
	}
	serving := a.servingCertificate(client, hostIPs)
	if serving != nil {
		g.Go(func() error { return serving.Run(ctx) })
	}
	if api, err := a.nodeAPI(client, hostIPs, statusMgr, rt, netMgr, podMgr, usage, serving, recent); err != nil {
		// Not worth stopping the agent, and with it the node's heartbeat, for.
		a.log.Error("node API not served: fix the configuration and restart holdfast", "err", err)
	} else if api != nil {
		a.metrics.WatchTokenReviews(api)
		if cfg.NodeAPIPort() != 0 && !cfg.Tunnel.Only {
			g.Go(func() error { return api.Run(ctx) })
		}
		if cfg.Tunnel.Server != "" && client != nil {
			g.Go(func() error { return a.runTunnel(ctx, api, hostIPs) })
		}
		if cfg.LocalAPISocket != "" {
			g.Go(func() error { return api.ServeLocal(ctx, cfg.LocalAPISocket) })
		}
	}
	// Restored and running: tell systemd, and keep petting its watchdog while the relist is
	// healthy (the same health /healthz reports).
	notifier := &systemd.Notifier{
		Healthy: podMgr.RelistHealthy,
		Status:  func() string { return statusLine(len(podMgr.PodUIDs()), apiReachable) },
		Grace:   cfg.Pods.RelistThreshold.Duration,
		Log:     a.log.With("component", "systemd"),
	}
	g.Go(func() error { return notifier.Run(ctx) })
	boot.Done("start")
	a.log.Info("holdfast running", "node", cfg.NodeName, "version", a.version, "standalone", cfg.Standalone(),
		"manifests", cfg.ManifestDir, "containerd", cfg.Containerd.Address)
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
			Hosts: func(ctx context.Context, registry string) ([]policy.RegistryHost, error) {
				endpoints, err := runtime.PullEndpoints(ctx, a.cfg.Containerd.RegistryConfigPath, registry)
				hosts := make([]policy.RegistryHost, 0, len(endpoints))
				for _, ep := range endpoints {
					hosts = append(hosts, policy.RegistryHost(ep))
				}
				return hosts, err
			},
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

// connectRuntime waits for containerd at address, in namespace: at boot it may come up after
// the agent.
func (a *Agent) connectRuntime(ctx context.Context, address, namespace string) (*runtime.Runtime, error) {
	return waitFor(ctx, a, "containerd", address, func() (*runtime.Runtime, error) {
		return runtime.Connect(ctx, address, namespace, a.log.With("component", "runtime"),
			runtime.WithRegistryConfigPath(a.cfg.Containerd.RegistryConfigPath),
			runtime.WithRequestTimeout(a.cfg.Containerd.RequestTimeout.Duration),
			runtime.WithPullProgressTimeout(a.cfg.Containerd.ImagePullProgressTimeout.Duration),
			// The stdin FIFOs of containers with stdin: true (kubectl attach -i).
			runtime.WithIODir(filepath.Join(a.cfg.StateDir, "io")))
	})
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

// preloadImages imports the firmware's image tarballs before any pod starts and returns the
// names imported (or found present), which image collection pins. A bad tarball is reported
// with its path and skipped; the pods that need it will say ErrImageNeverPull.
func (a *Agent) preloadImages(ctx context.Context, rt *runtime.Runtime) []string {
	if a.cfg.ImagePreloadDir == "" {
		return nil
	}
	results, err := rt.ImportDir(ctx, a.cfg.ImagePreloadDir)
	if err != nil {
		a.log.Error("preload images", "dir", a.cfg.ImagePreloadDir, "err", err)
		return nil
	}
	var names []string
	for _, r := range results {
		names = append(names, r.Images...) // a tarball that failed half-way still pins what it imported
		if r.Err != nil {
			a.log.Error("preload image tarball; skipped", "path", r.Path, "err", r.Err)
			continue
		}
		if r.Skipped {
			a.log.Info("preloaded images already present", "path", r.Path, "images", r.Images)
			continue
		}
		a.log.Info("preloaded images", "path", r.Path, "images", r.Images)
	}
	return names
}

// servingCertificate prepares the node API's cluster-issued serving certificate
// (serverTLSBootstrap), nil when it is not asked for or the node API is not served. A failure
// leaves the self-signed certificate in use, and says so.
func (a *Agent) servingCertificate(client kubernetes.Interface, hostIPs func() []string) *identity.Serving {
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
func (a *Agent) nodeAPI(client kubernetes.Interface, hostIPs func() []string, statusMgr *status.Manager, rt nodeapi.Runtime,
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
