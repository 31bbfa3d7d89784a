// Package metrics holds holdfast's own Prometheus metrics, served at /metrics on the node API
// and the local socket: what the kubelet's pkg/kubelet/metrics is to the kubelet, with the
// kubelet's names under the holdfast_ prefix where the kubelet has one (pod worker and start
// durations, PLEG relist), and holdfast's own for what the kubelet does not have (the state
// store, the status outbox while offline, Wasm policies, boot phases).
//
// The metrics live in a registry of their own, made by New, not in component-base's global
// legacy registry: two agents in one process (tests) never share values, and /metrics serves
// holdfast's metrics and the process and Go collectors, not whatever a library registered
// globally. A nil *Metrics is valid and records nothing, so that the parts instrumented here
// run in unit tests without one.
package metrics

import (
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/component-base/metrics"

	"github.com/holdfast-dev/holdfast/offline"
)

const namespace = "holdfast"

// Label values of holdfast_pod_worker_duration_seconds.
const (
	// OperationCreate is a pod's first sync by its worker, OperationSync a later one,
	// OperationKill a sync that terminates the pod (the kubelet's operation types).
	OperationCreate = "create"
	OperationSync   = "sync"
	OperationKill   = "kill"

	ResultSuccess = "success"
	ResultError   = "error"
)

// Phases of a pod's start (holdfast_pod_start_phase_duration_seconds), in the order a start
// goes through them: what separates a pod's start from the runtime's own floor.
const (
	PhaseAdmission = "admission" // the admission handlers and Wasm admission policies
	PhaseNetwork   = "network"   // the pod's network namespace and CNI ADD
	PhaseVolumes   = "volumes"   // the pod's volumes written (tokens, ConfigMaps, Secrets, ...)
	PhaseImage     = "image"     // each container's image made present (a pull, or a look-up)
	PhaseCreate    = "create"    // each container's configuration built and created in containerd
	PhaseStart     = "start"     // each container's task created and started (shim, runc, logger)
	// PhaseOther is the rest of the start: waiting for the worker, runtime observations,
	// status computation, hooks, syncs that found something not ready yet.
	PhaseOther = "other"
)

// PodStartPhases lists the phases in order, PhaseOther last.
var PodStartPhases = []string{PhaseAdmission, PhaseNetwork, PhaseVolumes, PhaseImage, PhaseCreate, PhaseStart, PhaseOther}

// Boot milestones: seconds from the agent's start until each first happened.
const (
	MilestoneFirstRelist    = "first_relist"    // the runtime listed once: pods' state known
	MilestoneNodeRegistered = "node_registered" // the Node object registered with the apiserver
)

// Buckets sized for edge hardware, where an image pull over a slow uplink or an SD card's fsync
// is slow: the upper buckets reach further than the kubelet's.
var (
	// A pod sync: milliseconds when nothing changes, seconds to minutes when it pulls an image.
	syncBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	// Pod startup: the kubelet's kubelet_pod_start_duration_seconds buckets, up to 30 minutes.
	startBuckets = []float64{0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 600, 900, 1200, 1800}
	// A relist: the kubelet's PLEG relist buckets (5 ms doubling), to 10 s.
	relistBuckets = metrics.ExponentialBuckets(0.005, 2, 12)
	// A Wasm policy call: sub-millisecond for a compiled module, up to its timeout.
	policyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
)

// Metrics are one agent's metrics and the registry that serves them.
type Metrics struct {
	registry metrics.KubeRegistry
	start    time.Time
	now      func() time.Time

	podWorkerDuration *metrics.HistogramVec
	podStartDuration  *metrics.Histogram
	podStartPhase     *metrics.HistogramVec
	relistDuration    *metrics.Histogram
	relistErrors      *metrics.Counter
	policyEvaluations *metrics.CounterVec
	policyDuration    *metrics.HistogramVec
	bootPhase         *metrics.GaugeVec
	bootMilestone     *metrics.GaugeVec
	offlinePeriods    *metrics.Counter

	mu            sync.Mutex // protects offline, lastReachable, milestones
	offline       bool       // the apiserver did not answer the last node status sync
	lastReachable time.Time  // the last time it did, or the agent's start
	milestones    map[string]bool
}

