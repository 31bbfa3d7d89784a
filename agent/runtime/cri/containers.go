package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// containerStatus is a container's status as last read, with its process ID (from the
// runtime's verbose information) while it runs.
type containerStatus struct {
	st  *criapi.ContainerStatus
	pid uint32
}

// CreateContainer creates the attempt cfg describes in its pod's sandbox (made by Setup) and
// returns the runtime's ID for it; an attempt that exists already is returned as it is, so that
// a create retried after an agent crash makes nothing twice.
func (r *Runtime) CreateContainer(ctx context.Context, cfg runtime.ContainerConfig) (string, error) {
	existing, err := r.ListPod(ctx, cfg.PodUID)
	if err != nil {
		return "", fmt.Errorf("%w: %v", runtime.ErrCreateContainer, err)
	}
	for _, c := range existing {
		if c.Name == cfg.Name && c.Attempt == cfg.Attempt {
			return c.ID, nil
		}
	}
	r.mu.Lock()
	sb := r.sandboxes[cfg.PodUID]
	r.mu.Unlock()
	if sb == nil || !sb.ready || sb.config == nil {
		if cfg.Pod == nil {
			return "", fmt.Errorf("%w: %w", runtime.ErrCreateContainer, errNoSandbox)
		}
		// After an agent restart the sandbox is known but not its configuration: Setup
		// checks it and keeps the configuration the runtime needs with each create.
		if _, err := r.Network().Setup(ctx, cfg.Pod); err != nil {
			return "", fmt.Errorf("%w: pod sandbox: %v", runtime.ErrCreateContainer, err)
		}
		r.mu.Lock()
		sb = r.sandboxes[cfg.PodUID]
		r.mu.Unlock()
	}
	config, err := r.containerConfig(ctx, sb, cfg)
	if err != nil {
		return "", err
	}
	resp, err := r.rs.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: sb.id, Config: config, SandboxConfig: sb.config})
	if err != nil {
		return "", fmt.Errorf("%w: %v", runtime.ErrCreateContainer, err)
	}
	return resp.ContainerId, nil
}

// containerConfig is the kubelet's ContainerConfig for cfg (generateContainerConfig).
func (r *Runtime) containerConfig(ctx context.Context, sb *sandbox, cfg runtime.ContainerConfig) (*criapi.ContainerConfig, error) {
	logPath, err := filepath.Rel(sb.config.LogDirectory, cfg.LogPath)
	if err != nil || !filepath.IsLocal(logPath) {
		return nil, fmt.Errorf("%w: log path %s is not below the sandbox's log directory %s", runtime.ErrCreateContainer, cfg.LogPath, sb.config.LogDirectory)
	}
	labels := map[string]string{
		labelManaged:       "true",
		LabelPodName:       cfg.PodName,
		LabelPodNamespace:  cfg.PodNamespace,
		LabelPodUID:        cfg.PodUID,
		LabelContainerName: cfg.Name,
	}
	annotations := map[string]string{
		annotationSpecHash:     cfg.SpecHash,
		annotationImage:        cfg.Image,
		annotationRestartCount: strconv.Itoa(cfg.Attempt),

		annotationMemoryRequest: strconv.FormatInt(cfg.MemoryRequest, 10),
	}
	if cfg.Static {
		annotations[annotationStatic] = "true"
	}
	switch {
	case cfg.Stdin && cfg.StdinOnce:
		annotations[annotationStdin] = "once"
	case cfg.Stdin:
		annotations[annotationStdin] = "true"
	}
	if cfg.TerminationMessagePath != "" {
		annotations[annotationTermination] = cfg.TerminationMessagePath
	}
	mounts, err := criMounts(cfg.Mounts)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", runtime.ErrCreateContainer, err)
	}
	c := &criapi.ContainerConfig{
		Metadata:    &criapi.ContainerMetadata{Name: cfg.Name, Attempt: uint32(cfg.Attempt)},
		Image:       &criapi.ImageSpec{Image: runtime.NormalizeImageRef(cfg.Image), UserSpecifiedImage: cfg.Image},
		Command:     cfg.Command,
		Args:        cfg.Args,
		WorkingDir:  cfg.WorkingDir,
		Mounts:      mounts,
		Labels:      labels,
		Annotations: annotations,
		LogPath:     logPath,
		Stdin:       cfg.Stdin,
		StdinOnce:   cfg.StdinOnce,
		Tty:         cfg.TTY,
		Linux:       &criapi.LinuxContainerConfig{Resources: criResources(cfg.Resources)},
	}
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		c.Envs = append(c.Envs, &criapi.KeyValue{Key: k, Value: []byte(v)})
	}
	sc, err := r.containerSecurity(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.PIDNamespaceOf != "" {
		sc.NamespaceOptions.Pid, sc.NamespaceOptions.TargetId = criapi.NamespaceMode_TARGET, cfg.PIDNamespaceOf
	}
	c.Linux.SecurityContext = sc
	return c, nil
}

