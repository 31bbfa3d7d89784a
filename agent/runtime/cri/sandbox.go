package cri

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/network"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/failpoint"
)

// sandbox is a pod's sandbox as the runtime made it.
type sandbox struct {
	id      string
	config  *criapi.PodSandboxConfig
	ips     []string
	netns   string // the sandbox's network namespace where the runtime tells it; may be empty
	ready   bool
	attempt uint32
	// hostNetwork: the sandbox has the host's network (and no namespace of its own to read).
	hostNetwork bool
}

// Network is the CRI backend's view of pod networks: the runtime owns them, as part of the
// pod sandbox it makes (its pause container and its CNI). Setup makes the pod's sandbox, for
// host-network pods too (their containers live in it as well), and returns its addresses.
type Network struct{ r *Runtime }

// Network returns the runtime's pod networks.
func (r *Runtime) Network() *Network { return &Network{r: r} }

// loadSandboxes learns the sandboxes holdfast made (of the pod podUID only, if not empty):
// after an agent restart, each pod's newest one is its sandbox.
func (r *Runtime) loadSandboxes(ctx context.Context, podUID string) error {
	selector := map[string]string{labelManaged: "true"}
	if podUID != "" {
		selector[LabelPodUID] = podUID
	}
	resp, err := r.rs.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: &criapi.PodSandboxFilter{LabelSelector: selector}})
	if err != nil {
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// The newest sandbox is the pod's; older ones are of boots before, kept while they hold
	// the pod's earlier containers.
	slices.SortFunc(resp.Items, func(a, b *criapi.PodSandbox) int {
		return cmp.Compare(b.GetMetadata().GetAttempt(), a.GetMetadata().GetAttempt())
	})
	seen := map[string]bool{}
	for _, s := range resp.Items {
		uid := s.Labels[LabelPodUID]
		if seen[uid] {
			if !slices.Contains(r.stale[uid], s.Id) {
				r.stale[uid] = append(r.stale[uid], s.Id)
			}
			continue
		}
		seen[uid] = true
		if cur := r.sandboxes[uid]; cur == nil || cur.id != s.Id {
			r.sandboxes[uid] = &sandbox{id: s.Id, attempt: s.GetMetadata().GetAttempt(), ready: s.State == criapi.PodSandboxState_SANDBOX_READY}
		}
	}
	return nil
}

// removeStale removes the pod's earlier sandboxes once they hold no container: the pod
// worker's garbage collection removes the containers of earlier attempts (keeping the last
// one for the pod's lastState), and a sandbox would otherwise outlive them.
func (r *Runtime) removeStale(ctx context.Context, podUID string) {
	r.mu.Lock()
	stale := slices.Clone(r.stale[podUID])
	r.mu.Unlock()
	for _, id := range stale {
		removed, err := r.removeIfEmpty(ctx, id)
		if err != nil {
			r.log.Warn("remove an earlier pod sandbox", "err", err)
		}
		if !removed {
			continue
		}
		r.mu.Lock()
		r.stale[podUID] = slices.DeleteFunc(r.stale[podUID], func(s string) bool { return s == id })
		if len(r.stale[podUID]) == 0 {
			delete(r.stale, podUID)
		}
		r.mu.Unlock()
	}
}

// removeIfEmpty removes sandbox id if it holds no container (the runtime would remove them
// with it), and says whether it did.
func (r *Runtime) removeIfEmpty(ctx context.Context, id string) (bool, error) {
	resp, err := r.rs.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: id}})
	if err != nil {
		return false, fmt.Errorf("list the containers of sandbox %s: %w", id, err)
	}
	if len(resp.Containers) > 0 {
		return false, nil
	}
	_, err = r.rs.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id})
	if err != nil && !isNotFound(err) {
		return false, fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	return true, nil
}