// New makes the metrics and their registry, with the process and Go collectors.
func New() *Metrics {
	return newWithClock(time.Now)
}

func newWithClock(now func() time.Time) *Metrics {
	m := &Metrics{
		registry:      metrics.NewKubeRegistry(),
		start:         now(),
		now:           now,
		lastReachable: now(),
		milestones:    map[string]bool{},

		podWorkerDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Name: "pod_worker_duration_seconds",
			Help:           "Duration in seconds to sync a single pod. Broken down by operation type (create: the pod's first sync, sync, kill: a termination) and result (error: the sync could not observe the runtime or finish a termination, and is retried).",
			Buckets:        syncBuckets,
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation_type", "result"}),
		podStartDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: namespace, Name: "pod_start_duration_seconds",
			Help:           "Duration in seconds from holdfast seeing a pod for the first time to all its containers running. Pods whose containers were already running (adopted after an agent restart) are not counted; pods started again after a reboot are.",
			Buckets:        startBuckets,
			StabilityLevel: metrics.ALPHA,
		}),
		podStartPhase: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Name: "pod_start_phase_duration_seconds",
			Help:           "Duration in seconds of each phase of a pod's start, for the pods counted in holdfast_pod_start_duration_seconds: admission, network (namespace and CNI ADD), volumes, image, create (the containers' configuration and containerd records), start (their tasks), other (the rest: waiting, observing, status). A phase's sum over all pods divided by their count is where an average start goes.",
			Buckets:        syncBuckets,
			StabilityLevel: metrics.ALPHA,
		}, []string{"phase"}),
		relistDuration: metrics.NewHistogram(&metrics.HistogramOpts{
			Namespace: namespace, Subsystem: "pleg", Name: "relist_duration_seconds",
			Help:           "Duration in seconds for relisting the containers of the runtime (holdfast's pod lifecycle event generator), failed relists included.",
			Buckets:        relistBuckets,
			StabilityLevel: metrics.ALPHA,
		}),
		relistErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: "pleg", Name: "relist_errors_total",
			Help:           "Number of runtime relists that failed (containerd did not answer in time or returned an error).",
			StabilityLevel: metrics.ALPHA,
		}),
		policyEvaluations: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: "policy", Name: "evaluations_total",
			Help:           "Number of Wasm policy evaluations, by policy, kind (admission, probe) and result (allowed, denied, success, failure, error).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"policy", "kind", "result"}),
		policyDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Subsystem: "policy", Name: "evaluation_duration_seconds",
			Help:           "Duration in seconds of a Wasm policy evaluation (the module call), by policy and kind.",
			Buckets:        policyBuckets,
			StabilityLevel: metrics.ALPHA,
		}, []string{"policy", "kind"}),
		bootPhase: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: "boot", Name: "phase_duration_seconds",
			Help:           "Duration in seconds of each phase of the agent's start, in order: open_store, install_logger (containerd backend), connect_runtime, preload_images, identity (with an apiserver), load_policies (the pod, volume, image and eviction managers made, the Wasm policies compiled), restore_pods (cached API pods and the status outbox, with an apiserver), start (every part started).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"phase"}),
		bootMilestone: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: "boot", Name: "milestone_seconds",
			Help:           "Seconds from the agent's start until a milestone was first reached: first_relist (the runtime's state known), node_registered.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"milestone"}),
		offlinePeriods: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: "apiserver", Name: "offline_periods_total",
			Help:           "Number of times the apiserver became unreachable (a node status sync failed after one succeeded, or before any did).",
			StabilityLevel: metrics.ALPHA,
		}),
	}
	m.registry.MustRegister(m.podWorkerDuration, m.podStartDuration, m.podStartPhase, m.relistDuration, m.relistErrors,
		m.policyEvaluations, m.policyDuration, m.bootPhase, m.bootMilestone, m.offlinePeriods)
	m.registry.CustomMustRegister(&gaugeFunc{desc: metrics.NewDesc(namespace+"_apiserver_offline_seconds",
		"Seconds since the apiserver was last reachable (or since the agent started, if it has not been yet); 0 while it is reachable and on a standalone node.",
		nil, nil, metrics.ALPHA, ""), value: m.offlineSeconds})
	// The collectors every Go exporter has (the kubelet's come from component-base's legacy
	// registry): go_* with the default runtime metrics, not all of them, to keep a scrape small.
	m.registry.RawMustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format (or what the scraper negotiates).
