package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/events"
	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/eviction"
	"github.com/holdfast-dev/holdfast/agent/gc"
	"github.com/holdfast-dev/holdfast/agent/identity"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/memtrim"
	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/node"
	"github.com/holdfast-dev/holdfast/agent/podcgroups"
	"github.com/holdfast-dev/holdfast/agent/pods"
	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/agent/prober"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/services"
	"github.com/holdfast-dev/holdfast/agent/sources"
	"github.com/holdfast-dev/holdfast/agent/stats"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/agent/systemd"
	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/offline"
)

// run is one run of the agent (Agent.Run): what each step of its start builds, for the steps
// after it. The steps, in order:
//
//	openState       the state directory, its key and database (the lock against a second agent)
//	openRuntime     the container runtime and pod networks (waiting for the runtime)
//	connectAPI      the node's identity and apiserver clients (not standalone; no call made)
//	recordEvents    events to the log, `holdfast describe` and the apiserver; the store's report
//	buildPods       status, volumes, services and the pod manager
//	buildReclaim    image and container collection, stats and node-pressure eviction
//	buildAdmission  the node's admission checks and the Wasm policies
//	buildProber     probes and lifecycle hooks
//	runPolicies     the policies' background work
//	startFileSource the static pods' manifests
//	restore         the API pods and status updates the store kept (no apiserver call)
//	startAPI        the API source, the identity's renewal, the node's registration and Lease
//	runPods         the pod manager (which adopts the containers found) and the node's managers
//	serve           /healthz, the node API, the tunnel, the local socket, systemd
//
// Up to buildProber nothing runs in the background: a step that fails returns its error, and
// Run closes what the steps before it opened. From runPolicies on, each step starts
// goroutines in Run's errgroup, each under its context, all waited for by Run.
type run struct {
	a    *Agent
	cfg  config.Config
	boot *metrics.Boot

	stateKey *offline.Key
	store    *offline.BoltStore
	report   offline.OpenReport

	be *backend

	// Nil when standalone.
	id                      *identity.Identity
	client, heartbeatClient kube.Interface
	reach                   *node.Reachability

	broadcaster    record.EventBroadcaster
	recorder       record.EventRecorder
	recent         *events.Recent
	eventBacklog   *events.Backlog // nil when standalone
	stateCondition []v1.NodeCondition

	hostIPs   func() []string
	statusMgr *status.Manager
	reserved  func(capacity v1.ResourceList) v1.ResourceList
	// podCgroups is nil with cgroupsPerQOS off (and on hollow nodes).
	podCgroups *podcgroups.Manager
	volMgr     *volumes.Manager
	svcCache   *services.Cache
	podMgr     *pods.Manager

	collector   *gc.GC
	usage       *stats.Provider
	evictionMgr *eviction.Manager

	adm      *admitter
	policies *policy.Manager // nil: none
	probeMgr *prober.Manager

	ready        []func() bool      // each source's readiness
	api          *sources.APISource // nil when standalone
	apiReachable func() error       // nil when standalone
}

// newRun begins a run: its metrics (one set per run) and the boot timer, and client-go's
// logger.
func (a *Agent) newRun() *run {
	a.metrics = metrics.New()
	r := &run{a: a, cfg: a.cfg, boot: a.metrics.Boot()}
	if !a.hollow {
		// klog's logger is the process's, and setting it races with anything logging: the
		// hollow command, whose nodes share one process, sets it once before they start.
		klog.SetSlogLogger(a.log.With("component", "client-go"))
	}
	return r
}