// Setup makes the pod's sandbox, or finds the one it has: a sandbox the runtime no longer has
// ready (its pause container died, the node rebooted) is replaced by a new attempt, as the
// kubelet does, and the old one stopped. Its containers are left for the pod worker, which
// sees them exited and restarts them per the pod's restartPolicy in the new sandbox.
func (n *Network) Setup(ctx context.Context, pod *v1.Pod) (*network.PodNetwork, error) {
	r := n.r
	uid := string(pod.UID)
	r.mu.Lock()
	cur := r.sandboxes[uid]
	r.mu.Unlock()
	if cur == nil {
		// Made by another instance since this one listed them, or never.
		if err := r.loadSandboxes(ctx, uid); err != nil {
			return nil, err
		}
		r.mu.Lock()
		cur = r.sandboxes[uid]
		r.mu.Unlock()
	}
	if cur != nil {
		// The network namespace is read once (verbose: the runtime's whole spec), then kept.
		sb, err := r.sandboxStatus(ctx, cur.id, cur.netns == "" && !cur.hostNetwork)
		switch {
		case err == nil && sb.ready:
			sb.attempt, sb.config = cur.attempt, cur.config
			if sb.config == nil {
				// Found by listing after an agent restart: its configuration, which each
				// container create hands the runtime again, is the pod's.
				if sb.config, err = r.sandboxConfig(pod, sb.attempt); err != nil {
					return nil, err
				}
			}
			if sb.netns == "" {
				sb.netns = cur.netns
			}
			sb.hostNetwork = pod.Spec.HostNetwork
			r.setSandbox(uid, sb)
			r.removeStale(ctx, uid)
			return sb.podNetwork(), nil
		case err == nil || isNotFound(err):
			r.log.Info("pod sandbox not ready; making a new one", "pod", pod.Namespace+"/"+pod.Name, "sandbox", cur.id)
			if err == nil {
				r.stopSandbox(ctx, cur.id)
				r.mu.Lock()
				r.stale[uid] = append(r.stale[uid], cur.id)
				r.mu.Unlock()
			}
		default:
			return nil, fmt.Errorf("status of pod sandbox %s: %w", cur.id, err)
		}
	}
	var attempt uint32
	if cur != nil {
		attempt = cur.attempt + 1
	}
	config, err := r.sandboxConfig(pod, attempt)
	if err != nil {
		return nil, err
	}
	resp, err := r.rs.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: config})
	if err != nil {
		return nil, fmt.Errorf("run pod sandbox: %w", err)
	}
	failpoint.Inject(failpoint.SandboxAfterRun)
	sb, err := r.sandboxStatus(ctx, resp.PodSandboxId, !pod.Spec.HostNetwork)
	if err != nil {
		return nil, fmt.Errorf("status of new pod sandbox %s: %w", resp.PodSandboxId, err)
	}
	sb.config, sb.attempt, sb.hostNetwork = config, attempt, pod.Spec.HostNetwork
	r.setSandbox(uid, sb)
	return sb.podNetwork(), nil
}

func (r *Runtime) setSandbox(uid string, sb *sandbox) {
	r.mu.Lock()
	r.sandboxes[uid] = sb
	r.mu.Unlock()
}

func (sb *sandbox) podNetwork() *network.PodNetwork {
	return &network.PodNetwork{NetNSPath: sb.netns, IPs: slices.Clone(sb.ips), Complete: true, ContainerID: sb.id}
}

// sandboxStatus reads a sandbox's state and addresses, and with verbose its network namespace
// from the runtime's verbose information (containerd's "runtimeSpec", CRI-O's too) where it
// has one.
func (r *Runtime) sandboxStatus(ctx context.Context, id string, verbose bool) (*sandbox, error) {
	resp, err := r.rs.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: verbose})
	if err != nil {
		return nil, err
	}
	st := resp.GetStatus()
	sb := &sandbox{id: id, ready: st.GetState() == criapi.PodSandboxState_SANDBOX_READY, attempt: st.GetMetadata().GetAttempt()}
	if ip := st.GetNetwork().GetIp(); ip != "" {
		sb.ips = append(sb.ips, ip)
		for _, more := range st.GetNetwork().GetAdditionalIps() {
			sb.ips = append(sb.ips, more.Ip)
		}
	}
	sb.netns = netnsFromInfo(resp.Info)
	return sb, nil
}