func (m *Metrics) Handler() http.Handler {
	return metrics.HandlerFor(m.registry, metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError})
}

// ObservePodSync records one pod sync by its worker.
func (m *Metrics) ObservePodSync(operation, result string, d time.Duration) {
	if m == nil {
		return
	}
	m.podWorkerDuration.WithLabelValues(operation, result).Observe(d.Seconds())
}

// ObservePodStart records the time from a pod first seen to all its containers running.
func (m *Metrics) ObservePodStart(d time.Duration) {
	if m == nil {
		return
	}
	m.podStartDuration.Observe(d.Seconds())
}

// ObservePodStartPhases records where one pod's start went, by phase (PodStartPhases; a
// phase the pod did not go through counts as zero, so every phase has one sample per pod).
func (m *Metrics) ObservePodStartPhases(phases map[string]time.Duration) {
	if m == nil {
		return
	}
	for _, p := range PodStartPhases {
		m.podStartPhase.WithLabelValues(p).Observe(phases[p].Seconds())
	}
}

// ObserveRelist records one relist of the runtime; the first that succeeds is the
// first_relist milestone.
func (m *Metrics) ObserveRelist(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.relistDuration.Observe(d.Seconds())
	if err != nil {
		m.relistErrors.Inc()
		return
	}
	m.Milestone(MilestoneFirstRelist)
}

// ObservePolicy records one evaluation of a Wasm policy.
func (m *Metrics) ObservePolicy(policy, kind, result string, d time.Duration) {
	if m == nil {
		return
	}
	m.policyEvaluations.WithLabelValues(policy, kind, result).Inc()
	m.policyDuration.WithLabelValues(policy, kind).Observe(d.Seconds())
}

// Milestone records the seconds from the agent's start to the milestone, the first time only.
func (m *Metrics) Milestone(name string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.milestones[name] {
		return
	}
	m.milestones[name] = true
	m.bootMilestone.WithLabelValues(name).Set(m.now().Sub(m.start).Seconds())
}

// APIReachable records whether the apiserver answered the node's latest status sync.
func (m *Metrics) APIReachable(reachable bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if reachable {
		m.offline, m.lastReachable = false, m.now()
		return
	}
	if !m.offline {
		m.offline = true
		m.offlinePeriods.Inc()
	}
}

func (m *Metrics) offlineSeconds() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.offline {
		return 0
	}
	return m.now().Sub(m.lastReachable).Seconds()
}

// Boot times the sequential phases of the agent's start: each Done records the time since the
// previous one (or since the agent started).
type Boot struct {
	m    *Metrics
	last time.Time
}

// Boot starts timing the phases of the agent's start.
func (m *Metrics) Boot() *Boot {
	if m == nil {
		return &Boot{}
	}
	return &Boot{m: m, last: m.start}
}

// Done ends a phase.
func (b *Boot) Done(phase string) {
	if b.m == nil {
		return
	}
	now := b.m.now()
	b.m.bootPhase.WithLabelValues(phase).Set(now.Sub(b.last).Seconds())
	b.last = now
}

// Store is what the metrics read from the state store (offline.Store) at each scrape.
type Store interface {
	Stats() offline.Stats
	OutboxLen() (int, error)
}

// WatchStore adds the state store's counters and outbox length, read at each scrape, and the
// size of its file at path.
func (m *Metrics) WatchStore(store Store, path string) {
	if m == nil {
		return
	}
	m.registry.CustomMustRegister(&storeCollector{store: store, path: path})
}

