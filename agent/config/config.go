// Package config holds holdfast's configuration: the YAML file an operator writes (see
// firmware/config.yaml for the shipped default), its defaults, and its validation.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/component-helpers/node/util/sysctl"
	"sigs.k8s.io/yaml"
)

// Config is the agent's whole configuration. Every field has a default (see Default) so an
// empty file is a valid configuration: a standalone agent that runs the manifests in
// ManifestDir with a containerd on its default socket.
type Config struct {
	// NodeName is the name of the Node object and of the node identity. Defaults to the
	// machine's hostname, lower-cased.
	NodeName string `json:"nodeName,omitempty"`
	// Kubeconfig is the path of a kubeconfig with the node's identity (system:node:NAME).
	// Empty means standalone: no apiserver, static manifests only.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// BootstrapKubeconfig is the path of a kubeconfig with a bootstrap token (the kubelet's
	// --bootstrap-kubeconfig). With it, holdfast requests its node client certificate with a
	// CSR, keeps it in <stateDir>/pki, renews it, and writes Kubeconfig pointing at it (see
	// agent/identity). Defaults Kubeconfig to <stateDir>/kubeconfig.
	BootstrapKubeconfig string `json:"bootstrapKubeconfig,omitempty"`
	// StateDir holds the agent's own state (pod network records, the offline store).
	// Defaults to /var/lib/holdfast.
	StateDir string `json:"stateDir,omitempty"`
	// StateKeyFile holds the state key: 32 random bytes the firmware provisions (mode 0600,
	// owned by root or the agent's user: a file others may read or write is refused), which encrypt
	// the Secrets and service account tokens kept in the state store (AES-GCM), so that pods
	// using them boot offline. Without the file they are kept on tmpfs only, and such pods wait
	// for the apiserver after a reboot. Defaults to /etc/holdfast/state.key.
	StateKeyFile string `json:"stateKeyFile,omitempty"`
	// StateKeyTPM names the gateway's TPM 2.0 (the kernel's resource manager, /dev/tpmrm0;
	// or a TPM simulator's unix socket) to seal the state key with: StateKeyFile then holds
	// the key sealed by that TPM, of no use on another machine. A missing file gets a new key,
	// sealed; a raw key file is refused (remove it to have a new key made: what the old one
	// sealed is read again from the apiserver). Empty: the file is the raw key.
	StateKeyTPM string `json:"stateKeyTPM,omitempty"`
	// StateKeyCredential names a systemd credential that holds the raw state key, in place of
	// StateKeyFile: the unit's LoadCredentialEncrypted=NAME:FILE (systemd-creds encrypt, with
	// the TPM, the host key or both) or LoadCredential=NAME:PATH, which systemd decrypts into
	// $CREDENTIALS_DIRECTORY/NAME (tmpfs, mode 0400) for the agent alone. Not with StateKeyTPM:
	// systemd does the sealing then.
	StateKeyCredential string `json:"stateKeyCredential,omitempty"`
	// SealConfigMaps encrypts the ConfigMaps kept for offline reboots with the state key too,
	// for gateways whose ConfigMaps hold what Secrets should (connection strings). Pod records
	// (their inline env values) and Secrets are encrypted whenever there is a key.
	SealConfigMaps bool `json:"sealConfigMaps,omitempty"`
	// ManifestDir is the static pod manifest directory. Defaults to /etc/holdfast/manifests.
	// Empty after defaulting only if set to "-" (no static pods).
	ManifestDir string `json:"manifestDir,omitempty"`
	// ImagePreloadDir holds OCI or Docker image tarballs (*.tar) imported into containerd at
	// boot, before any pod starts, so a gateway with no registry runs its pods. Defaults to
	// /usr/lib/holdfast/images (shipped in the firmware image); "-" disables preloading.
	ImagePreloadDir string `json:"imagePreloadDir,omitempty"`
	// PolicyDir holds the node's Wasm policies: policies.yaml naming each policy (module,
	// kind, settings, grants, failurePolicy, limits) and the modules. Defaults to
	// /etc/holdfast/policies; without a policies.yaml there are no policies.
	PolicyDir string `json:"policyDir,omitempty"`
	// PolicyCacheDir keeps the policies' compiled machine code (wazero's compilation cache),
	// so that an agent restart does not compile them again. Its entries are checked by a
	// CRC only, and run inside the agent: whoever can write them runs code as the agent,
	// whatever digest the module was verified against. So the default is on tmpfs
	// (/run/holdfast/wasm-cache), out of reach of whoever holds the disk while the gateway is
	// off, at the cost of a compile after each reboot. "-" turns the cache off.
	PolicyCacheDir string `json:"policyCacheDir,omitempty"`
	// ExecFIFODir is where the FIFOs of each exec (an exec probe, kubectl exec) are made and
	// removed, three per exec: on tmpfs by default (/run/holdfast/exec), since on flash an
	// exec probe every second costs hundreds of KiB of metadata writes a minute. The
	// containerd backend's; the CRI runtime makes its own.
	ExecFIFODir string `json:"execFIFODir,omitempty"`
	// PodLogDir is the root of container logs, laid out as kubelet does:
	// NAMESPACE_NAME_UID/CONTAINER/ATTEMPT.log. Defaults to /var/log/pods.
	PodLogDir string `json:"podLogDir,omitempty"`
	// NodeLabels are added to the Node at registration.
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	// NodeIP overrides the InternalIP address detected from the default route.
	NodeIP string `json:"nodeIP,omitempty"`
	// ClusterDNS are the cluster DNS servers (IP addresses) ClusterFirst pods resolve with,
	// the kubelet's clusterDNS. None (the default) makes ClusterFirst pods use the host's
	// resolver configuration, with a MissingClusterDNS event, as the kubelet does.
	ClusterDNS []string `json:"clusterDNS,omitempty"`
	// ClusterDomain is the cluster's DNS domain, for pods' search paths and subdomain FQDNs.
	// Defaults to cluster.local.
	ClusterDomain string `json:"clusterDomain,omitempty"`
	// MaxPods is the pods capacity reported for the node. Defaults to 110.
	MaxPods int `json:"maxPods,omitempty"`
	// ContainerLogMaxSize is the size past which a container's log file is rotated, a
	// quantity such as "10Mi" (kubelet's containerLogMaxSize). Defaults to 10Mi.
	ContainerLogMaxSize string `json:"containerLogMaxSize,omitempty"`
	// ContainerLogMaxFiles is how many log files of one container attempt are kept, the live
	// one included (kubelet's containerLogMaxFiles). Defaults to 5; at least 2.
	ContainerLogMaxFiles int `json:"containerLogMaxFiles,omitempty"`
	// AllowedUnsafeSysctls are the sysctls, or patterns ending in "*" (kernel.msg*, net.core.*),
	// that pods may set beyond kubelet's safe set (kubelet's allowedUnsafeSysctls). Each must be
	// namespaced (net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*). A pod asking for
	// another is rejected with reason SysctlForbidden. Defaults to none.
	AllowedUnsafeSysctls []string `json:"allowedUnsafeSysctls,omitempty"`
	// SeccompProfileRoot is the directory seccomp profiles of type Localhost are read from
	// (kubelet's <root-dir>/seccomp): localhostProfile is a path below it. Defaults to
	// <stateDir>/seccomp.
	SeccompProfileRoot string `json:"seccompProfileRoot,omitempty"`

	// EvictionHard are the hard eviction thresholds, kubelet's evictionHard: signal
	// (memory.available, nodefs.available, nodefs.inodesFree, imagefs.available,
	// imagefs.inodesFree, pid.available) to a quantity ("100Mi") or a percentage of the
	// capacity ("10%"). Below one, the node reports the pressure condition and evicts a pod
	// per evictionMonitoringPeriod. A signal not named keeps its default: kubelet's
	// memory.available 100Mi, nodefs.available 10%, nodefs.inodesFree 5%, imagefs.available
	// 15%, imagefs.inodesFree 5%, and holdfast's pid.available 10%; "0%" disables one. The
	// memory.available and nodefs.available thresholds are kept out of allocatable.
	EvictionHard map[string]string `json:"evictionHard,omitempty"`
	// EvictionSoft are soft thresholds (same form), acted on once met for their
	// EvictionSoftGracePeriod (a duration per signal, required for each). Defaults to none.
	EvictionSoft            map[string]string `json:"evictionSoft,omitempty"`
	EvictionSoftGracePeriod map[string]string `json:"evictionSoftGracePeriod,omitempty"`
	// EvictionMaxPodGracePeriod bounds, in seconds, the grace period of pods evicted for a
	// soft threshold (kubelet's evictionMaxPodGracePeriod); pods evicted for a hard threshold
	// get 1s, as with kubelet. Defaults to 0.
	EvictionMaxPodGracePeriod int32 `json:"evictionMaxPodGracePeriod,omitempty"`
	// EvictionPressureTransitionPeriod is how long a pressure condition stays True after its
	// threshold was last met (kubelet's evictionPressureTransitionPeriod). Defaults to 5m.
	EvictionPressureTransitionPeriod Duration `json:"evictionPressureTransitionPeriod,omitempty"`
	// EvictionMonitoringPeriod is how often the eviction signals are observed; at most one
	// pod is evicted each time (kubelet's fixed 10s). Defaults to 10s.
	EvictionMonitoringPeriod Duration `json:"evictionMonitoringPeriod,omitempty"`
	// SystemReserved and KubeReserved are kept out of allocatable for the operating system
	// and for the node agent and runtime (kubelet's systemReserved and kubeReserved): cpu,
	// memory, ephemeral-storage and pid, as quantities. Allocatable is capacity less both,
	// less the hard memory.available and nodefs.available thresholds. Default to none.
	SystemReserved map[string]string `json:"systemReserved,omitempty"`
	KubeReserved   map[string]string `json:"kubeReserved,omitempty"`

	// CgroupsPerQOS makes the kubelet's cgroup hierarchy: kubepods, its burstable and
	// besteffort levels, and a cgroup per pod its containers are made in (agent/podcgroups).
	// Defaults to true, as the kubelet's; false leaves every container where the runtime puts
	// it by default.
	CgroupsPerQOS *bool `json:"cgroupsPerQOS,omitempty"`
	// CgroupRoot is the cgroup kubepods is made below. Defaults to "/".
	CgroupRoot string `json:"cgroupRoot,omitempty"`
	// CgroupDriver is how cgroups are made, the kubelet's cgroupDriver: "cgroupfs" (the
	// default) writes them; "systemd" makes them transient slices through systemd's D-Bus API
	// (kubepods.slice, kubepods-burstable.slice, ...), and runs containers in scopes below them.
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	// EnforceNodeAllocatable lists what is capped: "pods" caps kubepods at the node's capacity
	// less systemReserved and kubeReserved (the eviction thresholds stay inside it, as with the
	// kubelet, so that eviction comes before the OOM killer); "kube-reserved" and
	// "system-reserved" cap KubeReservedCgroup and SystemReservedCgroup at their reservation.
	// Defaults to ["pods"]; ["none"] or an empty list caps nothing (kubepods then gets the capacity).
	EnforceNodeAllocatable []string `json:"enforceNodeAllocatable,omitempty"`
	// KubeReservedCgroup and SystemReservedCgroup are existing cgroups (the agent's and
	// containerd's, the system's) capped when enforceNodeAllocatable names them.
	KubeReservedCgroup   string `json:"kubeReservedCgroup,omitempty"`
	SystemReservedCgroup string `json:"systemReservedCgroup,omitempty"`
	// PodPidsLimit is the most processes one pod may run (its cgroup's pids.max). Defaults to
	// -1: none.
	PodPidsLimit int64 `json:"podPidsLimit,omitempty"`
	// CPUCFSQuota turns CPU limits into CFS quotas, for pods and containers alike. Defaults
	// to true.
	CPUCFSQuota *bool `json:"cpuCFSQuota,omitempty"`
	// MemoryTrimAfter is how long after its start the agent gives back to the kernel the
	// memory its start used and its steady state does not (agent/memtrim): the pages of its
	// executable that only the start ran or read, and the Go heap's idle pages; then again
	// when its executable's resident pages grew by 8 MiB, at most every 5 minutes. Defaults
	// to 1m; 0s never trims.
	MemoryTrimAfter *Duration `json:"memoryTrimAfter,omitempty"`

	// Runtime chooses the backend pods run on: "containerd" (the default) drives containerd
	// through its Go client, in its own namespace, with holdfast's CNI and logger and no pause
	// container; "cri" drives any CRI runtime at CRIEndpoint (containerd's CRI plugin, CRI-O)
	// the way the kubelet does: the runtime makes each pod's sandbox, its pause container and
	// its network, and crictl sees holdfast's pods. See the README's "Runtime backends".
	Runtime string `json:"runtime,omitempty"`
	// CRIEndpoint is the CRI runtime's socket with runtime: cri. Defaults to
	// unix:///run/containerd/containerd.sock.
	CRIEndpoint string `json:"criEndpoint,omitempty"`

	Containerd ContainerdConfig `json:"containerd,omitempty"`
	CNI        CNIConfig        `json:"cni,omitempty"`
	// UplinkProfile chooses the defaults of the heartbeats, what the agent sends the
	// apiserver when nothing changes (nodeStatus; what is set there wins):
	//   - "kubelet" (the default): the kubelet's, the Lease renewed every 10s, a node that goes
	//     silent is noticed by the control plane in 40-50s;
	//   - "metered", for gateways on metered links: the Lease renewed every 2m (leaseDuration
	//     8m) and an unchanged node status written once an hour, about a tenth of the bytes
	//     (docs/benchmarks.md, "Uplink"). kube-controller-manager must then be run with
	//     --node-monitor-grace-period of at least 8m (10m advised), or it marks such nodes
	//     NotReady between renewals; a dead gateway is then noticed after that long (README,
	//     "Metered uplinks").
	UplinkProfile string `json:"uplinkProfile,omitempty"`

	NodeStatus NodeStatusConfig `json:"nodeStatus,omitempty"`
	Pods       PodsConfig       `json:"pods,omitempty"`
	GC         GCConfig         `json:"gc,omitempty"`

	// HealthzAddress is where /healthz is served, without authentication (loopback only by
	// default); the pods are listed on LocalAPISocket and the node API only.
	// Defaults to 127.0.0.1:10248; "-" disables the endpoint.
	HealthzAddress string `json:"healthzAddress,omitempty"`

	// Address is the IP address the node API (the kubelet API: containerLogs, exec,
	// portForward, pods, healthz) listens on, over HTTPS (kubelet's address). Defaults to
	// 0.0.0.0.
	Address string `json:"address,omitempty"`
	// Port is the node API's port, advertised in the Node's
	// status.daemonEndpoints.kubeletEndpoint (kubelet's port). Defaults to 10250; 0
	// disables the node API. It is served only with an apiserver (not standalone): every
	// request is authorized by the apiserver.
	Port *int `json:"port,omitempty"`
	// Authentication says whom the node API accepts (kubelet's authentication).
	Authentication AuthenticationConfig `json:"authentication,omitempty"`
	// LocalAPISocket is the unix socket holdfast's CLI talks to (`holdfast logs`, `exec`,
	// `restart`): the node API's operations with no apiserver involved, root only. Defaults
	// to <stateDir>/api.sock; "-" disables it.
	LocalAPISocket string `json:"localAPISocket,omitempty"`
	// ServerTLSBootstrap has the node API's serving certificate requested from the cluster
	// by CSR (signer kubernetes.io/kubelet-serving, for the node name and addresses) and
	// renewed before it expires, as the kubelet's serverTLSBootstrap. The cluster must approve
	// those CSRs (kube-controller-manager does not); until one is issued, and when false (the
	// default), the node API serves a self-signed certificate.
	ServerTLSBootstrap bool `json:"serverTLSBootstrap,omitempty"`
	// Tunnel makes the node API reachable through a konnectivity server the node dials out to,
	// for gateways the apiserver cannot dial (behind NAT). See TunnelConfig.
	Tunnel TunnelConfig `json:"tunnel,omitempty"`
}