// Teardown stops every sandbox of the pod, which releases its network, and removes those that
// hold no container any more. A finished pod keeps its exited containers, so that its status
// (phase, exit codes, messages) is still reported, until it is deleted: removing its sandbox
// would remove them with it. The pod's deletion removes the containers, then tears down again,
// and the empty sandboxes go.
func (n *Network) Teardown(ctx context.Context, podUID, namespace, name string) error {
	r := n.r
	ids, err := r.podSandboxes(ctx, podUID)
	if err != nil {
		return err
	}
	kept := 0
	for _, id := range ids {
		_, err := r.rs.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id})
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("stop pod sandbox %s of %s/%s: %w", id, namespace, name, err)
		}
		removed, err := r.removeIfEmpty(ctx, id)
		if err != nil {
			return fmt.Errorf("pod sandbox of %s/%s: %w", namespace, name, err)
		}
		if !removed {
			kept++
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if kept == 0 {
		delete(r.sandboxes, podUID)
		delete(r.stale, podUID)
	} else if sb := r.sandboxes[podUID]; sb != nil {
		stopped := *sb // its network is gone with it
		stopped.ips, stopped.netns, stopped.ready = nil, "", false
		r.sandboxes[podUID] = &stopped
	}
	return nil
}

// podSandboxes lists the IDs of the pod's sandboxes, ready or not.
func (r *Runtime) podSandboxes(ctx context.Context, podUID string) ([]string, error) {
	resp, err := r.rs.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: &criapi.PodSandboxFilter{
		LabelSelector: map[string]string{labelManaged: "true", LabelPodUID: podUID},
	}})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of pod %s: %w", podUID, err)
	}
	ids := make([]string, 0, len(resp.Items))
	for _, s := range resp.Items {
		ids = append(ids, s.Id)
	}
	return ids, nil
}

func (r *Runtime) stopSandbox(ctx context.Context, id string) {
	if _, err := r.rs.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil && !isNotFound(err) {
		r.log.Warn("stop pod sandbox", "sandbox", id, "err", err)
	}
}

// Get returns the pod's network as its sandbox has it, nil when it has no ready sandbox.
func (n *Network) Get(podUID string) *network.PodNetwork {
	n.r.mu.Lock()
	defer n.r.mu.Unlock()
	if sb := n.r.sandboxes[podUID]; sb != nil && sb.ready {
		return sb.podNetwork()
	}
	return nil
}

// Known returns the UIDs of the pods with a sandbox, so that the agent tears down those of
// pods it no longer runs.
func (n *Network) Known() []string {
	resp, err := n.r.rs.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{Filter: &criapi.PodSandboxFilter{
		LabelSelector: map[string]string{labelManaged: "true"},
	}})
	if err != nil {
		n.r.log.Warn("list pod sandboxes", "err", err)
		return nil
	}
	var uids []string
	for _, s := range resp.Items {
		if uid := s.Labels[LabelPodUID]; uid != "" && !slices.Contains(uids, uid) {
			uids = append(uids, uid)
		}
	}
	sort.Strings(uids)
	return uids
}

// Ready fails while the runtime says its network is not ready (NetworkReady false: no CNI
// configuration yet).
func (n *Network) Ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.r.condition(ctx, criapi.NetworkReady)
	if err != nil {
		return err
	}
	if !c.Status {
		return fmt.Errorf("container runtime network not ready: %s: %s", c.Reason, c.Message)
	}
	return nil
}

// NetNSPath is the pod's network namespace, for port forwarding.
func (n *Network) NetNSPath(podUID string) string {
	if pn := n.Get(podUID); pn != nil {
		return pn.NetNSPath
	}
	return ""
}

// Run has nothing to release later: the runtime releases its sandboxes' networks itself.
func (n *Network) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// sandboxConfig is the kubelet's PodSandboxConfig for the pod (generatePodSandboxConfig).
func (r *Runtime) sandboxConfig(pod *v1.Pod, attempt uint32) (*criapi.PodSandboxConfig, error) {
	short, domain, err := network.PodHostnameAndDomain(pod, r.cfg.ClusterDomain)
	if err != nil {
		return nil, err
	}
	hostname, err := network.KernelHostname(pod, short, domain)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{labelManaged: "true"}
	for k, v := range pod.Labels {
		labels[k] = v
	}
	labels[LabelPodName], labels[LabelPodNamespace], labels[LabelPodUID] = pod.Name, pod.Namespace, string(pod.UID)
	annotations := map[string]string{}
	for k, v := range pod.Annotations {
		annotations[k] = v
	}
	c := &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID), Attempt: attempt},
		Hostname:     hostname,
		LogDirectory: filepath.Join(r.cfg.PodLogDir, logs.PodDirName(pod.Namespace, pod.Name, string(pod.UID))),
		Labels:       labels,
		Annotations:  annotations,
		Linux:        &criapi.LinuxPodSandboxConfig{SecurityContext: sandboxSecurity(pod), Sysctls: sysctls(pod)},
	}
	if r.cfg.PodCgroupParent != nil {
		c.Linux.CgroupParent = r.cfg.PodCgroupParent(pod)
	}
	if pod.Spec.HostNetwork {
		c.Hostname = "" // the host's
	} else {
		for _, p := range network.PortMappings(pod) {
			c.PortMappings = append(c.PortMappings, &criapi.PortMapping{
				Protocol:      protocol(p.Protocol),
				ContainerPort: p.ContainerPort,
				HostPort:      p.HostPort,
				HostIp:        p.HostIP,
			})
		}
	}
	return c, nil
}