// criMounts turns the bind mounts the pod layer makes into the runtime's mounts.
func criMounts(ms []specs.Mount) ([]*criapi.Mount, error) {
	out := make([]*criapi.Mount, 0, len(ms))
	for _, m := range ms {
		if m.Type != "bind" {
			return nil, fmt.Errorf("a %s mount at %s cannot be given to a CRI runtime (bind mounts only)", m.Type, m.Destination)
		}
		cm := &criapi.Mount{ContainerPath: m.Destination, HostPath: m.Source, Propagation: criapi.MountPropagation_PROPAGATION_PRIVATE}
		for _, o := range m.Options {
			switch o {
			case "ro":
				cm.Readonly = true
			case "rshared", "shared":
				cm.Propagation = criapi.MountPropagation_PROPAGATION_BIDIRECTIONAL
			case "rslave", "slave":
				cm.Propagation = criapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER
			}
		}
		out = append(out, cm)
	}
	return out, nil
}

func criResources(res runtime.Resources) *criapi.LinuxContainerResources {
	adj := res.OOMScoreAdj
	if own, ok := runtime.AgentOOMScoreAdj(); ok {
		adj = runtime.ClampOOMScoreAdj(adj, own)
	}
	out := &criapi.LinuxContainerResources{
		CpuShares:          int64(res.CPUShares),
		CpuQuota:           res.CPUQuota,
		CpuPeriod:          res.CPUPeriod,
		MemoryLimitInBytes: res.MemoryLimit,
		OomScoreAdj:        int64(adj),
	}
	if res.NoSwap {
		out.Unified = map[string]string{"memory.swap.max": "0"}
	}
	return out
}

// StartContainer starts a created container.
func (r *Runtime) StartContainer(ctx context.Context, id string) error {
	if _, err := r.rs.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: id}); err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrStartContainer, err)
	}
	r.forget(id)
	return nil
}

// StopContainer stops a running container within grace (SIGTERM, then SIGKILL); the runtime
// records the exit. One that is not running, or gone, is left as it is.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	secs := int64((grace + time.Second - 1) / time.Second)
	_, err := r.rs.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: secs})
	r.forget(id)
	if err != nil && !notFoundMessage(err) {
		return fmt.Errorf("stop container %s: %w", id, err)
	}
	return nil
}

// RecordExit has nothing to record: the runtime keeps each exit (code, reason, time) itself.
func (r *Runtime) RecordExit(context.Context, string) (string, error) { return "", nil }

// RecordOOM has nothing to record: the runtime reports OOMKilled itself.
func (r *Runtime) RecordOOM(context.Context, string) error { return nil }

// RemoveContainer removes a container, stopping it first; one that does not exist is not an
// error.
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
	_, err := r.rs.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id})
	r.removed(id)
	if err != nil && !notFoundMessage(err) {
		return fmt.Errorf("remove container %s: %w", id, err)
	}
	return nil
}

func (r *Runtime) forget(id string) {
	r.mu.Lock()
	delete(r.statuses, id)
	r.mu.Unlock()
}

// removed forgets all about a removed container.
func (r *Runtime) removed(id string) {
	r.mu.Lock()
	delete(r.statuses, id)
	delete(r.stdinUsed, id)
	r.mu.Unlock()
}

// List returns every container holdfast made.
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	return r.list(ctx, map[string]string{labelManaged: "true"})
}

// ListPod returns the containers of one pod.
func (r *Runtime) ListPod(ctx context.Context, podUID string) ([]runtime.Container, error) {
	return r.list(ctx, map[string]string{labelManaged: "true", LabelPodUID: podUID})
}