// TunnelConfig connects the node API to the cluster through konnectivity
// (apiserver-network-proxy): holdfast is the agent, dials the server's agent port and keeps the
// stream open; the apiserver's egress selector ("cluster" egress) sends its connections to the
// node's address through the server, which forwards them over that stream to holdfast's node
// API, in process (agent/tunnel). Only connections to the node API are served through it.
type TunnelConfig struct {
	// Server is the konnectivity server's agent endpoint, host:port (the server's
	// --agent-port). Empty (the default): no tunnel, and every other key must be empty too.
	Server string `json:"server,omitempty"`
	// ServerName is the name verified in the server's certificate. Defaults to Server's host.
	ServerName string `json:"serverName,omitempty"`
	// CAFile verifies the server's certificate (the server's --cluster-cert). Required.
	CAFile string `json:"caFile,omitempty"`
	// CertFile and KeyFile are the client certificate holdfast authenticates with, verified by
	// the server's --cluster-ca-cert; read again at each connection, so a renewal on disk is
	// used without a restart.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// TokenFile holds a service account token holdfast authenticates with instead, for a server
	// run with --agent-namespace, --agent-service-account and --authentication-audience; read
	// at each connection. Either CertFile and KeyFile or TokenFile (or both) is required.
	TokenFile string `json:"tokenFile,omitempty"`
	// AgentID names holdfast to the server. Defaults to nodeName.
	AgentID string `json:"agentID,omitempty"`
	// AgentIdentifiers are the agent identifiers sent to the server, in the upstream agent's
	// form ("host=NAME&ipv4=IP"): with --proxy-strategies=destHost the server sends holdfast
	// the connections to those hosts. Defaults to host=<nodeName> and ipv4=/ipv6= for each of
	// the node's addresses, kept current as they change.
	AgentIdentifiers string `json:"agentIdentifiers,omitempty"`
	// Only serves the node API through the tunnel alone: no TCP listener on address:port at
	// all, so nothing on the node's network can reach it. The Node still advertises port: it
	// is the address the apiserver asks the tunnel for. Defaults to false (both).
	Only bool `json:"only,omitempty"`
}