// openState makes the state directory and opens the state database with its key. After it,
// this agent alone uses the state directory: the database's lock keeps a second agent on
// it from touching anything (the logger, the PKI, the containers) before it gives up.
func (r *run) openState() error {
	if err := os.MkdirAll(r.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	r.stateKey = r.a.loadStateKey()
	store, report, err := offline.Open(filepath.Join(r.cfg.StateDir, "state.db"), offline.Options{Key: r.stateKey, SealConfigMaps: r.cfg.SealConfigMaps})
	if err != nil {
		return fmt.Errorf("%w (is another holdfast running with state dir %s?)", err, r.cfg.StateDir)
	}
	r.store, r.report = store, report
	r.boot.Done("open_store")
	return nil
}

// openRuntime opens the backend (openBackend). After it, the container runtime answers (the
// step waits for it, as long as it takes), the preloaded images are imported, and the pods'
// containers of earlier runs are there to be adopted: nothing of them was touched.
func (r *run) openRuntime(ctx context.Context) error {
	be, err := r.a.openBackend(ctx, r.boot)
	if err != nil {
		return err
	}
	r.be = be
	return nil
}

// connectAPI builds the node's identity and its apiserver clients, unless standalone. It
// never waits for the apiserver: after it, the clients exist, and nothing has been asked of
// the apiserver yet.
func (r *run) connectAPI() error {
	cfg := r.cfg
	r.reach = &node.Reachability{Metrics: r.a.metrics}
	if cfg.Standalone() {
		return nil
	}
	// The node's identity: a kubeconfig as it is, or a certificate bootstrapped with a
	// token and renewed (agent/identity). Never waits for the apiserver.
	id, err := identity.New(identity.Options{
		NodeName:            cfg.NodeName,
		Kubeconfig:          cfg.Kubeconfig,
		BootstrapKubeconfig: cfg.BootstrapKubeconfig,
		PKIDir:              filepath.Join(cfg.StateDir, "pki"),
		Log:                 r.a.log.With("component", "identity"),
	})
	if err != nil {
		return err
	}
	r.id = id
	restCfg := id.RESTConfig()
	restCfg.UserAgent = "holdfast/" + r.a.version
	restCfg.QPS, restCfg.Burst = 50, 100
	httpClient, err := rest.HTTPClientFor(restCfg)
	if err != nil {
		return fmt.Errorf("apiserver client: %w", err)
	}
	if r.client, err = kube.NewForConfigAndClient(restCfg, httpClient); err != nil {
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
		Transport: r.reach.Wrap(httpClient.Transport),
		Timeout:   min(cfg.NodeStatus.UpdateFrequency.Duration, cfg.NodeStatus.LeaseDuration.Duration),
	}
	if r.heartbeatClient, err = kube.NewForConfigAndClient(hbCfg, hbHTTP); err != nil {
		return fmt.Errorf("apiserver heartbeat client: %w", err)
	}
	r.boot.Done("identity")
	return nil
}

// recordEvents sets up the event recorder the parts built next are given, and tells what
// opening the state database found. After it, an event recorded reaches the log and the
// agent's recent events (`holdfast describe`, offline too), and, with an apiserver, a
// bounded backlog that waits for it; the broadcaster's watchers stop when ctx ends or at
// Shutdown.
func (r *run) recordEvents(ctx context.Context) {
	log := r.a.log
	r.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
	// The agent's recent events, for `holdfast describe` when the apiserver is out of reach.
	r.recent = events.NewRecent(20, 2000)
	r.broadcaster.StartEventWatcher(func(e *v1.Event) {
		log.Info("event", "object", e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name,
			"type", e.Type, "reason", e.Reason, "message", e.Message)
		r.recent.Add(e)
	})
	// Events recorded while the apiserver is out of reach wait in a bounded backlog.
	if r.client != nil {
		r.eventBacklog = events.NewBacklog(&kube.EventSink{Interface: r.client.CoreV1().Events("")}, events.DefaultBacklogSize, log.With("component", "events"))
		r.broadcaster.StartRecordingToSink(r.eventBacklog)
		r.a.metrics.WatchEventBacklog(r.eventBacklog)
	}
	r.recorder = r.broadcaster.NewRecorder(kube.Scheme, v1.EventSource{Component: "holdfast", Host: r.cfg.NodeName})

	r.a.metrics.WatchStore(r.store, r.store.Path())
	r.stateCondition = r.a.reportStore(r.report)
	for _, c := range r.stateCondition {
		r.recorder.Eventf(r.a.nodeRef(), v1.EventTypeWarning, c.Reason, "%s", c.Message)
	}
}

// buildPods builds the pod manager and what its workers use: the status manager (with its
// outbox in the store), the volume manager and the services cache. After it the pod manager
// takes pods from sources, and starts none until it runs (runPods).
func (r *run) buildPods() error {
	cfg, a := r.cfg, r.a
	r.hostIPs = node.NewAddressKeeper(cfg.NodeIP, cfg.StateDir).IPs
	r.statusMgr = status.NewManager(r.client, r.store, cfg.NodeName, a.log.With("component", "status"))
	a.metrics.WatchOutbox(r.statusMgr.Pending)
	var err error
	if r.reserved, err = a.reservations(); err != nil {
		return err
	}
	// Allocatable is the capacity, which does not change while the agent runs, less what is
	// reserved: what resourceFieldRef without limits reads, as with kubelet.
	capacity, err := node.Capacity(cfg.StateDir, cfg.MaxPods)
	if err != nil {
		a.log.Warn("measure node capacity; resourceFieldRef without limits will read 0", "err", err)
	}
	allocatable := node.Allocatable(capacity, r.reserved(capacity))
	if err := r.buildPodCgroups(capacity); err != nil {
		return err
	}
	r.volMgr = volumes.NewManager(filepath.Join(cfg.StateDir, "pods"), r.client, r.recorder, a.log.With("component", "volumes"), volumes.Options{
		ResyncPeriod:   cfg.Pods.VolumeResyncPeriod.Duration,
		Allocatable:    func() v1.ResourceList { return allocatable },
		Cache:          r.store,
		PersistSecrets: r.stateKey != nil,
		APIDown:        r.reach.Down,
		PlainDirs:      a.hollow,
	})
	r.svcCache = services.NewCache(r.client, cfg.StateDir, a.log.With("component", "services"))
	r.podMgr = pods.NewManager(pods.Config{
		StateDir:        cfg.StateDir,
		PodLogDir:       cfg.PodLogDir,
		RelistPeriod:    cfg.Pods.RelistPeriod.Duration,
		RelistThreshold: cfg.Pods.RelistThreshold.Duration,
		BackOffBase:     cfg.Pods.BackOffBase.Duration,
		BackOffMax:      cfg.Pods.BackOffMax.Duration,
		HostIPs:         r.hostIPs,
		Volumes:         r.volMgr,

		ImagePullBackOffBase:    cfg.Pods.ImagePullBackOffBase.Duration,
		ImagePullBackOffMax:     cfg.Pods.ImagePullBackOffMax.Duration,
		RegistryCredentialsFile: cfg.Containerd.RegistryCredentialsFile,

		NodeName:       cfg.NodeName,
		DNS:            network.DNSSettings{ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain},
		Services:       r.svcCache,
		MemoryCapacity: capacity.Memory().Value(),
		NoSwap:         cgroups.Host().SwapController(),
		Metrics:        a.metrics,
		Cgroups:        r.podCgroupsOrNil(),
		Usage:          r.be.usage,
	}, r.be.runtime, r.be.network, r.statusMgr, r.recorder, a.log.With("component", "pods"))
	r.svcCache.OnKnown(r.podMgr.ResyncAll)
	return nil
}

// buildPodCgroups makes the kubelet's cgroup hierarchy (cgroupsPerQOS): kubepods capped at
// the node allocatable, the QoS levels, and the pod cgroups' manager the workers use; then
// removes the pod cgroups no container is in (pods gone while the agent was not running).
// Not for hollow nodes, whose containers are records.
func (r *run) buildPodCgroups(capacity v1.ResourceList) error {
	cfg, a := r.cfg, r.a
	if a.hollow || !*cfg.CgroupsPerQOS {
		return nil
	}
	kubepods, err := a.kubepodsLimits(capacity)
	if err != nil {
		return err
	}
	h := cgroups.Host()
	driver, err := podCgroupDriver(cfg.CgroupDriver, h)
	if err != nil {
		return err
	}
	if err := podcgroups.CheckDriverSwitch(h, cfg.CgroupDriver, cfg.CgroupRoot, a.log.With("component", "cgroups")); err != nil {
		return err
	}
	m := podcgroups.NewManager(podcgroups.Config{
		Hierarchy: h, Driver: driver, Root: cfg.CgroupRoot, EnforceCPULimits: *cfg.CPUCFSQuota,
		PodPidsLimit: cfg.PodPidsLimit, Kubepods: kubepods, Log: a.log.With("component", "cgroups"),
	})
	if err := m.Start(); err != nil {
		m.Close()
		return fmt.Errorf("pod cgroups (cgroupsPerQOS, cgroupDriver %s): %w", cfg.CgroupDriver, err)
	}
	a.log.Info("node allocatable enforced on kubepods", "cgroup", m.Layout().Kubepods(), "driver", cfg.CgroupDriver, "mode", h.Mode.String(), "memory", kubepods.Memory().String(), "cpu", kubepods.Cpu().String(), "enforceNodeAllocatable", cfg.EnforceNodeAllocatable)
	if err := a.enforceReservedCgroups(driver); err != nil {
		m.Close()
		return err
	}
	withContainers := map[types.UID]bool{}
	if list, err := r.be.runtime.List(context.Background()); err == nil {
		for _, c := range list {
			withContainers[types.UID(c.PodUID)] = true
		}
		if removed := m.Cleanup(func(uid types.UID) bool { return withContainers[uid] }); len(removed) > 0 {
			a.log.Info("removed orphaned pod cgroups", "pods", removed)
		}
	}
	r.podCgroups = m
	return nil
}

// trimMemory gives back to the kernel, once the boot has settled, the memory the start used
// and the steady state does not (memoryTrimAfter, agent/memtrim). Not in a process of hollow
// nodes: they share one executable, and a fleet simulation measures nothing of it.
func (r *run) trimMemory(ctx context.Context, g *errgroup.Group) {
	if r.a.hollow || r.cfg.MemoryTrimAfter == nil || r.cfg.MemoryTrimAfter.Duration == 0 {
		return
	}
	log := r.a.log.With("component", "memtrim")
	g.Go(func() error { return memtrim.Run(ctx, memtrim.Config{After: r.cfg.MemoryTrimAfter.Duration, Log: log}) })
}

// closePodCgroups releases what the pod cgroups' driver holds, once the agent stops: the
// systemd driver's D-Bus connection, whose reader goroutine would otherwise outlive Run.
func (r *run) closePodCgroups() {
	if r.podCgroups != nil {
		r.podCgroups.Close()
	}
}

// podCgroupDriver is the cgroupDriver's: the cgroupfs driver writes h; the systemd one talks
// to systemd over D-Bus, from the first cgroup it makes.
func podCgroupDriver(name string, h cgroups.Hierarchy) (podcgroups.Driver, error) {
	switch name {
	case podcgroups.DriverSystemd:
		return podcgroups.NewSystemd(h, podcgroups.DialSystemd), nil
	case podcgroups.DriverCgroupfs, "":
		return h, nil
	}
	return nil, fmt.Errorf("cgroupDriver %q: want %q or %q", name, podcgroups.DriverCgroupfs, podcgroups.DriverSystemd)
}

// podCgroupsOrNil is the pod cgroups' manager for the workers: a nil interface, not a nil
// *podcgroups.Manager, with cgroupsPerQOS off.
func (r *run) podCgroupsOrNil() pods.PodCgroups {
	if r.podCgroups == nil {
		return nil
	}
	return r.podCgroups
}

// buildReclaim builds image and container collection, the node's stats, and the
// node-pressure eviction manager, which reclaims through collection before it evicts. After
// it, admission can ask whether the node is under pressure.
func (r *run) buildReclaim() error {
	cfg, a, be := r.cfg, r.a, r.be
	imageFS := be.imageFS
	collector, err := gc.New(gc.Config{
		Period:                    cfg.GC.Period.Duration,
		MaxDeadPerContainer:       cfg.GC.MaxDeadPerContainer,
		PodLogDir:                 cfg.PodLogDir,
		ImageHighThresholdPercent: cfg.GC.ImageHighThresholdPercent,
		ImageLowThresholdPercent:  cfg.GC.ImageLowThresholdPercent,
		ImageMinAge:               cfg.GC.ImageMinAge.Duration,
		PinnedImages:              append(append([]string{}, cfg.GC.PinnedImages...), be.preloaded...),
	}, be.runtime, be.images,
		imageFS, r.podMgr, a.log.With("component", "gc"))
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}
	r.collector = collector

	// What the node has and uses: eviction's signals, and the node API's stats.
	host := eviction.HostObserver{NodeFS: cfg.StateDir, ImageFS: imageFS.Root}
	activePods := func() []*v1.Pod { pods, _ := r.podMgr.ActivePods(); return pods }
	r.usage = &stats.Provider{NodeName: cfg.NodeName, Usage: be.usage, Pods: activePods, Runtime: be.runtime, Host: host}
	r.evictionMgr, err = a.evictionManager(be.runtime, be.usage, host, r.podMgr, collector, r.recorder)
	return err
}