// WatchOutbox adds the depth of the status outbox, read at each scrape.
func (m *Metrics) WatchOutbox(depth func() int) {
	if m == nil {
		return
	}
	m.registry.CustomMustRegister(&gaugeFunc{desc: metrics.NewDesc(namespace+"_outbox_depth",
		"Pod statuses computed and not yet delivered to the apiserver (kept in the state store's outbox while it is out of reach; one per pod, the latest).",
		nil, nil, metrics.ALPHA, ""), value: func() float64 { return float64(depth()) }})
}

// EventBacklog is what the metrics read from the event backlog (events.Backlog) at each scrape.
type EventBacklog interface {
	Len() int
	Dropped() uint64
}

// WatchEventBacklog adds the events waiting for the apiserver and those dropped from the full
// backlog, read at each scrape.
func (m *Metrics) WatchEventBacklog(b EventBacklog) {
	if m == nil {
		return
	}
	m.registry.CustomMustRegister(&gaugeFunc{desc: metrics.NewDesc(namespace+"_event_backlog",
		"Events recorded while the apiserver was out of reach and not yet delivered (kept in memory, coalesced, at most 1000).",
		nil, nil, metrics.ALPHA, ""), value: func() float64 { return float64(b.Len()) }})
	m.registry.CustomMustRegister(&gaugeFunc{kind: metrics.CounterValue, desc: metrics.NewDesc(namespace+"_event_backlog_dropped_total",
		"Events dropped, the oldest first, because the event backlog was full while the apiserver was out of reach.",
		nil, nil, metrics.ALPHA, ""), value: func() float64 { return float64(b.Dropped()) }})
}

// TokenReviewer is the node API's count of the TokenReviews its callers' tokens cost.
type TokenReviewer interface {
	TokenReviews() uint64
	TokenReviewsLimited() uint64
}

// WatchTokenReviews adds the TokenReviews the node API sent for bearer tokens it had not seen,
// and the requests it answered 429 instead because their budget was spent: a caller flooding
// the port with made-up tokens shows here, not on the uplink's bill.
func (m *Metrics) WatchTokenReviews(r TokenReviewer) {
	if m == nil {
		return
	}
	m.registry.CustomMustRegister(&gaugeFunc{kind: metrics.CounterValue, desc: metrics.NewDesc(namespace+"_nodeapi_token_reviews_total",
		"TokenReviews the node API sent to the apiserver for bearer tokens in neither of its caches.",
		nil, nil, metrics.ALPHA, ""), value: func() float64 { return float64(r.TokenReviews()) }})
	m.registry.CustomMustRegister(&gaugeFunc{kind: metrics.CounterValue, desc: metrics.NewDesc(namespace+"_nodeapi_token_reviews_limited_total",
		"Node API requests with a new bearer token answered 429 without a TokenReview, their rate (5 a second, bursts of 20) spent.",
		nil, nil, metrics.ALPHA, ""), value: func() float64 { return float64(r.TokenReviewsLimited()) }})
}

// gaugeFunc is a gauge read at each scrape (or a counter, when kind says so).
type gaugeFunc struct {
	metrics.BaseStableCollector
	desc  *metrics.Desc
	kind  metrics.ValueType // zero: a gauge
	value func() float64
}

func (g *gaugeFunc) DescribeWithStability(ch chan<- *metrics.Desc) { ch <- g.desc }

func (g *gaugeFunc) CollectWithStability(ch chan<- metrics.Metric) {
	kind := g.kind
	if kind == 0 {
		kind = metrics.GaugeValue
	}
	ch <- metrics.NewLazyConstMetric(g.desc, kind, g.value())
}

