// Package node registers the Node object, renews its Lease in kube-node-lease, and keeps its
// status (capacity, addresses, nodeInfo, conditions) current, as kubelet does.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"

	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/metrics"
)

// ConditionStateRecovered is holdfast's node condition saying its state database had to be
// moved aside and rebuilt.
const ConditionStateRecovered v1.NodeConditionType = "HoldfastStateRecovered"

// ConditionPoliciesReady is holdfast's node condition saying whether every Wasm policy of the
// node's configuration is loaded (False names the ones that are not, and what serves instead).
const ConditionPoliciesReady v1.NodeConditionType = "HoldfastPoliciesReady"

// LeaseNamespace is where node Leases live.
const LeaseNamespace = "kube-node-lease"

// runtimeVersionTimeout bounds the runtime check: a containerd that accepts the call but never
// answers (hung, or stopped) is a runtime that is down. Unbounded, the call would stall the
// status loop, and the Node would stay Ready in the API (its Lease still renewed) while no pod
// can be started or observed.
const runtimeVersionTimeout = 10 * time.Second

// fastStatusInterval is how often readiness is checked until the node is first reported
// Ready, the period of kubelet's fastStatusUpdateOnce.
const fastStatusInterval = 100 * time.Millisecond

// Config describes the node.
type Config struct {
	NodeName     string
	AgentVersion string // reported as kubeletVersion
	NodeIP       string
	// HostIPs returns the node's addresses; nil: HostIPs(NodeIP).
	HostIPs         func() []string
	Labels          map[string]string
	MaxPods         int
	StorageDir      string // filesystem reported as ephemeral-storage
	LeaseDuration   time.Duration
	RenewInterval   time.Duration
	UpdateFrequency time.Duration
	ReportFrequency time.Duration
	// ExtraConditions are reported as they are beside kubelet's four (e.g. a state database
	// that had to be rebuilt).
	ExtraConditions []v1.NodeCondition
	// Conditions, if set, is asked for more conditions at every status computation (e.g. the
	// client certificate's expiry, see agent/identity).
	Conditions func() []v1.NodeCondition
	// UnderPressure says whether the node has a pressure condition (MemoryPressure,
	// DiskPressure, PIDPressure), as the eviction manager decides from its thresholds
	// (agent/eviction); nil: never.
	UnderPressure func(v1.NodeConditionType) bool
	// Reserved returns what allocatable leaves out of a capacity (systemReserved,
	// kubeReserved, hard eviction thresholds); nil: nothing.
	Reserved func(capacity v1.ResourceList) v1.ResourceList
	// KubeletPort is the node API's port, advertised in status.daemonEndpoints for the
	// apiserver to dial (logs, exec, port-forward); 0: no node API.
	KubeletPort int32
	// Metrics is told whether each status sync reached the apiserver, and when the node
	// registered; nil: nothing is recorded.
	Metrics *metrics.Metrics
	// OnRepeatedHeartbeatFailure is called when Lease renewals keep failing (the kubelet
	// closes every connection to the apiserver then, so that watches hung on a dead link
	// reconnect); nil: nothing.
	OnRepeatedHeartbeatFailure func()
	// Watch, if set, is a client without a request deadline that the Node is watched with (one
	// object, by name): each status sync compares with the watched Node and makes no request
	// unless the status changed or ReportFrequency passed, as the kubelet reads its node
	// lister. nil: the Node is read with a GET at every sync (UpdateFrequency).
	Watch kube.Interface
	// Reachability, if set, observes the heartbeat client's requests (Reachability.Wrap)
	// and is what APIReachable reports; required with Watch, whose syncs may make no request.
	Reachability *Reachability
}

// Controller owns the Node object and its Lease.
type Controller struct {
	cfg            Config
	client         kube.Interface
	runtimeVersion func(context.Context) (string, error)
	// readiness returns nil when the node can run pods (runtime up, relist healthy, network).
	readiness func() error
	log       *slog.Logger

	mu        sync.Mutex // protects lastWrite, lastStatus, apiErr
	lastWrite time.Time
	lastSent  v1.NodeStatus
	apiErr    error // result of the last status sync; errNotContacted before the first
	// watched is the Node as the watch last delivered it (Config.Watch); nil before it synced.
	watched func() *v1.Node
}

// NewController builds a controller; Run registers the node and keeps it current.
func NewController(cfg Config, client kube.Interface, runtimeVersion func(context.Context) (string, error), readiness func() error, log *slog.Logger) *Controller {
	return &Controller{cfg: cfg, client: client, runtimeVersion: runtimeVersion, readiness: readiness, log: log, apiErr: errNotContacted}
}

var errNotContacted = errors.New("apiserver not contacted yet")