func protocol(p string) criapi.Protocol {
	switch strings.ToLower(p) {
	case "udp":
		return criapi.Protocol_UDP
	case "sctp":
		return criapi.Protocol_SCTP
	}
	return criapi.Protocol_TCP
}

// namespaces are the pod's namespace modes (the kubelet's namespacesForPod).
func namespaces(pod *v1.Pod) *criapi.NamespaceOption {
	return containerNamespaces(runtime.Security{HostNetwork: pod.Spec.HostNetwork, HostPID: pod.Spec.HostPID, HostIPC: pod.Spec.HostIPC,
		ShareProcessNamespace: pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace})
}

// containerNamespaces are the namespaces of a container with that confinement, those of its
// pod's sandbox.
func containerNamespaces(sec runtime.Security) *criapi.NamespaceOption {
	ns := &criapi.NamespaceOption{Network: criapi.NamespaceMode_POD, Pid: criapi.NamespaceMode_CONTAINER, Ipc: criapi.NamespaceMode_POD}
	if sec.HostNetwork {
		ns.Network = criapi.NamespaceMode_NODE
	}
	if sec.HostIPC {
		ns.Ipc = criapi.NamespaceMode_NODE
	}
	switch {
	case sec.HostPID:
		ns.Pid = criapi.NamespaceMode_NODE
	case sec.ShareProcessNamespace:
		ns.Pid = criapi.NamespaceMode_POD
	}
	return ns
}

// sandboxSecurity is the sandbox's security context as the kubelet makes it. Privileged when
// any of the pod's containers is: the runtime refuses a privileged container in a sandbox that
// is not ("no privileged container allowed in sandbox").
func sandboxSecurity(pod *v1.Pod) *criapi.LinuxSandboxSecurityContext {
	sc := &criapi.LinuxSandboxSecurityContext{NamespaceOptions: namespaces(pod), Privileged: hasPrivilegedContainer(pod)}
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			sc.RunAsUser = &criapi.Int64Value{Value: *psc.RunAsUser}
		}
		if psc.RunAsGroup != nil {
			sc.RunAsGroup = &criapi.Int64Value{Value: *psc.RunAsGroup}
		}
		if psc.FSGroup != nil {
			sc.SupplementalGroups = append(sc.SupplementalGroups, *psc.FSGroup)
		}
		sc.SupplementalGroups = append(sc.SupplementalGroups, psc.SupplementalGroups...)
	}
	return sc
}

// hasPrivilegedContainer: an init, regular or ephemeral container of the pod is privileged
// (the kubelet's HasPrivilegedContainer).
func hasPrivilegedContainer(pod *v1.Pod) bool {
	privileged := func(sc *v1.SecurityContext) bool { return sc != nil && sc.Privileged != nil && *sc.Privileged }
	for _, c := range pod.Spec.InitContainers {
		if privileged(c.SecurityContext) {
			return true
		}
	}
	for _, c := range pod.Spec.Containers {
		if privileged(c.SecurityContext) {
			return true
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if privileged(c.SecurityContext) {
			return true
		}
	}
	return false
}

func sysctls(pod *v1.Pod) map[string]string {
	psc := pod.Spec.SecurityContext
	if psc == nil || len(psc.Sysctls) == 0 {
		return nil
	}
	out := make(map[string]string, len(psc.Sysctls))
	for _, s := range psc.Sysctls {
		out[strings.ReplaceAll(s.Name, "/", ".")] = s.Value
	}
	return out
}
