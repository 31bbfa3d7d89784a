package hollow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// Version is what a hollow node reports as its container runtime (nodeInfo).
const Version = "hollow://0.1.0"

// ErrNoProcess: a hollow container has no process to exec in, attach to or read logs of.
var ErrNoProcess = errors.New("hollow runtime: containers have no process to attach to or exec in interactively")

// eventBuffer is how many task events wait for the subscriber; beyond it they are dropped,
// as a containerd event stream drops what a slow subscriber does not read: the relist is the
// safety net.
const eventBuffer = 256

// Runtime keeps containers as records; it implements runtime.Runtime and what the agent's other
// parts ask of a runtime (exec for probes, the node API's streams, its version).
type Runtime struct {
	now    func() time.Time
	events chan runtime.TaskEvent

	mu         sync.Mutex // protects containers, images, nextPid, termWait, failing
	containers map[string]*container
	images     map[string]time.Time // normalized reference -> when it was "pulled"
	nextPid    uint32

	// termWait is how long a process that ignores SIGTERM holds a stop with a grace period;
	// nil: the grace period itself (SetTermWait).
	termWait func(grace time.Duration) time.Duration
	// failing, when set, is what every call returns (FailCalls).
	failing error
}

// container is one container's record and, when it exits by itself, how.
type container struct {
	runtime.Container
	exitCode *int32 // set for a command that exits at once with this status
	// ignoresTerm: a shell command that traps SIGTERM to nothing (trap '' TERM): a stop with
	// a grace period waits it out, then kills, as on a real node.
	ignoresTerm bool
	// resources are what its cgroup would hold: those it was created with, then each update's.
	resources runtime.Resources
}

// NewRuntime returns an empty hollow runtime.
func NewRuntime() *Runtime {
	return &Runtime{
		now:        time.Now,
		events:     make(chan runtime.TaskEvent, eventBuffer),
		containers: map[string]*container{},
		images:     map[string]time.Time{},
		nextPid:    1000,
	}
}

// SetTermWait sets how long a process that ignores SIGTERM runs on when it is stopped with a
// grace period, as a function of that grace period (by default the grace period itself): a
// test shortens the wait and keeps its order (the stop still waits, then kills).
func (r *Runtime) SetTermWait(wait func(grace time.Duration) time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.termWait = wait
}

// FailCalls makes every later call that reads or changes containers or images return err
// (nil: they work again), as calls to a runtime out of reach do: a test stands for an agent
// killed at this instant (what it was doing takes no effect) or a containerd gone.
func (r *Runtime) FailCalls(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = err
}

// Version returns Version.
func (r *Runtime) Version(context.Context) (string, error) { return Version, nil }

// EnsureImage "pulls" an image at its first use, instantly; with pull policy Never an image
// not used before is absent, as on a real node.
func (r *Runtime) EnsureImage(_ context.Context, ref string, policy v1.PullPolicy, _ runtime.Credentials) (runtime.ImageResult, error) {
	name := runtime.NormalizeImageRef(ref)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return runtime.ImageResult{}, r.failing
	}
	_, present := r.images[name]
	if !present && policy == v1.PullNever {
		return runtime.ImageResult{}, fmt.Errorf("%w: container image %q is not present with pull policy of Never", runtime.ErrImageNeverPull, ref)
	}
	if !present || policy == v1.PullAlways {
		r.images[name] = r.now()
	}
	return runtime.ImageResult{Digest: imageDigest(name), Pulled: !present}, nil
}

// imageDigest is a made-up digest, the same for the same reference on every node.
func imageDigest(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// CreateContainer records a created container; an attempt that exists is returned as it is.
func (r *Runtime) CreateContainer(_ context.Context, cfg runtime.ContainerConfig) (string, error) {
	id := runtime.ContainerID(cfg.PodUID, cfg.Name, cfg.Attempt)
	name := runtime.NormalizeImageRef(cfg.Image)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return "", r.failing
	}
	if _, ok := r.containers[id]; ok {
		return id, nil
	}
	if _, ok := r.images[name]; !ok {
		return "", fmt.Errorf("%w: image %q: not present", runtime.ErrCreateContainer, cfg.Image)
	}
	c := &container{Container: runtime.Container{
		ID: id, PodUID: cfg.PodUID, PodName: cfg.PodName, PodNamespace: cfg.PodNamespace,
		Name: cfg.Name, Attempt: cfg.Attempt, Image: cfg.Image, ImageRef: imageDigest(name),
		SpecHash: cfg.SpecHash, LogPath: cfg.LogPath, Static: cfg.Static, State: runtime.StateCreated, CreatedAt: r.now(),
		MemoryRequest: &cfg.MemoryRequest,
	}, resources: asHeld(cfg.Resources)}
	argv := append(slices.Clone(cfg.Command), cfg.Args...)
	if code, ok := exitStatusOf(argv); ok {
		c.exitCode = &code
	}
	c.ignoresTerm = slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(a, "trap '' TERM") })
	r.containers[id] = c
	return id, nil
}