// AuthenticationConfig says how node API clients are authenticated; anonymous requests are
// always refused.
type AuthenticationConfig struct {
	X509 X509AuthenticationConfig `json:"x509,omitempty"`
}

// X509AuthenticationConfig configures client certificate authentication.
type X509AuthenticationConfig struct {
	// ClientCAFile is a PEM bundle of the CAs whose client certificates the node API accepts
	// (user: the certificate's CN, groups: its O): the CA of the apiserver's
	// --kubelet-client-certificate. Empty (the default): client certificates are refused and
	// only bearer tokens (TokenReview) authenticate.
	ClientCAFile string `json:"clientCAFile,omitempty"`
}

// The runtime backends (Config.Runtime).
const (
	RuntimeContainerd = "containerd"
	RuntimeCRI        = "cri"
)

// ContainerdConfig says which containerd to use.
type ContainerdConfig struct {
	// Address is containerd's socket. Defaults to /run/containerd/containerd.sock.
	Address string `json:"address,omitempty"`
	// Namespace is the containerd namespace holdfast owns; nothing outside it is touched.
	// Defaults to "holdfast".
	Namespace string `json:"namespace,omitempty"`
	// RegistryConfigPath is a directory of registry host configuration in containerd's
	// certs.d layout: <dir>/<host[:port]>/hosts.toml (server, [host."..."] mirrors with
	// capabilities, ca, client, skip_verify, header; a server given as http:// is plain
	// HTTP), or Docker's ca.crt / client.cert / client.key files. A registry with no
	// directory is reached over HTTPS with the system's CAs. Defaults to
	// /etc/holdfast/certs.d; a missing directory means no host configuration.
	RegistryConfigPath string `json:"registryConfigPath,omitempty"`
	// RegistryCredentialsFile is a docker config.json ({"auths": {"HOST[:PORT]": {"auth":
	// ...}}}) with the node's own registry credentials, tried after a pod's
	// imagePullSecrets, like the config.json kubelet reads. Read at each pull that needs
	// credentials. Empty (the default) means none. Credential provider plugins are not
	// supported.
	RegistryCredentialsFile string `json:"registryCredentialsFile,omitempty"`
	// RequestTimeout bounds each call to containerd (kubelet's runtimeRequestTimeout): a
	// containerd that hangs fails the call, logged with its name, instead of holding the pod
	// sync, garbage collection or stats request that made it. Waiting for a process to exit
	// and unpacking an image's layer are not bounded by it. Defaults to 2m.
	RequestTimeout Duration `json:"requestTimeout,omitempty"`
	// ImagePullProgressTimeout cancels an image pull that waits this long on the registry
	// without receiving a byte (containerd CRI's image_pull_progress_timeout): a registry that
	// accepts a connection and answers nothing, or a link that drops packets without a reset,
	// fails the pull (ErrImagePull, then the back-off) instead of holding the pod forever. A
	// pull as such has no deadline: a slow link may take hours. Defaults to 5m.
	ImagePullProgressTimeout Duration `json:"imagePullProgressTimeout,omitempty"`
}