// list lists the containers, then reads the status of those whose state changed since it was
// last read: a steady node costs one list call.
func (r *Runtime) list(ctx context.Context, selector map[string]string) ([]runtime.Container, error) {
	resp, err := r.rs.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{LabelSelector: selector}})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]runtime.Container, 0, len(resp.Containers))
	for _, c := range resp.Containers {
		cs, err := r.status(ctx, c.Id, c.State)
		if notFoundMessage(err) {
			continue // removed in between
		}
		if err != nil {
			return nil, err
		}
		out = append(out, toContainer(cs))
	}
	return out, nil
}

// status returns the container's status, read again only when its state is not the one it
// was read in.
func (r *Runtime) status(ctx context.Context, id string, state criapi.ContainerState) (*containerStatus, error) {
	r.mu.Lock()
	cached := r.statuses[id]
	r.mu.Unlock()
	if cached != nil && cached.st.State == state && state != criapi.ContainerState_CONTAINER_CREATED && state != criapi.ContainerState_CONTAINER_UNKNOWN {
		return cached, nil
	}
	running := state == criapi.ContainerState_CONTAINER_RUNNING
	resp, err := r.rs.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id, Verbose: running})
	if err != nil {
		return nil, fmt.Errorf("status of container %s: %w", id, err)
	}
	cs := &containerStatus{st: resp.Status}
	if resp.Status.State == criapi.ContainerState_CONTAINER_RUNNING {
		switch {
		case running:
			cs.pid = pidFromInfo(resp.Info)
		case cached != nil && cached.st.State == criapi.ContainerState_CONTAINER_RUNNING:
			cs.pid = cached.pid // the same run: its pid has not changed
		default:
			// Read as not known to run (PodOf, Attach), so without the verbose info: not kept,
			// or the container would be listed without its pid (stats, its network) for as
			// long as it runs. The next list reads it again, verbose.
			return cs, nil
		}
	}
	r.mu.Lock()
	r.statuses[id] = cs
	r.mu.Unlock()
	return cs, nil
}

func toContainer(cs *containerStatus) runtime.Container {
	st := cs.st
	attempt, _ := strconv.Atoi(st.Annotations[annotationRestartCount])
	c := runtime.Container{
		ID:           st.Id,
		PodUID:       st.Labels[LabelPodUID],
		PodName:      st.Labels[LabelPodName],
		PodNamespace: st.Labels[LabelPodNamespace],
		Name:         st.Labels[LabelContainerName],
		Attempt:      attempt,
		Image:        st.Annotations[annotationImage],
		ImageRef:     st.ImageRef,
		SpecHash:     st.Annotations[annotationSpecHash],
		Static:       st.Annotations[annotationStatic] == "true",
		LogPath:      st.LogPath,
		CreatedAt:    fromNanos(st.CreatedAt),
		StartedAt:    fromNanos(st.StartedAt),
		FinishedAt:   fromNanos(st.FinishedAt),
		ExitCode:     st.ExitCode,
		Reason:       st.Reason,
		Message:      st.Message,
		Pid:          cs.pid,
		// The runtime keeps exits itself: there is never one left to record.
		Recorded: true,
	}
	if n, err := strconv.ParseInt(st.Annotations[annotationMemoryRequest], 10, 64); err == nil {
		c.MemoryRequest = &n
	}
	if c.Image == "" && st.Image != nil {
		c.Image = st.Image.Image
	}
	switch st.State {
	case criapi.ContainerState_CONTAINER_RUNNING:
		c.State = runtime.StateRunning
	case criapi.ContainerState_CONTAINER_EXITED:
		c.State = runtime.StateExited
		if c.Reason == "" {
			c.Reason = runtime.ReasonCompleted
			if c.ExitCode != 0 {
				c.Reason = runtime.ReasonError
			}
		}
	case criapi.ContainerState_CONTAINER_UNKNOWN:
		// As the containerd backend's task in an unknown state: its last known one, never a
		// lost container, which would start it a second time beside the one still running.
		c.State = runtime.StateCreated
		if !c.StartedAt.IsZero() {
			c.State = runtime.StateRunning
		}
	default:
		c.State = runtime.StateCreated
	}
	return c
}