// exitStatusOf tells the exit status of a command that exits at once without running it:
// true, false, or a shell's "exit N". Any other command runs until it is stopped.
func exitStatusOf(argv []string) (int32, bool) {
	if len(argv) == 0 {
		return 0, false
	}
	last := strings.Fields(argv[len(argv)-1])
	switch {
	case len(last) == 1 && (last[0] == "true" || strings.HasSuffix(last[0], "/true")):
		return 0, true
	case len(last) == 1 && (last[0] == "false" || strings.HasSuffix(last[0], "/false")):
		return 1, true
	case len(last) == 2 && last[0] == "exit":
		if n, err := strconv.ParseUint(last[1], 10, 8); err == nil {
			return int32(n), true
		}
	}
	return 0, false
}

// StartContainer "starts" the container's process: it runs, or exits at once for a command
// that does, with a task event as containerd sends.
func (r *Runtime) StartContainer(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return r.failing
	}
	c, ok := r.containers[id]
	if !ok {
		return fmt.Errorf("%w: container %s not found", runtime.ErrStartContainer, id)
	}
	if c.State != runtime.StateCreated {
		return nil // started already, as a task that exists already
	}
	r.nextPid++
	c.State, c.StartedAt, c.Pid = runtime.StateRunning, r.now(), r.nextPid
	if c.exitCode != nil {
		r.exitLocked(c, *c.exitCode)
	}
	return nil
}

// exitLocked ends a running container's process with code and tells the subscriber.
func (r *Runtime) exitLocked(c *container, code int32) {
	c.State, c.FinishedAt, c.ExitCode, c.Pid = runtime.StateExited, r.now(), code, 0
	if c.Reason != runtime.ReasonOOMKilled {
		c.Reason = runtime.ReasonCompleted
		if code != 0 {
			c.Reason = runtime.ReasonError
		}
	}
	select {
	case r.events <- runtime.TaskEvent{ContainerID: c.ID}:
	default: // dropped: the relist finds the exit
	}
}

// StopContainer ends a running container's process and records its exit: 143 (SIGTERM) with
// a grace period, 137 (SIGKILL) without, as a process that does not catch them reports.
//
// A process that ignores SIGTERM (ignoresTerm) runs on for the grace period (or what
// SetTermWait makes of it), then is killed (137), so that what a pod's grace period holds up
// is held up here too.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	r.mu.Lock()
	if r.failing != nil {
		r.mu.Unlock()
		return r.failing
	}
	c, ok := r.containers[id]
	if ok && c.State == runtime.StateRunning && c.ignoresTerm && grace > 0 {
		wait := grace
		if r.termWait != nil {
			wait = r.termWait(grace)
		}
		r.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		r.mu.Lock()
		if r.failing != nil {
			r.mu.Unlock()
			return r.failing
		}
		grace = 0 // the grace period is over: SIGKILL
	}
	defer r.mu.Unlock()
	if !ok || c.State == runtime.StateCreated {
		return nil
	}
	if c.State == runtime.StateRunning {
		code := int32(128 + 9)
		if grace > 0 {
			code = 128 + 15
		}
		r.exitLocked(c, code)
	}
	c.Recorded = true
	return nil
}

// RecordExit records an exit once and returns its reason.
func (r *Runtime) RecordExit(_ context.Context, id string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return "", r.failing
	}
	c, ok := r.containers[id]
	if !ok || c.State != runtime.StateExited || c.Recorded {
		return "", nil
	}
	c.Recorded = true
	return c.Reason, nil
}

// RecordOOM marks the container as killed by the OOM killer.
func (r *Runtime) RecordOOM(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return r.failing
	}
	c, ok := r.containers[id]
	if !ok {
		return fmt.Errorf("load container %s: not found", id)
	}
	c.Reason = runtime.ReasonOOMKilled
	return nil
}