// APIReachable returns nil when the last node status sync reached the apiserver, else its
// error: what the agent tells systemd and the operator about its uplink.
func (c *Controller) APIReachable() error {
	if c.cfg.Reachability != nil {
		return c.cfg.Reachability.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiErr
}

// setAPIErr records the outcome of a sync or registration, unless Reachability observes
// every request itself.
func (c *Controller) setAPIErr(err error) {
	if c.cfg.Reachability != nil {
		return
	}
	c.mu.Lock()
	c.apiErr = err
	c.mu.Unlock()
	c.cfg.Metrics.APIReachable(err == nil)
}

// Run registers the node (retrying until the apiserver answers), then renews the Lease and
// updates the status until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	var node *v1.Node
	delay := time.Second
	for {
		var err error
		if node, err = c.register(ctx); err == nil {
			break
		}
		c.setAPIErr(err)
		c.log.Warn("register node; retrying", "node", c.cfg.NodeName, "err", err, "retryIn", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
	c.log.Info("node registered", "node", node.Name, "uid", node.UID)
	c.cfg.Metrics.Milestone(metrics.MilestoneNodeRegistered)

	ctl := &leaseController{
		client:                     c.client.CoordinationV1().Leases(LeaseNamespace),
		holderIdentity:             c.cfg.NodeName,
		leaseName:                  c.cfg.NodeName,
		leaseNamespace:             LeaseNamespace,
		leaseDurationSeconds:       int32(c.cfg.LeaseDuration / time.Second),
		renewInterval:              c.cfg.RenewInterval,
		onRepeatedHeartbeatFailure: c.cfg.OnRepeatedHeartbeatFailure,
		postProcess:                ownedByNode(node),
		log:                        c.log.With("lease", LeaseNamespace+"/"+c.cfg.NodeName),
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctl.Run(ctx)
	}()
	defer wg.Wait()
	if c.cfg.Watch != nil {
		stop := c.watchNode(ctx)
		defer stop()
	}

	c.syncStatus(ctx)
	ticker := time.NewTicker(c.cfg.UpdateFrequency)
	defer ticker.Stop()
	// Until the node has been reported Ready, readiness is checked every fastStatusInterval
	// and reported as soon as it holds, as kubelet does after its start: the first status
	// usually goes out before the runtime's first relist, and the node would otherwise stay
	// NotReady for a whole UpdateFrequency after every restart of the agent.
	fast := time.NewTicker(fastStatusInterval)
	defer fast.Stop()
	untilReady := fast.C
	for {
		if untilReady != nil && c.reportedReady() {
			fast.Stop()
			untilReady = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			c.syncStatus(ctx)
		case <-untilReady:
			_, rverr := c.checkRuntime(ctx)
			if ready, _ := c.readyState(rverr); ready {
				c.syncStatus(ctx)
			}
		}
	}
}

// reportedReady says whether the last status written to the API had the Ready condition True.
func (c *Controller) reportedReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cond := range c.lastSent.Conditions {
		if cond.Type == v1.NodeReady {
			return cond.Status == v1.ConditionTrue
		}
	}
	return false
}

// ownedByNode makes the Lease owned by the Node, so deleting the Node deletes its Lease. It
// runs before every renewal, which it also makes smaller: the renewal sends the Lease back
// without its managedFields, which the apiserver then keeps as they are (an update without
// them leaves them unchanged), so the bytes sent per renewal, the only request every
// RenewInterval, are little more than the Lease's own (docs/benchmarks.md, "Uplink").
func ownedByNode(node *v1.Node) func(*coordinationv1.Lease) error {
	return func(l *coordinationv1.Lease) error {
		l.ManagedFields = nil
		if len(l.OwnerReferences) == 0 {
			l.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
			}}
		}
		return nil
	}
}

// Labels returns the labels the node registers with: kubelet's well-known ones and the
// configured ones.
func Labels(nodeName string, extra map[string]string) map[string]string {
	labels := map[string]string{
		v1.LabelHostname:   nodeName,
		v1.LabelOSStable:   goruntime.GOOS,
		v1.LabelArchStable: goruntime.GOARCH,
	}
	for k, v := range extra {
		labels[k] = v
	}
	return labels
}

// Capacity measures the machine: cpu, memory, ephemeral-storage (the filesystem of
// storageDir) and the pods capacity.
func Capacity(storageDir string, maxPods int) (v1.ResourceList, error) {
	mi, err := readMachine(storageDir)
	if err != nil {
		return nil, err
	}
	return capacityOf(mi, maxPods), nil
}

func capacityOf(mi machineInfo, maxPods int) v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:              *resource.NewQuantity(int64(mi.cpus), resource.DecimalSI),
		v1.ResourceMemory:           *resource.NewQuantity(mi.memoryBytes, resource.BinarySI),
		v1.ResourceEphemeralStorage: *resource.NewQuantity(mi.storageBytes, resource.BinarySI),
		v1.ResourcePods:             *resource.NewQuantity(int64(maxPods), resource.DecimalSI),
	}
}