// buildAdmission installs the pod manager's admission: the node's own checks, then the Wasm
// policies. Policies that cannot be loaded refuse new pods (fail closed) and leave the
// running ones alone. After it, every pod the manager is given is judged once in its life,
// and its decision kept in the store.
func (r *run) buildAdmission(ctx context.Context) {
	cfg, a := r.cfg, r.a
	r.adm = &admitter{nodeName: cfg.NodeName, nodeLabels: cfg.NodeLabels, storageDir: cfg.StateDir, maxPods: cfg.MaxPods,
		sysctls: allowedSysctls(cfg), appArmor: runtime.AppArmorEnabled(), pressure: r.evictionMgr, reserved: r.reserved}
	policies, err := a.openPolicies(ctx, r.store, r.recorder)
	if err != nil {
		// Fail closed for new pods only: running pods were admitted and keep running.
		a.log.Error("policies unusable: new pods are refused until the configuration is fixed and the agent restarted", "err", err)
		r.adm.policyErr = err
	}
	if policies != nil {
		r.policies = policies
		r.adm.policies = policies
	}
	r.podMgr.SetAdmission(r.adm, r.store)
	r.podMgr.SetResizeAdmission(r.adm)
	r.boot.Done("load_policies")
}

// buildProber installs the probe runner and the lifecycle hooks' handlers (Wasm probes
// through the policies). After it, a probe's change resyncs its pod.
func (r *run) buildProber() {
	var probePolicies prober.PolicyProber // a nil interface, not a nil *policy.Manager
	if r.policies != nil {
		probePolicies = r.policies
	}
	handlers := prober.NewHandlers(r.be.runtime, probePolicies)
	r.probeMgr = prober.NewManager(prober.Config{
		Handler:              handlers,
		Recorder:             r.recorder,
		OnStatusChange:       r.podMgr.Resync,
		OnContainerUnhealthy: func(uid types.UID, _, _, _ string) { r.podMgr.Resync(uid) },
		Log:                  r.a.log.With("component", "prober"),
	})
	r.podMgr.SetProber(r.probeMgr, handlers)
}

