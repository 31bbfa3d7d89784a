package runtime

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/network"
)

// Runtime is the container runtime the pods run on: the boundary between the pod workers
// and what makes containers. Each backend is a package beside this one: containerd through
// its client (agent/runtime/containerd, a gateway's default), any CRI runtime
// (agent/runtime/cri), and the hollow one that keeps containers as records for fleet
// simulations (agent/runtime/hollow). agent/runtime/runtimetest asserts this contract of
// each; what a backend adds (exec, attach, stats) is declared by the parts that use it.
type Runtime interface {
	// EnsureImage makes the image available per the pull policy, with creds for a registry
	// that asks; errors wrap ErrImageNeverPull or ErrImagePull.
	EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy, creds Credentials) (ImageResult, error)
	// CreateContainer creates, without starting, the attempt cfg describes and returns its
	// ID; an attempt that exists already is returned as it is.
	CreateContainer(ctx context.Context, cfg ContainerConfig) (string, error)
	// StartContainer starts a created container's process.
	StartContainer(ctx context.Context, id string) error
	// StopContainer stops a running container within grace and records its exit; one that
	// is not running, or gone, is left as it is.
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	// RecordExit records an exited container's exit once (Container.Recorded), returning the
	// reason it recorded, empty when there was nothing to record.
	RecordExit(ctx context.Context, id string) (string, error)
	// RecordOOM marks the container as killed by the OOM killer.
	RecordOOM(ctx context.Context, id string) error
	// RemoveContainer deletes a container, killing its process first; a container that does
	// not exist is not an error.
	RemoveContainer(ctx context.Context, id string) error
	// List returns every container holdfast made; ListPod those of one pod.
	List(ctx context.Context) ([]Container, error)
	ListPod(ctx context.Context, podUID string) ([]Container, error)
	// SubscribeTaskEvents calls fn for each exit and OOM of a container's main process until
	// ctx ends or the subscription fails, calling subscribed once it is in place; what came
	// before is learnt by a relist.
	SubscribeTaskEvents(ctx context.Context, subscribed func(), fn func(TaskEvent)) error
	// PodOf returns the UID of the pod a container belongs to; an error wrapping ErrNotFound
	// when the runtime does not know the container (removed since its event).
	PodOf(ctx context.Context, containerID string) (string, error)
	// UpdateContainerResources applies res's CPU shares, CFS quota and memory limit to a
	// running container's cgroup in place, its process going on (the kubelet's name for the
	// CRI call; containerd's task Update). The OOM score is not changed: a resize does not
	// change the pod's QoS class. An error wrapping ErrNotFound when the container does not
	// run.
	UpdateContainerResources(ctx context.Context, id string, res Resources) error
	// ContainerResources reads back what a running container's cgroup holds now (CPU
	// shares, CFS quota and period, memory limit): what is applied, not what was asked. An
	// error wrapping ErrNotFound when the container does not run.
	ContainerResources(ctx context.Context, id string) (Resources, error)
}

// Network sets up and tears down pods' own networks (not the host network's pods);
// *network.Manager (CNI, with the containerd backend) is the one a gateway runs; the CRI
// backend's makes pod sandboxes; the hollow one records. Contracts as *network.Manager documents.
type Network interface {
	// Setup gives the pod its network before its containers are made: for a pod with its own
	// network, a namespace attached to the configured networks, its IPs returned; for a
	// host-network pod, whatever the backend needs (nothing with CNI, the pod sandbox with
	// CRI) and no IPs. Called at every sync of the pod: idempotent.
	Setup(ctx context.Context, pod *v1.Pod) (*network.PodNetwork, error)
	// Teardown releases what Setup made; a pod with nothing set up is not an error.
	Teardown(ctx context.Context, podUID, namespace, name string) error
	// Get returns the pod's network as Setup recorded it, nil when it has none.
	Get(podUID string) *network.PodNetwork
	// Known returns the UIDs of the pods with a network recorded, torn down or not yet.
	Known() []string
}

var _ Network = (*network.Manager)(nil)