// CNIConfig says where the CNI network configuration and plugins are.
type CNIConfig struct {
	// ConfDir holds the CNI network configuration (the first .conflist/.conf in lexical order
	// is used). Defaults to /etc/cni/net.d.
	ConfDir string `json:"confDir,omitempty"`
	// BinDirs are searched for plugin binaries. Defaults to [/opt/cni/bin, /usr/lib/cni].
	BinDirs []string `json:"binDirs,omitempty"`
	// NetNSDir is where pod network namespaces are bind-mounted. Defaults to /var/run/netns.
	NetNSDir string `json:"netnsDir,omitempty"`
}

// The uplink profiles (Config.UplinkProfile).
const (
	UplinkKubelet = "kubelet"
	UplinkMetered = "metered"
)

// NodeStatusConfig sets the heartbeat cadence; the defaults are kubelet's (uplinkProfile
// kubelet), or the metered profile's.
type NodeStatusConfig struct {
	// LeaseDuration is the Lease's leaseDurationSeconds. Defaults to 40s.
	LeaseDuration Duration `json:"leaseDuration,omitempty"`
	// LeaseRenewInterval is how often the Lease is renewed. Defaults to 10s.
	LeaseRenewInterval Duration `json:"leaseRenewInterval,omitempty"`
	// UpdateFrequency is how often node status is computed. Defaults to 10s.
	UpdateFrequency Duration `json:"updateFrequency,omitempty"`
	// ReportFrequency is the longest time between two writes of an unchanged node status.
	// Defaults to 5m.
	ReportFrequency Duration `json:"reportFrequency,omitempty"`
}

// PodsConfig tunes the pod workers.
type PodsConfig struct {
	// RelistPeriod is how often the runtime is relisted to catch what containerd's task
	// events missed; the events keep the pods up to date, and the relist also runs at once
	// when their subscription is back after a break (containerd restarted). Defaults to 1m:
	// on containerd 1.6 a relist asks every container's shim for its state, which cost the
	// node more CPU than anything else at 1s (kubelet's generic PLEG period; its evented PLEG
	// relists every 5m), or a third of RelistThreshold when that is shorter.
	RelistPeriod Duration `json:"relistPeriod,omitempty"`
	// RelistThreshold is how long the runtime may go without a successful relist before the
	// agent reports itself unhealthy: /healthz fails and the Node's Ready condition turns
	// False with kubelet's "PLEG is not healthy" message. Defaults to 3m (kubelet's PLEG
	// relist threshold); must be longer than RelistPeriod.
	RelistThreshold Duration `json:"relistThreshold,omitempty"`
	// BackOffBase and BackOffMax bound the restart back-off of crashing containers.
	// Default to 10s and 300s, as kubelet.
	BackOffBase Duration `json:"backOffBase,omitempty"`
	BackOffMax  Duration `json:"backOffMax,omitempty"`
	// ImagePullBackOffBase and ImagePullBackOffMax bound the back-off between failed pulls
	// of one image by one pod (ImagePullBackOff). Default to 10s and 300s, as kubelet.
	ImagePullBackOffBase Duration `json:"imagePullBackOffBase,omitempty"`
	ImagePullBackOffMax  Duration `json:"imagePullBackOffMax,omitempty"`
	// VolumeResyncPeriod is how often configMap, secret, downwardAPI and projected volumes are
	// re-projected (ConfigMap and Secret changes also arrive at once through watches) and
	// service account tokens checked for renewal. Defaults to 30s.
	VolumeResyncPeriod Duration `json:"volumeResyncPeriod,omitempty"`
}