func fromNanos(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// PodOf returns the UID of the pod a container belongs to; runtime.ErrNotFound for one the
// runtime does not know.
func (r *Runtime) PodOf(ctx context.Context, containerID string) (string, error) {
	cs, err := r.status(ctx, containerID, criapi.ContainerState_CONTAINER_UNKNOWN)
	if notFoundMessage(err) {
		return "", fmt.Errorf("%w: %w", runtime.ErrNotFound, err)
	}
	if err != nil {
		return "", err
	}
	return cs.st.Labels[LabelPodUID], nil
}

// SubscribeTaskEvents calls fn for each exit of a container holdfast made. It streams the
// runtime's container events where the runtime has them (GetContainerEvents: containerd 1.7,
// CRI-O), and otherwise lists the containers every EventPoll and reports those found exited
// since the last list: the pod worker then relists the pod, as after any event. An OOM kill
// is the exit's reason (OOMKilled), which the runtime reports itself.
func (r *Runtime) SubscribeTaskEvents(ctx context.Context, subscribed func(), fn func(runtime.TaskEvent)) error {
	// The stream is in place once opened; a runtime without it says so only at the first
	// receive, and polling takes over (whose own start then calls subscribed no more).
	subscribed = sync.OnceFunc(subscribed)
	stream, err := r.rs.GetContainerEvents(ctx, &criapi.GetEventsRequest{})
	if err == nil {
		subscribed()
		var ev *criapi.ContainerEventResponse
		if ev, err = stream.Recv(); err == nil {
			for err == nil {
				if ev.ContainerEventType == criapi.ContainerEventType_CONTAINER_STOPPED_EVENT && managed(ev.GetPodSandboxStatus().GetLabels()) {
					fn(runtime.TaskEvent{ContainerID: ev.ContainerId})
				}
				ev, err = stream.Recv()
			}
			return fmt.Errorf("CRI container events: %w", err)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !isUnimplemented(err) {
		return fmt.Errorf("CRI container events: %w", err)
	}
	return r.pollExits(ctx, subscribed, fn)
}

func managed(labels map[string]string) bool { return labels[labelManaged] == "true" }

// pollExits lists the containers every EventPoll and reports each found exited that was not
// at the list before: it was running, or made and gone through its whole life in between (a
// command that exits at once). Those exited at the first list are the relist's to learn.
func (r *Runtime) pollExits(ctx context.Context, subscribed func(), fn func(runtime.TaskEvent)) error {
	var exited map[string]bool
	list := func() error {
		resp, err := r.rs.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{LabelSelector: map[string]string{labelManaged: "true"}}})
		if err != nil {
			return fmt.Errorf("list containers for exits: %w", err)
		}
		now := make(map[string]bool, len(resp.Containers))
		for _, c := range resp.Containers {
			if c.State != criapi.ContainerState_CONTAINER_EXITED {
				continue
			}
			now[c.Id] = true
			if exited != nil && !exited[c.Id] {
				fn(runtime.TaskEvent{ContainerID: c.Id})
			}
		}
		exited = now
		return nil
	}
	if err := list(); err != nil {
		return err
	}
	subscribed()
	tick := time.NewTicker(r.cfg.EventPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := list(); err != nil {
				return err
			}
		}
	}
}

// pidFromInfo reads the process ID from a verbose status's "info" (containerd and CRI-O
// both put {"pid": N, ...} there).
func pidFromInfo(info map[string]string) uint32 {
	var v struct {
		Pid uint32 `json:"pid"`
	}
	if json.Unmarshal([]byte(info["info"]), &v) == nil {
		return v.Pid
	}
	return 0
}

// netnsFromInfo reads the network namespace path from a verbose sandbox status's runtime
// spec; empty when the sandbox uses the host's.
func netnsFromInfo(info map[string]string) string {
	var v struct {
		Pid         uint32     `json:"pid"`
		RuntimeSpec specs.Spec `json:"runtimeSpec"`
	}
	if json.Unmarshal([]byte(info["info"]), &v) != nil || v.RuntimeSpec.Linux == nil {
		return ""
	}
	i := slices.IndexFunc(v.RuntimeSpec.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.NetworkNamespace })
	if i < 0 {
		return ""
	}
	if p := v.RuntimeSpec.Linux.Namespaces[i].Path; p != "" {
		return p
	}
	if v.Pid != 0 {
		return fmt.Sprintf("/proc/%d/ns/net", v.Pid)
	}
	return ""
}