// runPolicies starts what the policies do in the background, if there are any.
func (r *run) runPolicies(ctx context.Context, g *errgroup.Group) {
	if r.policies != nil {
		g.Go(func() error { return r.policies.Run(ctx) })
	}
}

// startFileSource starts the static pod source, if there is a manifest directory: it hands the
// pod manager every manifest's pod, and is ready once it read the directory.
func (r *run) startFileSource(ctx context.Context, g *errgroup.Group) {
	cfg := r.cfg
	if cfg.ManifestDir == "" {
		return
	}
	fs := &sources.FileSource{Dir: cfg.ManifestDir, NodeName: cfg.NodeName, Sink: r.podMgr, Log: r.a.log.With("component", "static"), Recorder: r.recorder}
	r.ready = append(r.ready, fs.Ready)
	r.podMgr.SetStaticSourceReady(fs.Ready)
	g.Go(func() error { return fs.Run(ctx) })
}

// restore builds the API source and boots from what the store kept, with no apiserver call
// on the path: the cached API pods are handed to the pod manager and the status updates that
// wait for the apiserver are queued again. After it, an offline boot has every pod it had;
// the informer reconciles when the apiserver answers (startAPI). Standalone, nothing.
func (r *run) restore() {
	if r.client == nil {
		return
	}
	cfg, a := r.cfg, r.a
	r.api = &sources.APISource{Client: r.client, NodeName: cfg.NodeName, Sink: r.podMgr, Store: r.store,
		Log: a.log.With("component", "apisource"), Recorder: r.recorder, OnMirrorDeleted: r.statusMgr.MirrorDeleted, OnStatus: r.statusMgr.Observed,
		Orphans: &sources.OrphanedMirrors{AllReady: r.podMgr.SourcesReady, StaticPodRuns: r.podMgr.RunsStaticPod, DeleteOrphan: r.statusMgr.DeleteOrphanedMirror}}
	if n := r.api.Restore(); n > 0 {
		a.log.Info("restored cached pods", "pods", n)
	}
	if n := r.statusMgr.RestoreOutbox(); n > 0 {
		a.log.Info("status updates waiting for the apiserver", "pods", n)
	}
	r.boot.Done("restore_pods")
}