// Allocatable is kubelet's node allocatable: the capacity less what is reserved
// (systemReserved, kubeReserved, the hard eviction thresholds), never below zero. Resources
// that are not reserved are the capacity.
func Allocatable(capacity, reserved v1.ResourceList) v1.ResourceList {
	out := capacity.DeepCopy()
	for name, q := range out {
		r, ok := reserved[name]
		if !ok {
			continue
		}
		q.Sub(r)
		if q.Sign() < 0 {
			q.Set(0)
		}
		out[name] = q
	}
	return out
}

func (c *Controller) register(ctx context.Context) (*v1.Node, error) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.cfg.NodeName, Labels: Labels(c.cfg.NodeName, c.cfg.Labels)}}
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err == nil {
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create node %s: %w", c.cfg.NodeName, err)
	}
	existing, err := c.client.CoreV1().Nodes().Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", c.cfg.NodeName, err)
	}
	return existing, nil
}

// ownedConditions are the condition types holdfast writes: the kubelet's four and its own.
func (c *Controller) ownedConditions() map[v1.NodeConditionType]bool {
	owned := map[v1.NodeConditionType]bool{
		v1.NodeReady: true, v1.NodeMemoryPressure: true, v1.NodeDiskPressure: true, v1.NodePIDPressure: true,
		ConditionStateRecovered: true, ConditionPoliciesReady: true,
	}
	for _, ec := range c.cfg.ExtraConditions {
		owned[ec.Type] = true
	}
	return owned
}

// syncStatus computes the node status and writes it when it changed or ReportFrequency
// has passed since the last write.
func (c *Controller) syncStatus(ctx context.Context) {
	attempt := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		attempt++
		// The watched Node first; a GET when there is none yet, or to retry.
		var node *v1.Node
		if c.watched != nil && attempt == 1 {
			node = c.watched()
		}
		if node == nil {
			var err error
			if node, err = c.client.CoreV1().Nodes().Get(ctx, c.cfg.NodeName, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		st, err := c.computeStatus(ctx, node.Status, time.Now())
		if err != nil {
			return err
		}
		c.mu.Lock()
		changed := !apiequality.Semantic.DeepEqual(withoutHeartbeats(st), withoutHeartbeats(c.lastSent))
		due := time.Since(c.lastWrite) >= c.cfg.ReportFrequency
		c.mu.Unlock()
		if !changed && !due {
			return nil
		}
		patch, err := statusPatch(node, st, c.ownedConditions())
		if err != nil {
			return err
		}
		if _, err := c.client.CoreV1().Nodes().PatchStatus(ctx, c.cfg.NodeName, patch); err != nil {
			return err
		}
		c.mu.Lock()
		c.lastWrite, c.lastSent = time.Now(), st
		c.mu.Unlock()
		return nil
	})
	if ctx.Err() == nil {
		c.setAPIErr(err)
	}
	if err != nil && ctx.Err() == nil {
		c.log.Warn("update node status", "node", c.cfg.NodeName, "err", err)
	}
}

// watchNode starts an informer on the node's own Node object and makes syncStatus read it;
// the returned function stops the informer and waits for it.
func (c *Controller) watchNode(ctx context.Context) (stop func()) {
	inf := kube.NewInformer(c.cfg.Watch.CoreV1().Nodes(), c.cfg.Watch, &v1.Node{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.cfg.NodeName).String()
	})
	ctx, cancel := context.WithCancel(ctx)
	inf.Start(ctx.Done())
	c.watched = func() *v1.Node {
		if !inf.HasSynced() {
			return nil
		}
		obj, ok, err := inf.GetStore().GetByKey(c.cfg.NodeName)
		if err != nil || !ok {
			return nil
		}
		return obj.(*v1.Node)
	}
	return func() {
		cancel()
		inf.Shutdown()
	}
}

func withoutHeartbeats(st v1.NodeStatus) v1.NodeStatus {
	out := *st.DeepCopy()
	for i := range out.Conditions {
		out.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return out
}

// checkRuntime asks the runtime for its version, within runtimeVersionTimeout.
func (c *Controller) checkRuntime(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, runtimeVersionTimeout)
	defer cancel()
	v, err := c.runtimeVersion(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "", fmt.Errorf("no answer to Version within %s", runtimeVersionTimeout)
	}
	return v, err
}

// readyState is the node's Ready condition given the runtime version call's error: whether the
// node can run pods, and the condition's message.
func (c *Controller) readyState(runtimeErr error) (bool, string) {
	if runtimeErr != nil {
		return false, "container runtime is down: " + runtimeErr.Error()
	}
	if err := c.readiness(); err != nil {
		return false, err.Error()
	}
	return true, "holdfast is posting ready status"
}