// UpdateContainerResources implements runtime.Runtime: the running container's record takes
// res's CPU and memory settings (its OOM score stays).
func (r *Runtime) UpdateContainerResources(_ context.Context, id string, res runtime.Resources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.runningLocked(id)
	if err != nil {
		return err
	}
	res = asHeld(res)
	c.resources.CPUShares, c.resources.CPUQuota, c.resources.CPUPeriod, c.resources.MemoryLimit = res.CPUShares, res.CPUQuota, res.CPUPeriod, res.MemoryLimit
	return nil
}

// asHeld is res as a kernel's cgroup holds it: the memory limit rounded down to a page (cgroup
// v1 and v2 alike), so that the agent's logic meets here what it reads back on a gateway.
func asHeld(res runtime.Resources) runtime.Resources {
	if page := int64(os.Getpagesize()); res.MemoryLimit > 0 {
		res.MemoryLimit = res.MemoryLimit / page * page
	}
	return res
}

// ContainerResources implements runtime.Runtime: what the record says its cgroup holds.
func (r *Runtime) ContainerResources(_ context.Context, id string) (runtime.Resources, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.runningLocked(id)
	if err != nil {
		return runtime.Resources{}, err
	}
	return c.resources, nil
}

// runningLocked is the running container id; an error wrapping runtime.ErrNotFound when it
// does not run.
func (r *Runtime) runningLocked(id string) (*container, error) {
	if r.failing != nil {
		return nil, r.failing
	}
	c, ok := r.containers[id]
	if !ok || c.State != runtime.StateRunning {
		return nil, fmt.Errorf("container %s does not run: %w", id, runtime.ErrNotFound)
	}
	return c, nil
}

// RemoveContainer forgets a container.
func (r *Runtime) RemoveContainer(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return r.failing
	}
	delete(r.containers, id)
	return nil
}

// List returns every container.
func (r *Runtime) List(context.Context) ([]runtime.Container, error) {
	return r.list(func(*container) bool { return true })
}

// ListPod returns the containers of one pod.
func (r *Runtime) ListPod(_ context.Context, podUID string) ([]runtime.Container, error) {
	return r.list(func(c *container) bool { return c.PodUID == podUID })
}

func (r *Runtime) list(keep func(*container) bool) ([]runtime.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return nil, r.failing
	}
	var out []runtime.Container
	for _, c := range r.containers {
		if keep(c) {
			out = append(out, c.Container)
		}
	}
	return out, nil
}

// SubscribeTaskEvents delivers exits to fn until ctx ends. One subscriber at a time, as the
// pods manager is.
func (r *Runtime) SubscribeTaskEvents(ctx context.Context, subscribed func(), fn func(runtime.TaskEvent)) error {
	subscribed()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-r.events:
			fn(ev)
		}
	}
}

// PodOf returns the UID of the pod a container belongs to.
func (r *Runtime) PodOf(_ context.Context, containerID string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return "", r.failing
	}
	c, ok := r.containers[containerID]
	if !ok {
		return "", fmt.Errorf("get container %s: %w", containerID, runtime.ErrNotFound)
	}
	return c.PodUID, nil
}

// Exec answers an exec probe or hook: exit status 0 with no output in a running container,
// as kubemark's fake runtime answers.
func (r *Runtime) Exec(_ context.Context, id string, cmd []string, _ runtime.ExecOptions) (runtime.ExecResult, error) {
	if len(cmd) == 0 {
		return runtime.ExecResult{}, fmt.Errorf("%w: no command", runtime.ErrExecStart)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing != nil {
		return runtime.ExecResult{}, r.failing
	}
	if c, ok := r.containers[id]; !ok || c.State != runtime.StateRunning {
		return runtime.ExecResult{}, fmt.Errorf("exec in %s: %w", id, runtime.ErrContainerNotRunning)
	}
	return runtime.ExecResult{}, nil
}

// ExecStream refuses: there is no process to connect streams to.
func (r *Runtime) ExecStream(context.Context, string, []string, runtime.ExecStreams) (int, error) {
	return 0, ErrNoProcess
}

// Attach refuses: there is no process to connect streams to.
func (r *Runtime) Attach(context.Context, string, runtime.ExecStreams) error {
	return ErrNoProcess
}