// GCConfig tunes container and image garbage collection (see agent/gc).
type GCConfig struct {
	// Period is how often containers and images are collected. Defaults to 1m.
	Period Duration `json:"period,omitempty"`
	// MaxDeadPerContainer is how many exited attempts of one container of a live pod are
	// kept, for its lastState and `logs --previous`. Defaults to 1.
	MaxDeadPerContainer int `json:"maxDeadPerContainer,omitempty"`
	// ImageHighThresholdPercent: unused images are removed when the image file system's usage
	// reaches it. Defaults to 85; 100 disables image collection.
	ImageHighThresholdPercent int `json:"imageHighThresholdPercent,omitempty"`
	// ImageLowThresholdPercent: image collection frees down to it. Defaults to 80.
	ImageLowThresholdPercent int `json:"imageLowThresholdPercent,omitempty"`
	// ImageMinAge keeps images used or pulled less than this ago. Defaults to 2m.
	ImageMinAge Duration `json:"imageMinAge,omitempty"`
	// PinnedImages are never removed. The pause image and the images preloaded from
	// imagePreloadDir are pinned anyway.
	PinnedImages []string `json:"pinnedImages,omitempty"`
	// ImageFSPath is a path on the image file system, whose usage the thresholds apply to.
	// Defaults to the root of containerd's snapshotter, as containerd reports it.
	ImageFSPath string `json:"imageFSPath,omitempty"`
}

// Duration is a time.Duration that reads and writes as "10s" in YAML and JSON.
type Duration struct{ time.Duration }

// D is shorthand for building a Duration.
func D(d time.Duration) Duration { return Duration{d} }

// UnmarshalJSON accepts a Go duration string ("10s", "1m30s").
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %s: %w", string(b), err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// Default returns the configuration an empty file yields.
func Default() Config {
	var c Config
	c.applyDefaults()
	return c
}

func (c *Config) applyDefaults() {
	if c.NodeName == "" {
		if h, err := os.Hostname(); err == nil {
			c.NodeName = lower(h)
		}
	}
	setDefault(&c.StateDir, "/var/lib/holdfast")
	if c.BootstrapKubeconfig != "" {
		setDefault(&c.Kubeconfig, c.StateDir+"/kubeconfig")
	}
	setDefault(&c.StateKeyFile, "/etc/holdfast/state.key")
	setDefault(&c.ManifestDir, "/etc/holdfast/manifests")
	if c.ManifestDir == "-" {
		c.ManifestDir = ""
	}
	setDefault(&c.PodLogDir, "/var/log/pods")
	setDefault(&c.SeccompProfileRoot, filepath.Join(c.StateDir, "seccomp"))
	setDefault(&c.ImagePreloadDir, "/usr/lib/holdfast/images")
	setDefault(&c.PolicyDir, "/etc/holdfast/policies")
	setDefault(&c.PolicyCacheDir, "/run/holdfast/wasm-cache")
	setDefault(&c.ExecFIFODir, "/run/holdfast/exec")
	if c.PolicyCacheDir == "-" {
		c.PolicyCacheDir = ""
	}
	if c.ImagePreloadDir == "-" {
		c.ImagePreloadDir = ""
	}
	if c.MaxPods == 0 {
		c.MaxPods = 110
	}
	if c.CgroupsPerQOS == nil {
		c.CgroupsPerQOS = ptrTo(true)
	}
	if c.MemoryTrimAfter == nil {
		c.MemoryTrimAfter = &Duration{time.Minute}
	}
	if c.CPUCFSQuota == nil {
		c.CPUCFSQuota = ptrTo(true)
	}
	setDefault(&c.CgroupRoot, "/")
	setDefault(&c.CgroupDriver, "cgroupfs")
	if c.EnforceNodeAllocatable == nil {
		c.EnforceNodeAllocatable = []string{"pods"}
	}
	setDefault(&c.ClusterDomain, "cluster.local")
	setDefault(&c.Runtime, RuntimeContainerd)
	setDefault(&c.CRIEndpoint, "unix:///run/containerd/containerd.sock")
	setDefault(&c.Containerd.Address, "/run/containerd/containerd.sock")
	setDefault(&c.Containerd.Namespace, "holdfast")
	setDefault(&c.Containerd.RegistryConfigPath, "/etc/holdfast/certs.d")
	setDefaultDuration(&c.Containerd.RequestTimeout, 2*time.Minute)
	setDefaultDuration(&c.Containerd.ImagePullProgressTimeout, 5*time.Minute)
	setDefault(&c.CNI.ConfDir, "/etc/cni/net.d")
	if len(c.CNI.BinDirs) == 0 {
		c.CNI.BinDirs = []string{"/opt/cni/bin", "/usr/lib/cni"}
	}
	setDefault(&c.CNI.NetNSDir, "/var/run/netns")
	setDefault(&c.UplinkProfile, UplinkKubelet)
	if c.UplinkProfile == UplinkMetered {
		// A twelfth of the renewals, and the unchanged status hourly rather than every 5m.
		setDefaultDuration(&c.NodeStatus.LeaseDuration, 8*time.Minute)
		setDefaultDuration(&c.NodeStatus.LeaseRenewInterval, 2*time.Minute)
		setDefaultDuration(&c.NodeStatus.ReportFrequency, time.Hour)
	}
	setDefaultDuration(&c.NodeStatus.LeaseDuration, 40*time.Second)
	setDefaultDuration(&c.NodeStatus.LeaseRenewInterval, 10*time.Second)
	setDefaultDuration(&c.NodeStatus.UpdateFrequency, 10*time.Second)
	setDefaultDuration(&c.NodeStatus.ReportFrequency, 5*time.Minute)
	setDefaultDuration(&c.Pods.RelistThreshold, 3*time.Minute)
	// A threshold set below the period's default takes the period down with it (a third of
	// it), so that a configuration written when the period was 1s stays valid.
	setDefaultDuration(&c.Pods.RelistPeriod, min(time.Minute, c.Pods.RelistThreshold.Duration/3))
	setDefaultDuration(&c.Pods.BackOffBase, 10*time.Second)
	setDefaultDuration(&c.Pods.BackOffMax, 300*time.Second)
	setDefaultDuration(&c.Pods.ImagePullBackOffBase, 10*time.Second)
	setDefaultDuration(&c.Pods.ImagePullBackOffMax, 300*time.Second)
	setDefault(&c.ContainerLogMaxSize, "10Mi")
	if c.ContainerLogMaxFiles == 0 {
		c.ContainerLogMaxFiles = 5
	}
	setDefaultDuration(&c.GC.Period, time.Minute)
	if c.GC.MaxDeadPerContainer == 0 {
		c.GC.MaxDeadPerContainer = 1
	}
	if c.GC.ImageHighThresholdPercent == 0 {
		c.GC.ImageHighThresholdPercent = 85
	}
	if c.GC.ImageLowThresholdPercent == 0 {
		c.GC.ImageLowThresholdPercent = 80
	}
	setDefaultDuration(&c.GC.ImageMinAge, 2*time.Minute)
	setDefaultDuration(&c.Pods.VolumeResyncPeriod, 30*time.Second)
	// Every signal has its threshold written out, the ones the file names and the defaults.
	if c.EvictionHard == nil {
		c.EvictionHard = map[string]string{}
	}
	for signal, v := range DefaultEvictionHard {
		if _, ok := c.EvictionHard[signal]; !ok {
			c.EvictionHard[signal] = v
		}
	}
	setDefaultDuration(&c.EvictionPressureTransitionPeriod, 5*time.Minute)
	setDefaultDuration(&c.EvictionMonitoringPeriod, 10*time.Second)
	setDefault(&c.HealthzAddress, "127.0.0.1:10248")
	setDefault(&c.LocalAPISocket, filepath.Join(c.StateDir, "api.sock"))
	if c.LocalAPISocket == "-" {
		c.LocalAPISocket = ""
	}
	if c.HealthzAddress == "-" {
		c.HealthzAddress = ""
	}
	setDefault(&c.Address, "0.0.0.0")
	if c.Port == nil {
		port := 10250
		c.Port = &port
	}
	if c.Tunnel.Server != "" {
		setDefault(&c.Tunnel.AgentID, c.NodeName)
	}
}