// DeclaredFeatures are the node's declared features (NodeDeclaredFeatures, on in 1.37; the
// names of k8s.io/component-helpers/nodedeclaredfeatures) that holdfast implements: the
// apiserver refuses a pod update needing one the node does not declare, a pod-level resize
// among them, and a resize of a regular init container. Only what holdfast does is declared;
// the kubelet's others (memory-backed volumes, RestartAllContainers, ...) it does not.
// TestDeclaredFeaturesAreRegistered checks the names against the registry.
var DeclaredFeatures = []string{"InPlacePodLevelResourcesVerticalScaling", "InPlacePodVerticalScalingInitContainers"}

func (c *Controller) computeStatus(ctx context.Context, old v1.NodeStatus, now time.Time) (v1.NodeStatus, error) {
	mi, err := readMachine(c.cfg.StorageDir)
	if err != nil {
		return v1.NodeStatus{}, err
	}
	rv, rverr := c.checkRuntime(ctx)
	capacity := capacityOf(mi, c.cfg.MaxPods)
	allocatable := capacity.DeepCopy()
	if c.cfg.Reserved != nil {
		allocatable = Allocatable(capacity, c.cfg.Reserved(capacity))
	}
	st := v1.NodeStatus{
		Capacity:    capacity,
		Allocatable: allocatable,
		Phase:       "",
		NodeInfo: v1.NodeSystemInfo{
			MachineID:               mi.machineID,
			SystemUUID:              mi.systemUUID,
			BootID:                  mi.bootID,
			KernelVersion:           mi.kernel,
			OSImage:                 mi.osImage,
			ContainerRuntimeVersion: rv,
			KubeletVersion:          c.cfg.AgentVersion,
			OperatingSystem:         goruntime.GOOS,
			Architecture:            goruntime.GOARCH,
		},
		Images:           old.Images,
		DaemonEndpoints:  v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: c.cfg.KubeletPort}},
		DeclaredFeatures: slices.Clone(DeclaredFeatures),
	}
	hostIPs := c.cfg.HostIPs
	if hostIPs == nil {
		hostIPs = func() []string { return HostIPs(c.cfg.NodeIP) }
	}
	for _, ip := range hostIPs() {
		st.Addresses = append(st.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	st.Addresses = append(st.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: c.cfg.NodeName})

	ready, readyMsg := c.readyState(rverr)
	readyReason := "KubeletReady"
	if !ready {
		readyReason = "KubeletNotReady"
	}
	under := func(t v1.NodeConditionType) bool { return c.cfg.UnderPressure != nil && c.cfg.UnderPressure(t) }
	memPressure, diskPressure, pidPressure := under(v1.NodeMemoryPressure), under(v1.NodeDiskPressure), under(v1.NodePIDPressure)
	st.Conditions = []v1.NodeCondition{
		pressure(old, v1.NodeMemoryPressure, memPressure, "KubeletHasInsufficientMemory", "KubeletHasSufficientMemory", "memory available", now),
		pressure(old, v1.NodeDiskPressure, diskPressure, "KubeletHasDiskPressure", "KubeletHasNoDiskPressure", "disk pressure", now),
		pressure(old, v1.NodePIDPressure, pidPressure, "KubeletHasInsufficientPID", "KubeletHasSufficientPID", "PID available", now),
		nodeCondition(old, v1.NodeReady, ready, readyReason, readyMsg, now),
	}
	extra := c.cfg.ExtraConditions
	if c.cfg.Conditions != nil {
		extra = append(append([]v1.NodeCondition{}, extra...), c.cfg.Conditions()...)
	}
	for _, c := range extra {
		st.Conditions = append(st.Conditions, nodeCondition(old, c.Type, c.Status == v1.ConditionTrue, c.Reason, c.Message, now))
	}
	return st, nil
}

func pressure(old v1.NodeStatus, t v1.NodeConditionType, under bool, yesReason, noReason, what string, now time.Time) v1.NodeCondition {
	if under {
		return nodeCondition(old, t, true, yesReason, "holdfast has "+what+" pressure", now)
	}
	return nodeCondition(old, t, false, noReason, "holdfast has sufficient "+what, now)
}

func nodeCondition(old v1.NodeStatus, t v1.NodeConditionType, status bool, reason, msg string, now time.Time) v1.NodeCondition {
	s := v1.ConditionFalse
	if status {
		s = v1.ConditionTrue
	}
	c := v1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	for _, oc := range old.Conditions {
		if oc.Type == t && oc.Status == s {
			c.LastTransitionTime = oc.LastTransitionTime
		}
	}
	return c
}