// containerSecurity is the kubelet's LinuxContainerSecurityContext for the container, from the
// confinement the pod layer resolved (runtime.Security), with runAsNonRoot checked against the
// image's user as the kubelet checks it.
func (r *Runtime) containerSecurity(ctx context.Context, cfg runtime.ContainerConfig) (*criapi.LinuxContainerSecurityContext, error) {
	sec := cfg.Security
	out := &criapi.LinuxContainerSecurityContext{NamespaceOptions: containerNamespaces(sec)}
	// The image's user unless the pod names one, as the kubelet sends it: the runtime needs a
	// user with runAsGroup.
	uid, gid := sec.RunAsUser, sec.RunAsGroup
	var username string
	if uid == nil {
		var err error
		if uid, username, err = r.imageUser(ctx, cfg.Image); err != nil {
			return nil, err
		}
	}
	if uid != nil {
		out.RunAsUser = &criapi.Int64Value{Value: *uid}
	} else {
		out.RunAsUsername = username
	}
	if gid != nil {
		out.RunAsGroup = &criapi.Int64Value{Value: *gid}
	}
	if sec.RunAsNonRoot {
		if err := verifyNonRoot(cfg, uid, username); err != nil {
			return nil, err
		}
	}
	out.SupplementalGroups = slices.Clone(sec.SupplementalGroups)
	out.Privileged = sec.Privileged
	if caps := sec.Capabilities; caps != nil {
		out.Capabilities = &criapi.Capability{
			AddCapabilities:  slices.Clone(caps.Add),
			DropCapabilities: slices.Clone(caps.Drop),
		}
	}
	out.ReadonlyRootfs = sec.ReadOnlyRootFilesystem
	out.NoNewPrivs = sec.NoNewPrivileges
	if !sec.UnmaskedProcMount {
		out.MaskedPaths, out.ReadonlyPaths = slices.Clone(defaultMaskedPaths), slices.Clone(defaultReadonlyPaths)
	}
	if profile := sec.Seccomp; profile != nil {
		out.Seccomp = &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Unconfined}
		switch profile.Type {
		case runtime.ProfileRuntimeDefault:
			out.Seccomp.ProfileType = criapi.SecurityProfile_RuntimeDefault
		case runtime.ProfileLocalhost:
			out.Seccomp.ProfileType = criapi.SecurityProfile_Localhost
			out.Seccomp.LocalhostRef = filepath.Join(r.cfg.SeccompProfileRoot, profile.Localhost)
		}
	}
	if aa := sec.AppArmor; aa != nil {
		out.Apparmor = &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Unconfined}
		switch aa.Type {
		case runtime.ProfileRuntimeDefault:
			out.Apparmor.ProfileType = criapi.SecurityProfile_RuntimeDefault
		case runtime.ProfileLocalhost:
			out.Apparmor.ProfileType = criapi.SecurityProfile_Localhost
			out.Apparmor.LocalhostRef = aa.Localhost
		}
	}
	return out, nil
}

// The kubelet's default masked and read-only paths (securitycontext.ConvertToRuntimeMaskedPaths).
var (
	defaultMaskedPaths = []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	defaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// imageUser is the user the image runs as, as the kubelet reads it (getImageUser): its UID,
// else its user name, else root.
func (r *Runtime) imageUser(ctx context.Context, image string) (uid *int64, username string, err error) {
	resp, err := r.is.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: runtime.NormalizeImageRef(image)}})
	if err != nil {
		return nil, "", fmt.Errorf("%w: image status of %s: %v", runtime.ErrCreateContainer, image, err)
	}
	img := resp.GetImage()
	switch {
	case img.GetUid() != nil:
		return &img.GetUid().Value, "", nil
	case img.GetUsername() != "":
		return nil, img.GetUsername(), nil
	}
	return new(int64), "", nil
}

// verifyNonRoot refuses a container that would run as root, with the kubelet's messages.
func verifyNonRoot(cfg runtime.ContainerConfig, uid *int64, username string) error {
	who := cfg.PodName + "_" + cfg.PodNamespace + "(" + cfg.PodUID + ")"
	switch {
	case uid != nil && *uid == 0:
		return &runtime.ConfigError{Message: fmt.Sprintf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", who, cfg.Name)}
	case uid == nil:
		return &runtime.ConfigError{Message: fmt.Sprintf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", username, who, cfg.Name)}
	}
	return nil
}

func first[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
