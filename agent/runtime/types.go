package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// State is where a container is in its life, as the runtime sees it.
type State string

const (
	// StateCreated: the container exists but its process was never started.
	StateCreated State = "created"
	// StateRunning: its process runs.
	StateRunning State = "running"
	// StateExited: its process ended; ExitCode, FinishedAt and Reason say how.
	StateExited State = "exited"
)

// Reasons recorded for exits, named as kubelet names them.
const (
	ReasonCompleted = "Completed"
	ReasonError     = "Error"
	ReasonOOMKilled = "OOMKilled"
	// ReasonTaskLost: the container was started but its process is gone without an exit
	// record (containerd or the host restarted). Kubelet reports the same as exit code 255
	// with reason Unknown.
	ReasonTaskLost = "Unknown"
)

// Container is what the runtime knows about one container holdfast created.
type Container struct {
	ID           string
	PodUID       string
	PodName      string
	PodNamespace string
	Name         string
	Attempt      int
	// Image is the image reference the pod asked for; ImageRef its resolved digest form.
	Image    string
	ImageRef string
	// SpecHash identifies the container spec it was created from, so that a changed spec can
	// be told from a restart.
	SpecHash string
	LogPath  string
	// Static: the container is a static pod's (ContainerConfig.Static).
	Static bool

	State      State
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
	ExitCode   int32
	Reason     string
	Message    string
	Pid        uint32
	// Recorded: the exit is written in the container's labels and its task deleted.
	Recorded bool
	// MemoryRequest is the memory request it was created with (ContainerConfig.MemoryRequest);
	// nil for a container created before holdfast recorded it.
	MemoryRequest *int64
}

// ContainerConfig is everything needed to create one container of a pod.
type ContainerConfig struct {
	PodUID       string
	PodName      string
	PodNamespace string
	Name         string
	Attempt      int
	SpecHash     string
	// Static: the pod came from a static manifest. Kept on the container, so that a previous
	// version of a static pod is told from an API pod of the same name without the state
	// store's record of the pod, which a corrupt or lost database takes with it.
	Static bool

	// Image is the reference as written in the pod; it must already be present
	// (see EnsureImage).
	Image      string
	Command    []string // overrides the image's Entrypoint when set
	Args       []string // overrides the image's Cmd when set
	Env        []string // KEY=VALUE, appended to the image's environment
	WorkingDir string

	// NetNSPath is the pod's network namespace; empty means the host network, and with it the
	// host's UTS namespace (its hostname).
	NetNSPath string
	// Hostname is the container's hostname, in its own UTS namespace (not with the host network).
	Hostname string
	Mounts   []specs.Mount
	LogPath  string
	// Stdin keeps a stdin open for `kubectl attach -i` (the pod's stdin: true), which
	// StdinOnce closes after the first attach ends. TTY gives the process a terminal. The
	// runtime supports stdin only with a terminal: see Runtime.StartContainer.
	Stdin, StdinOnce, TTY bool
	// TerminationMessagePath is where the container writes its termination message (a backend
	// that reads it itself, CRI, is told).
	TerminationMessagePath string
	// PIDNamespaceOf is the container whose PID namespace this one joins (an ephemeral
	// container's target), by ID for a backend that joins it by container (CRI) and by its
	// running process for one that joins it by process (containerd); empty: none.
	PIDNamespaceOf    string
	PIDNamespaceOfPid uint32
	// Resources are the container's cgroup settings and OOM score.
	Resources Resources
	// MemoryRequest is the container's memory request in bytes (0: none), recorded with it:
	// the one resource a resize changes that no cgroup holds, so that a container whose
	// memory resizePolicy is RestartContainer is restarted when only its request changed, as
	// the kubelet compares it with its actuated resources.
	MemoryRequest int64
	// CgroupParent is the pod's cgroup the container is made in ("/kubepods/burstable/pod<uid>",
	// a path in the cgroupfs hierarchy, agent/podcgroups); each backend translates it once:
	// containerd's OCI cgroupsPath below it, the CRI sandbox's cgroup_parent. Empty: the
	// runtime's default place (cgroupsPerQOS off, or a pod made before the hierarchy was).
	CgroupParent string
	// Security is the container's confinement, from its pod's and its own securityContext.
	Security Security
	// Pod is the pod the container belongs to, for a backend that makes the pod's sandbox when
	// it has none (CRI, after an agent restart: Network.Setup). Not a description of the
	// container: what a backend applies to it is in the fields above. Read only.
	Pod *v1.Pod
}