// startAPI starts, unless standalone, the API source (its informer, ready once the pod
// manager has every pod of its first list), the identity's renewal, and the node controller:
// the Node's registration, status and Lease, the node Ready while the relist is healthy and
// the pod networks are ready.
func (r *run) startAPI(ctx context.Context, g *errgroup.Group) {
	if r.client == nil {
		return
	}
	podInformer := r.api.Start()
	r.ready = append(r.ready, r.api.Ready)
	g.Go(func() error { return r.api.Run(ctx, podInformer) })
	g.Go(func() error { return r.id.Run(ctx, r.recorder) })
	nc := r.nodeController()
	g.Go(func() error { return nc.Run(ctx) })
	r.apiReachable = nc.APIReachable
}

// nodeController builds the node controller of startAPI.
func (r *run) nodeController() *node.Controller {
	cfg, id, policies, adm := r.cfg, r.id, r.policies, r.adm
	conditions := func() []v1.NodeCondition { return policyConditions(policies, adm.policyErr) }
	if id.Bootstrapped() {
		conditions = func() []v1.NodeCondition {
			return append([]v1.NodeCondition{id.Condition()}, policyConditions(policies, adm.policyErr)...)
		}
	}
	return node.NewController(node.Config{
		NodeName:        cfg.NodeName,
		AgentVersion:    r.a.version,
		NodeIP:          cfg.NodeIP,
		HostIPs:         r.hostIPs,
		Labels:          cfg.NodeLabels,
		MaxPods:         cfg.MaxPods,
		StorageDir:      cfg.StateDir,
		LeaseDuration:   cfg.NodeStatus.LeaseDuration.Duration,
		RenewInterval:   cfg.NodeStatus.LeaseRenewInterval.Duration,
		UpdateFrequency: cfg.NodeStatus.UpdateFrequency.Duration,
		ReportFrequency: cfg.NodeStatus.ReportFrequency.Duration,
		ExtraConditions: r.stateCondition,
		Conditions:      conditions,
		UnderPressure:   r.evictionMgr.UnderPressure,
		Reserved:        r.reserved,
		KubeletPort:     int32(cfg.NodeAPIPort()),
		Metrics:         r.a.metrics,
		// As the kubelet: repeated Lease failures close every connection, so that the
		// informer's watch, hung on a dead link, reconnects.
		OnRepeatedHeartbeatFailure: id.CloseAllConns,
		// The Node from a watch, not a GET every UpdateFrequency.
		Watch:        r.client,
		Reachability: r.reach,
	}, r.heartbeatClient, r.be.runtime.Version, func() error {
		if err := r.podMgr.RelistHealthy(); err != nil {
			return err
		}
		if err := r.be.network.Ready(); err != nil {
			return err
		}
		return nil
	}, r.a.log.With("component", "node"))
}