// NodeAPIPort is the port the node API serves on, 0 when it is disabled.
func (c *Config) NodeAPIPort() int {
	if c.Port == nil {
		return 0
	}
	return *c.Port
}

// MaxFileBytes bounds the configuration file, which is read whole: a configuration is a few
// KiB, and an unbounded read of whatever the path names (a device, a runaway file) must not
// take the agent's memory.
const MaxFileBytes = 1 << 20

// Load reads a YAML (or JSON) configuration file, applies defaults and validates it. Unknown
// fields are an error: a misspelt key must not silently fall back to a default.
func Load(path string) (Config, error) { return LoadWith(path, nil) }

// LoadWith is Load with a change applied between reading the file and defaulting: command
// line flags use it to override the file. An empty path is an empty file. It returns either a
// valid configuration or an error, never a half-read configuration with an error.
func LoadWith(path string, override func(*Config)) (Config, error) {
	var b []byte
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return Config{}, fmt.Errorf("read config: %w", err)
		}
		defer f.Close()
		if b, err = io.ReadAll(io.LimitReader(f, MaxFileBytes+1)); err != nil {
			return Config{}, fmt.Errorf("read config %s: %w", path, err)
		}
	}
	c, err := Parse(b, override)
	if err != nil && path != "" {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, err
}