// Resources are a container's cgroup settings, from its requests and limits as the kubelet
// computes them, and its OOM score adjustment from its pod's QoS class.
type Resources struct {
	CPUShares uint64
	// CPUQuota and CPUPeriod (microseconds) are the CFS quota of a CPU limit; 0: none.
	CPUQuota, CPUPeriod int64
	// MemoryLimit in bytes; 0: none.
	MemoryLimit int64
	// NoSwap: memory.swap.max is 0 (cgroup v2 with the swap controller).
	NoSwap      bool
	OOMScoreAdj int
}

// Errors a caller classifies with errors.Is to name a waiting reason, as kubelet does.
var (
	// ErrImageNeverPull: the image is absent and the pull policy is Never.
	ErrImageNeverPull = errors.New("image not present and pull policy is Never")
	// ErrImagePull: the image could not be fetched.
	ErrImagePull = errors.New("image pull failed")
	// ErrNotFound: the container (or image) is not known to the runtime. Each backend maps
	// its own not-found (containerd's errdefs, a CRI status) to it.
	ErrNotFound = errors.New("not found")
	// ErrCreateContainer: the runtime refused to create the container.
	ErrCreateContainer = errors.New("create container failed")
	// ErrStartContainer: the container's process could not be started.
	ErrStartContainer = errors.New("start container failed")
)

// ConfigError is a container's configuration that cannot run as given (runAsNonRoot with an
// image that runs as root): the pod's fault, reported as CreateContainerConfigError, where
// any other failure of CreateContainer is the runtime's (CreateContainerError).
type ConfigError struct{ Message string }

func (e *ConfigError) Error() string { return e.Message }

// ImageResult says how EnsureImage made an image available.
type ImageResult struct {
	// Digest is the image's manifest digest, the one its containers will run.
	Digest string
	// Pulled: fetched from the registry by this call (not already present).
	Pulled bool
	// Stale is set when the pull policy asked for a pull (Always), the registry could not be
	// reached, and the image already present was used instead: a gateway offline keeps its
	// workloads. It says why the pull failed.
	Stale error
}

// ContainerID derives the ID of a container attempt, for the backends that choose their
// containers' IDs (containerd, hollow). It is deterministic so that a create retried after a
// crash finds the container it already made instead of making another.
func ContainerID(podUID, name string, attempt int) string {
	sum := sha256.Sum256([]byte(podUID + "/" + name + "/" + strconv.Itoa(attempt)))
	return hex.EncodeToString(sum[:])
}

// NormalizeImageRef makes a reference fully qualified the way the CRI plugin does
// ("busybox" -> "docker.io/library/busybox:latest"), so images preloaded under their full
// name are found by the short name a pod uses.
func NormalizeImageRef(ref string) string {
	if n, err := normalize(ref); err == nil {
		return n
	}
	return ref
}

// TaskEvent is the exit or OOM of a container's main process (SubscribeTaskEvents).
type TaskEvent struct {
	ContainerID string
	OOM         bool
}

// Credentials answers the username and password (or "" and an identity token) for a
// registry host, as a docker config.json gives them; ok is false when it knows none.
type Credentials func(host string) (username, secret string, ok bool)

func normalize(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", err
	}
	return named.String(), nil
}