var (
	storeTransactionsDesc = metrics.NewDesc(namespace+"_store_transactions_total",
		"Number of write transactions committed to the state database, each one fsync (concurrent writes share one).", nil, nil, metrics.ALPHA, "")
	storeWritesDesc = metrics.NewDesc(namespace+"_store_writes_total",
		"Number of writes that changed the state database (puts of new bytes, deletes, outbox appends and acks), by the top-level bucket of the record (pods, outbox, secrets, ...).", []string{"bucket"}, nil, metrics.ALPHA, "")
	storeSkippedWritesDesc = metrics.NewDesc(namespace+"_store_skipped_writes_total",
		"Number of writes skipped because the stored bytes were already the same (flash wear saved).", nil, nil, metrics.ALPHA, "")
	storeBytesWrittenDesc = metrics.NewDesc(namespace+"_store_written_bytes_total",
		"Bytes of database pages written to the state database file by committed transactions (bbolt's copy-on-write pages and each commit's meta page).", nil, nil, metrics.ALPHA, "")
	storeSizeDesc = metrics.NewDesc(namespace+"_store_db_size_bytes",
		"Size in bytes of the state database file.", nil, nil, metrics.ALPHA, "")
	outboxEntriesDesc = metrics.NewDesc(namespace+"_outbox_entries",
		"Status updates kept in the outbox (the status journal beside the state database) until delivered: at most two per pod (its oldest pending status and its latest), however long the apiserver is out of reach.", nil, nil, metrics.ALPHA, "")
	outboxSyncsDesc = metrics.NewDesc(namespace+"_outbox_syncs_total",
		"Syncs (fdatasync) of the status journal, the outbox's file beside the state database: at most one per status change, none for its delivery.", nil, nil, metrics.ALPHA, "")
	outboxBytesDesc = metrics.NewDesc(namespace+"_outbox_written_bytes_total",
		"Bytes written to the status journal (status records, acks, compactions).", nil, nil, metrics.ALPHA, "")
	outboxSupersededDesc = metrics.NewDesc(namespace+"_outbox_superseded_total",
		"Pending pod status updates dropped from the outbox because a newer status of the same pod replaced them before delivery (only the latest is ever sent).", nil, nil, metrics.ALPHA, "")
)

// storeCollector reads the store's own counters at each scrape, rather than counting on the
// side: the store is the one place that knows what it committed.
type storeCollector struct {
	metrics.BaseStableCollector
	store Store
	path  string
}

func (c *storeCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{storeTransactionsDesc, storeWritesDesc, storeSkippedWritesDesc, storeBytesWrittenDesc, storeSizeDesc, outboxEntriesDesc, outboxSupersededDesc, outboxSyncsDesc, outboxBytesDesc} {
		ch <- d
	}
}

func (c *storeCollector) CollectWithStability(ch chan<- metrics.Metric) {
	s := c.store.Stats()
	ch <- metrics.NewLazyConstMetric(storeTransactionsDesc, metrics.CounterValue, float64(s.Commits))
	for bucket, n := range s.WritesByBucket {
		ch <- metrics.NewLazyConstMetric(storeWritesDesc, metrics.CounterValue, float64(n), bucket)
	}
	ch <- metrics.NewLazyConstMetric(storeSkippedWritesDesc, metrics.CounterValue, float64(s.SkippedWrites))
	ch <- metrics.NewLazyConstMetric(storeBytesWrittenDesc, metrics.CounterValue, float64(s.BytesWritten))
	ch <- metrics.NewLazyConstMetric(outboxSupersededDesc, metrics.CounterValue, float64(s.OutboxSuperseded))
	ch <- metrics.NewLazyConstMetric(outboxSyncsDesc, metrics.CounterValue, float64(s.OutboxSyncs))
	ch <- metrics.NewLazyConstMetric(outboxBytesDesc, metrics.CounterValue, float64(s.OutboxBytes))
	if fi, err := os.Stat(c.path); err == nil {
		ch <- metrics.NewLazyConstMetric(storeSizeDesc, metrics.GaugeValue, float64(fi.Size()))
	}
	if n, err := c.store.OutboxLen(); err == nil { // an error: the store is closing
		ch <- metrics.NewLazyConstMetric(outboxEntriesDesc, metrics.GaugeValue, float64(n))
	}
}