// Parse is LoadWith on the file's content: decode (strictly), override, default, validate.
// It returns the zero Config with any error.
func Parse(b []byte, override func(*Config)) (Config, error) {
	if len(b) > MaxFileBytes {
		return Config{}, fmt.Errorf("%d bytes or more, over the %d-byte limit of a configuration file", len(b), MaxFileBytes)
	}
	var c Config
	if len(b) > 0 {
		if err := yaml.UnmarshalStrict(b, &c); err != nil {
			return Config{}, fmt.Errorf("parse: %w", err)
		}
	}
	if override != nil {
		override(&c)
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate reports every problem of an already defaulted configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("nodeName is empty and the hostname could not be read"))
	}
	if c.MaxPods < 0 {
		errs = append(errs, fmt.Errorf("maxPods %d is negative", c.MaxPods))
	}
	if c.StateKeyTPM != "" && !filepath.IsAbs(c.StateKeyTPM) {
		errs = append(errs, fmt.Errorf("stateKeyTPM %q is not an absolute path (the TPM, e.g. /dev/tpmrm0)", c.StateKeyTPM))
	}
	if c.StateKeyTPM != "" && c.StateKeyFile == "" {
		errs = append(errs, errors.New("stateKeyTPM needs stateKeyFile, where the key sealed by the TPM is kept"))
	}
	if c.StateKeyCredential != "" {
		if c.StateKeyTPM != "" {
			errs = append(errs, errors.New("stateKeyCredential and stateKeyTPM both set: the credential is the key systemd unsealed (systemd-creds encrypt --with-key=tpm2 seals it with the TPM)"))
		}
		if c.StateKeyCredential != filepath.Base(c.StateKeyCredential) || c.StateKeyCredential == "." || c.StateKeyCredential == ".." {
			errs = append(errs, fmt.Errorf("stateKeyCredential %q is not a credential name (a file name, as in LoadCredentialEncrypted=NAME:FILE)", c.StateKeyCredential))
		}
	}
	if c.Runtime != RuntimeContainerd && c.Runtime != RuntimeCRI {
		errs = append(errs, fmt.Errorf("runtime %q is neither %q nor %q", c.Runtime, RuntimeContainerd, RuntimeCRI))
	}
	for _, ip := range c.ClusterDNS {
		if net.ParseIP(ip) == nil {
			errs = append(errs, fmt.Errorf("clusterDNS %q is not an IP address", ip))
		}
	}
	if msgs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("clusterDomain %q: %s", c.ClusterDomain, strings.Join(msgs, "; ")))
	}
	for name, d := range map[string]Duration{
		"nodeStatus.leaseDuration":            c.NodeStatus.LeaseDuration,
		"nodeStatus.leaseRenewInterval":       c.NodeStatus.LeaseRenewInterval,
		"nodeStatus.updateFrequency":          c.NodeStatus.UpdateFrequency,
		"nodeStatus.reportFrequency":          c.NodeStatus.ReportFrequency,
		"pods.relistPeriod":                   c.Pods.RelistPeriod,
		"pods.relistThreshold":                c.Pods.RelistThreshold,
		"containerd.requestTimeout":           c.Containerd.RequestTimeout,
		"containerd.imagePullProgressTimeout": c.Containerd.ImagePullProgressTimeout,
		"pods.backOffBase":                    c.Pods.BackOffBase,
		"pods.backOffMax":                     c.Pods.BackOffMax,
		"gc.period":                           c.GC.Period,
		"gc.imageMinAge":                      c.GC.ImageMinAge,
		"pods.volumeResyncPeriod":             c.Pods.VolumeResyncPeriod,
		"evictionPressureTransitionPeriod":    c.EvictionPressureTransitionPeriod,
		"evictionMonitoringPeriod":            c.EvictionMonitoringPeriod,
	} {
		if d.Duration <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if c.MemoryTrimAfter != nil && c.MemoryTrimAfter.Duration < 0 {
		errs = append(errs, fmt.Errorf("memoryTrimAfter %s is negative (0s never trims)", c.MemoryTrimAfter))
	}
	if c.UplinkProfile != UplinkKubelet && c.UplinkProfile != UplinkMetered {
		errs = append(errs, fmt.Errorf("uplinkProfile %q: want %q or %q", c.UplinkProfile, UplinkKubelet, UplinkMetered))
	}
	if c.NodeStatus.LeaseRenewInterval.Duration >= c.NodeStatus.LeaseDuration.Duration {
		errs = append(errs, fmt.Errorf("nodeStatus.leaseRenewInterval (%s) must be shorter than nodeStatus.leaseDuration (%s)",
			c.NodeStatus.LeaseRenewInterval, c.NodeStatus.LeaseDuration))
	}
	if c.Pods.RelistThreshold.Duration <= c.Pods.RelistPeriod.Duration {
		errs = append(errs, fmt.Errorf("pods.relistThreshold (%s) must be longer than pods.relistPeriod (%s)", c.Pods.RelistThreshold, c.Pods.RelistPeriod))
	}
	if c.Pods.BackOffMax.Duration < c.Pods.BackOffBase.Duration {
		errs = append(errs, fmt.Errorf("pods.backOffMax (%s) is below pods.backOffBase (%s)", c.Pods.BackOffMax, c.Pods.BackOffBase))
	}
	if q, err := resource.ParseQuantity(c.ContainerLogMaxSize); err != nil || q.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("containerLogMaxSize %q: want a positive quantity such as 10Mi", c.ContainerLogMaxSize))
	}
	for _, s := range c.AllowedUnsafeSysctls {
		if ns, _, _ := sysctl.GetNamespace(s); ns == sysctl.UnknownNamespace || ns == sysctl.UserNamespace {
			errs = append(errs, fmt.Errorf("allowedUnsafeSysctls: %q is not a namespaced sysctl (net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*)", s))
		}
	}
	if _, err := c.EvictionThresholds(); err != nil {
		errs = append(errs, err)
	}
	if c.EvictionMaxPodGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("evictionMaxPodGracePeriod %d is negative", c.EvictionMaxPodGracePeriod))
	}
	if _, err := c.Reserved(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateCgroups()...)
	if net.ParseIP(c.Address) == nil {
		errs = append(errs, fmt.Errorf("address %q is not an IP address", c.Address))
	}
	if p := c.NodeAPIPort(); p < 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("port %d: want 1-65535, or 0 to disable the node API", p))
	}
	errs = append(errs, c.Tunnel.validate(c)...)
	if c.ContainerLogMaxFiles < 2 {
		errs = append(errs, fmt.Errorf("containerLogMaxFiles %d: at least 2 (the live file and one rotated)", c.ContainerLogMaxFiles))
	}
	if c.GC.MaxDeadPerContainer < 1 {
		errs = append(errs, fmt.Errorf("gc.maxDeadPerContainer %d: at least 1", c.GC.MaxDeadPerContainer))
	}
	if h, l := c.GC.ImageHighThresholdPercent, c.GC.ImageLowThresholdPercent; h < 1 || h > 100 || l < 1 || l >= h && h != 100 {
		errs = append(errs, fmt.Errorf("gc.imageHighThresholdPercent %d, gc.imageLowThresholdPercent %d: want 1 <= low < high <= 100", h, l))
	}
	return errors.Join(errs...)
}