// runPods tells the pod manager when every source has delivered its pods, and starts it with
// the managers around it. The pod manager's workers start, and its relists adopt what runs:
// containers found are handed to their pods' workers, and those of pods no source claims to
// orphan workers once the sources are ready, never before.
func (r *run) runPods(ctx context.Context, g *errgroup.Group) {
	ready := r.ready
	r.podMgr.SetSourcesReady(func() bool {
		for _, ok := range ready {
			if !ok() {
				return false
			}
		}
		return true
	})
	if r.eventBacklog != nil {
		g.Go(func() error { return r.eventBacklog.Run(ctx) })
	}
	g.Go(func() error { return r.podMgr.Run(ctx) })
	g.Go(func() error { return r.be.network.Run(ctx) })
	if r.be.run != nil {
		g.Go(func() error { return r.be.run(ctx) })
	}
	g.Go(func() error { return r.collector.Run(ctx) })
	g.Go(func() error { return r.evictionMgr.Run(ctx) })
	g.Go(func() error { return r.volMgr.Run(ctx) })
	g.Go(func() error { return r.svcCache.Run(ctx) })
	g.Go(func() error { return r.probeMgr.Run(ctx) })
	g.Go(func() error { return r.statusMgr.Run(ctx) })
	if r.podCgroups != nil {
		// A pod with a worker keeps its cgroup; one with a process in it cannot lose it.
		g.Go(func() error { return r.podCgroups.Run(ctx, podcgroups.CleanupPeriod, r.podMgr.Known) })
	}
}