// validate reports the tunnel section's problems, each with what to do.
func (t *TunnelConfig) validate(c *Config) []error {
	if t.Server == "" {
		if *t != (TunnelConfig{}) {
			return []error{errors.New("tunnel: server is empty but other tunnel keys are set; set tunnel.server (the konnectivity server's host:port) or remove the tunnel section")}
		}
		return nil
	}
	var errs []error
	if host, port, err := net.SplitHostPort(t.Server); err != nil || host == "" || port == "" {
		errs = append(errs, fmt.Errorf("tunnel.server %q: want host:port of the konnectivity server's agent port", t.Server))
	}
	if t.CAFile == "" {
		errs = append(errs, errors.New("tunnel.caFile is required: the CA that verifies the konnectivity server's certificate"))
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs = append(errs, errors.New("tunnel.certFile and tunnel.keyFile go together: set both or neither"))
	}
	if t.CertFile == "" && t.TokenFile == "" {
		errs = append(errs, errors.New("tunnel: no credentials; set tunnel.certFile and tunnel.keyFile (mTLS) or tunnel.tokenFile (service account token)"))
	}
	if t.AgentIdentifiers != "" {
		v, err := url.ParseQuery(t.AgentIdentifiers)
		if err != nil {
			errs = append(errs, fmt.Errorf("tunnel.agentIdentifiers %q: %w", t.AgentIdentifiers, err))
		}
		for k := range v {
			if !slices.Contains([]string{"host", "ipv4", "ipv6", "cidr", "uid", "default-route"}, k) {
				errs = append(errs, fmt.Errorf("tunnel.agentIdentifiers: %q is not an identifier type (host, ipv4, ipv6, cidr, uid, default-route)", k))
			}
		}
	}
	if c.NodeAPIPort() == 0 {
		errs = append(errs, errors.New("tunnel needs the node API: port is 0; set port (the port the Node advertises and the apiserver asks the tunnel for)"))
	}
	if c.Standalone() {
		errs = append(errs, errors.New("tunnel needs an apiserver: set kubeconfig or bootstrapKubeconfig, or remove the tunnel section"))
	}
	return errs
}

// ContainerLogMaxSizeBytes is ContainerLogMaxSize in bytes (once validated).
func (c *Config) ContainerLogMaxSizeBytes() int64 {
	q, err := resource.ParseQuantity(c.ContainerLogMaxSize)
	if err != nil {
		return 0
	}
	return q.Value()
}

// EvictionThresholds are the hard and soft eviction thresholds, defaults included.
func (c *Config) EvictionThresholds() ([]EvictionThreshold, error) {
	return ParseEvictionThresholds(c.EvictionHard, c.EvictionSoft, c.EvictionSoftGracePeriod)
}

// reservable are the resources systemReserved and kubeReserved may name.
var reservable = []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, "pid"}

// Reserved is systemReserved and kubeReserved added up: what allocatable leaves out besides
// the hard eviction thresholds.
func (c *Config) Reserved() (v1.ResourceList, error) {
	out := v1.ResourceList{}
	var errs []error
	for _, r := range []struct {
		key string
		m   map[string]string
	}{{"systemReserved", c.SystemReserved}, {"kubeReserved", c.KubeReserved}} {
		for name, v := range r.m {
			if !slices.Contains(reservable, v1.ResourceName(name)) {
				errs = append(errs, fmt.Errorf("%s: %q is not one of %v", r.key, name, reservable))
				continue
			}
			q, err := resource.ParseQuantity(v)
			if err != nil || q.Sign() < 0 {
				errs = append(errs, fmt.Errorf("%s: %s: %q is not a quantity", r.key, name, v))
				continue
			}
			sum := out[v1.ResourceName(name)]
			sum.Add(q)
			out[v1.ResourceName(name)] = sum
		}
	}
	return out, errors.Join(errs...)
}

// Enforced names the node allocatable enforcement keys (enforceNodeAllocatable).
const (
	EnforcePods           = "pods"
	EnforceKubeReserved   = "kube-reserved"
	EnforceSystemReserved = "system-reserved"
)

// Enforces says enforceNodeAllocatable names key.
func (c *Config) Enforces(key string) bool { return slices.Contains(c.EnforceNodeAllocatable, key) }

func (c *Config) validateCgroups() []error {
	var errs []error
	switch c.CgroupDriver {
	case "cgroupfs":
	case "systemd":
		// The kubelet's rule (NewCgroupName): a systemd name writes "-" as "_", so a "_" of
		// cgroupRoot's own would not read back.
		if strings.Contains(c.CgroupRoot, "_") {
			errs = append(errs, fmt.Errorf("cgroupRoot %q: no \"_\" with cgroupDriver systemd (it stands for \"-\" in slice names)", c.CgroupRoot))
		}
	default:
		errs = append(errs, fmt.Errorf("cgroupDriver %q: want \"cgroupfs\" or \"systemd\"", c.CgroupDriver))
	}
	if !strings.HasPrefix(c.CgroupRoot, "/") {
		errs = append(errs, fmt.Errorf("cgroupRoot %q is not an absolute cgroup path", c.CgroupRoot))
	}
	for _, k := range c.EnforceNodeAllocatable {
		switch k {
		case EnforcePods, "none":
		case EnforceKubeReserved:
			if c.KubeReservedCgroup == "" {
				errs = append(errs, errors.New("enforceNodeAllocatable names kube-reserved without kubeReservedCgroup"))
			}
		case EnforceSystemReserved:
			if c.SystemReservedCgroup == "" {
				errs = append(errs, errors.New("enforceNodeAllocatable names system-reserved without systemReservedCgroup"))
			}
		default:
			errs = append(errs, fmt.Errorf("enforceNodeAllocatable: %q is not pods, kube-reserved, system-reserved or none", k))
		}
	}
	if c.Enforces(EnforcePods) && c.CgroupsPerQOS != nil && !*c.CgroupsPerQOS {
		errs = append(errs, errors.New("enforceNodeAllocatable names pods with cgroupsPerQOS false: there is no kubepods to cap"))
	}
	return errs
}

func ptrTo[T any](v T) *T { return &v }

// Standalone reports whether the agent runs without an apiserver.
func (c *Config) Standalone() bool { return c.Kubeconfig == "" }

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

func setDefaultDuration(d *Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