// serve serves what the node answers: /healthz, the node API (its port, the tunnel, the
// local socket) with its serving certificate, and systemd's readiness and watchdog. A node
// API that cannot be built is logged, not fatal: the node's heartbeat goes on without it.
func (r *run) serve(ctx context.Context, g *errgroup.Group) {
	cfg, a := r.cfg, r.a
	if cfg.HealthzAddress != "" {
		g.Go(func() error { return a.serveHealthz(ctx, r.podMgr) })
	}
	serving := a.servingCertificate(r.client, r.hostIPs)
	if serving != nil {
		g.Go(func() error { return serving.Run(ctx) })
	}
	if api, err := a.nodeAPI(r.client, r.hostIPs, r.statusMgr, r.be.runtime, r.be.network, r.podMgr, r.usage, serving, r.recent); err != nil {
		// Not worth stopping the agent, and with it the node's heartbeat, for.
		a.log.Error("node API not served: fix the configuration and restart holdfast", "err", err)
	} else if api != nil {
		a.metrics.WatchTokenReviews(api)
		if cfg.NodeAPIPort() != 0 && !cfg.Tunnel.Only {
			g.Go(func() error { return api.Run(ctx) })
		}
		if cfg.Tunnel.Server != "" && r.client != nil {
			g.Go(func() error { return a.runTunnel(ctx, api, r.hostIPs) })
		}
		if cfg.LocalAPISocket != "" {
			g.Go(func() error { return api.ServeLocal(ctx, cfg.LocalAPISocket) })
		}
	}
	// Restored and running: tell systemd, and keep petting its watchdog while the relist is
	// healthy (the same health /healthz reports).
	notifier := &systemd.Notifier{
		Healthy: r.podMgr.RelistHealthy,
		Status:  func() string { return statusLine(len(r.podMgr.PodUIDs()), r.apiReachable) },
		Grace:   cfg.Pods.RelistThreshold.Duration,
		Log:     a.log.With("component", "systemd"),
	}
	g.Go(func() error { return notifier.Run(ctx) })
}
