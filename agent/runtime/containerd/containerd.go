package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"syscall"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/internal/failpoint"
)

// Runtime is holdfast's view of containerd: one client, one namespace.
type Runtime struct {
	client    *client.Client
	namespace string
	log       *slog.Logger
	// registryConfigPath: see WithRegistryConfigPath.
	registryConfigPath string
	// ioDir: see WithIODir.
	ioDir string
	// execFIFODir: see WithExecFIFODir.
	execFIFODir string
	// requestTimeout: see WithRequestTimeout.
	requestTimeout time.Duration
	// pullProgressTimeout: see WithPullProgressTimeout.
	pullProgressTimeout time.Duration
	// node: see WithNodeSecurity.
	node NodeSecurity
}

// Connect dials containerd at address and checks that it answers. The namespace is the one
// holdfast owns: it never lists or touches containers outside it.
func Connect(ctx context.Context, address, namespace string, log *slog.Logger, opts ...Option) (*Runtime, error) {
	r := &Runtime{namespace: namespace, log: log, requestTimeout: runtime.DefaultRequestTimeout, pullProgressTimeout: DefaultPullProgressTimeout}
	for _, o := range opts {
		o(r)
	}
	c, err := client.New(address, client.WithDefaultNamespace(namespace), client.WithTimeout(10*time.Second),
		client.WithExtraDialOpts(callDeadlines(log, r.requestTimeout)))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	r.client = c
	if _, err := r.Version(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return r, nil
}

// Close releases the connection. Containers keep running: they belong to containerd.
func (r *Runtime) Close() error { return r.client.Close() }

// Client exposes the containerd client for parts that need it directly (image preload).
func (r *Runtime) Client() *client.Client { return r.client }

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.namespace)
}

// Version returns the runtime version as kubelet reports it in nodeInfo: "containerd://1.6.20".
func (r *Runtime) Version(ctx context.Context) (string, error) {
	v, err := r.client.Version(ctx)
	if err != nil {
		return "", fmt.Errorf("containerd version: %w", err)
	}
	return "containerd://" + trimV(v.Version), nil
}

func trimV(s string) string {
	if len(s) > 0 && s[0] == 'v' {
		return s[1:]
	}
	return s
}

// EnsureImage makes the image available per the pull policy, pulling with creds (nil: none)
// through the registry host configuration. Errors wrap ErrImageNeverPull or ErrImagePull.
//
// Unlike kubelet, Always does not fail when the registry is out of reach and the image is
// present: the present image is used and ImageResult.Stale says so. A registry that answers
// (unknown tag, refused credentials) still fails the pull, as with kubelet.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, policy v1.PullPolicy, creds runtime.Credentials) (runtime.ImageResult, error) {
	ctx = r.ctx(ctx)
	name := runtime.NormalizeImageRef(ref)
	present, err := r.client.GetImage(ctx, name)
	switch {
	case err == nil && policy != v1.PullAlways:
		return runtime.ImageResult{Digest: present.Target().Digest.String()}, r.unpack(ctx, present)
	case err != nil && !errdefs.IsNotFound(err):
		return runtime.ImageResult{}, fmt.Errorf("%w: look up image %q: %v", runtime.ErrImagePull, ref, err)
	case err != nil && policy == v1.PullNever:
		return runtime.ImageResult{}, fmt.Errorf("%w: container image %q is not present with pull policy of Never", runtime.ErrImageNeverPull, ref)
	}
	img, pullErr := r.pull(ctx, name, creds)
	if pullErr == nil {
		return runtime.ImageResult{Digest: img.Target().Digest.String(), Pulled: present == nil || present.Target().Digest != img.Target().Digest}, nil
	}
	if present != nil && registryUnreachable(pullErr) {
		return runtime.ImageResult{Digest: present.Target().Digest.String(), Stale: pullErr}, r.unpack(ctx, present)
	}
	return runtime.ImageResult{}, fmt.Errorf("%w: %w", runtime.ErrImagePull, pullErr)
}

// pull pulls and unpacks name, cancelled if it waits pullProgressTimeout on the registry
// without a byte (pullProgress); the error then says so rather than "context canceled".
func (r *Runtime) pull(ctx context.Context, name string, creds runtime.Credentials) (client.Image, error) {
	if r.pullProgressTimeout <= 0 {
		return r.client.Pull(ctx, name, client.WithPullUnpack, client.WithResolver(r.resolver(ctx, creds, nil)))
	}
	pullCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	progress := newPullProgress(time.Now())
	stop := progress.watch(cancel, r.pullProgressTimeout)
	img, err := r.client.Pull(pullCtx, name, client.WithPullUnpack, client.WithResolver(r.resolver(pullCtx, creds, progress)))
	stop()
	if cause := context.Cause(pullCtx); err != nil && ctx.Err() == nil && errors.Is(cause, errPullStalled) {
		err = cause
	}
	return img, err
}

// registryUnreachable tells a registry out of reach (no route, refused, DNS, timeout, or no
// answer at all: a stalled pull) from one that answered: only the first lets a present image
// stand in for a pull.
func registryUnreachable(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, errPullStalled)
}

// unpack makes sure the image's layers are in the snapshotter; an imported image may not be.
func (r *Runtime) unpack(ctx context.Context, img client.Image) error {
	ok, err := img.IsUnpacked(ctx, "")
	if err != nil {
		return fmt.Errorf("%w: check unpack of %q: %v", runtime.ErrImagePull, img.Name(), err)
	}
	if ok {
		return nil
	}
	if err := img.Unpack(ctx, ""); err != nil {
		return fmt.Errorf("%w: unpack %q: %v", runtime.ErrImagePull, img.Name(), err)
	}
	return nil
}

// CreateContainer creates (but does not start) a container. Creating an attempt that already
// exists returns the existing one. The snapshot and the container record are made under one
// containerd lease, so a crash half-way leaves nothing for the garbage collector to miss.
func (r *Runtime) CreateContainer(ctx context.Context, cfg runtime.ContainerConfig) (string, error) {
	ctx = r.ctx(ctx)
	id := runtime.ContainerID(cfg.PodUID, cfg.Name, cfg.Attempt)
	if _, err := r.client.LoadContainer(ctx, id); err == nil {
		return id, nil
	} else if !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("%w: look up container %s: %v", runtime.ErrCreateContainer, id, err)
	}
	img, err := r.client.GetImage(ctx, runtime.NormalizeImageRef(cfg.Image))
	if err != nil {
		return "", fmt.Errorf("%w: image %q: %v", runtime.ErrCreateContainer, cfg.Image, err)
	}
	ctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: lease: %v", runtime.ErrCreateContainer, err)
	}
	defer func() {
		if err := done(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("release containerd lease", "container", id, "err", err)
		}
	}()

	opts := append([]oci.SpecOpts{withImageConfig(img), withKubernetesArgs(img, cfg.Command, cfg.Args)},
		ContainerSpecOpts(cfg, r.node)...)

	labels := map[string]string{
		LabelPodUID:        cfg.PodUID,
		LabelPodName:       cfg.PodName,
		LabelPodNamespace:  cfg.PodNamespace,
		LabelContainerName: cfg.Name,
		LabelAttempt:       strconv.Itoa(cfg.Attempt),
		LabelImage:         cfg.Image,
		LabelLogPath:       cfg.LogPath,
		LabelSpecHash:      cfg.SpecHash,
		LabelImageID:       imageID(img),
		LabelMemoryRequest: strconv.FormatInt(cfg.MemoryRequest, 10),
	}
	if cfg.Static {
		labels[LabelStatic] = "true"
	}
	switch {
	case cfg.Stdin && cfg.StdinOnce:
		labels[LabelStdin] = "once"
	case cfg.Stdin:
		labels[LabelStdin] = "true"
	}
	if cfg.TTY {
		labels[LabelTTY] = "true"
	}
	containerOpts := []client.NewContainerOpts{
		client.WithImage(img),
		client.WithNewSnapshot(id, img),
		client.WithNewSpec(opts...),
		client.WithContainerLabels(labels),
	}
	if _, systemd := cgroupsPath(cfg.CgroupParent, id); cfg.CgroupParent != "" && systemd {
		containerOpts = append(containerOpts, withSystemdCgroup())
	}
	// Last: the options run in order before the record is made, so this is the window
	// between the snapshot and the record.
	containerOpts = append(containerOpts, func(context.Context, *client.Client, *containers.Container) error {
		failpoint.Inject(failpoint.ContainerBeforeRecord)
		return nil
	})
	newContainer := func() error {
		_, err := r.client.NewContainer(ctx, id, containerOpts...)
		return err
	}
	err = newContainer()
	if errdefs.IsAlreadyExists(err) {
		if _, lerr := r.client.LoadContainer(ctx, id); lerr == nil {
			return id, nil // made by an earlier try
		}
		// The snapshot exists without its container: an earlier create was cut between the
		// two (the agent killed). The snapshot is that create's, unused: it goes, and the
		// container is made again (TestAgentKilledDuringPodStarts left such a pod waiting
		// forever on "container not found").
		r.log.Info("removing the snapshot of an interrupted container create", "container", id)
		if rerr := r.client.SnapshotService(defaults.DefaultSnapshotter).Remove(ctx, id); rerr != nil && !errdefs.IsNotFound(rerr) {
			return "", fmt.Errorf("%w: remove the snapshot of an interrupted create of %s: %v", runtime.ErrCreateContainer, id, rerr)
		}
		err = newContainer()
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", runtime.ErrCreateContainer, err)
	}
	return id, nil
}

// ContainerSpecOpts are the options that make cfg's OCI spec once the image's config and the
// Kubernetes arguments are applied: environment, mounts, namespaces, terminal, then the
// container's resources and confinement on node. The one translation of the pod layer's
// description into containerd's terms; exported for the pod layer's spec equivalence test
// (agent/pods TestOCISpecGolden).
func ContainerSpecOpts(cfg runtime.ContainerConfig, node NodeSecurity) []oci.SpecOpts {
	opts := []oci.SpecOpts{oci.WithEnv(cfg.Env)}
	if !slices.ContainsFunc(cfg.Mounts, func(m specs.Mount) bool { return m.Destination == cgroupRoot }) {
		opts = append(opts, withCgroupfs)
	}
	opts = append(opts, oci.WithMounts(cfg.Mounts))
	if cfg.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(cfg.WorkingDir))
	}
	if cfg.NetNSPath != "" {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: cfg.NetNSPath}),
			oci.WithHostname(cfg.Hostname))
	} else {
		// The host's network comes with the host's UTS namespace, hence its hostname, as with
		// kubelet: no hostname of its own. The host's files too, unless the pod brings its own
		// (its dnsPolicy's resolv.conf).
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostNamespace(specs.UTSNamespace))
		if !slices.ContainsFunc(cfg.Mounts, func(m specs.Mount) bool { return m.Destination == "/etc/hosts" }) {
			opts = append(opts, oci.WithHostHostsFile)
		}
		if !slices.ContainsFunc(cfg.Mounts, func(m specs.Mount) bool { return m.Destination == "/etc/resolv.conf" }) {
			opts = append(opts, oci.WithHostResolvconf)
		}
	}
	if cfg.TTY {
		opts = append(opts, oci.WithTTY) // and TERM=xterm, as containerd's CRI plugin does
	}
	opts = append(opts, resourceSpecOpts(cfg.Resources)...)
	if cfg.CgroupParent != "" {
		p, _ := cgroupsPath(cfg.CgroupParent, runtime.ContainerID(cfg.PodUID, cfg.Name, cfg.Attempt))
		opts = append(opts, oci.WithCgroup(p))
	}
	pod := cfg.PodName + "_" + cfg.PodNamespace + "(" + cfg.PodUID + ")"
	opts = append(opts, securitySpecOpts(cfg.Security, pod, cfg.Name, node)...)
	if cfg.PIDNamespaceOfPid != 0 {
		opts = append(opts, withPIDNamespaceOf(cfg.PIDNamespaceOfPid))
	}
	// Last: whether the container has a cgroup namespace of its own is known only now.
	return append(opts, withHostCgroup2Options(node.CgroupMountOptions))
}

// withCgroupfs mounts cgroupfs read-only at /sys/fs/cgroup, as containerd's CRI plugin does
// for every container (Docker's behaviour): runc shows the container its own cgroup there (a
// bind of it on cgroup v1, its cgroup namespace or a bind on v2). The upstream resize tests
// read a container's limits there, and so do programs that size themselves by them (a JVM,
// GOMAXPROCS). Before the pod's own mounts, so that one of its volumes at the path, or below
// it, comes after and wins; a privileged container's is made writable with the rest of its
// cgroupfs (securitySpecOpts).
func withCgroupfs(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	s.Mounts = append(s.Mounts, specs.Mount{
		Destination: cgroupRoot,
		Type:        "cgroup",
		Source:      "cgroup",
		Options:     []string{"nosuid", "noexec", "nodev", "relatime", "ro"},
	})
	return nil
}

// sharedCgroup2Options are the cgroup2 superblock options systemd sets that a mount of cgroup2
// in the host's cgroup namespace would clear host-wide if it left them out: the container's
// mount and the host's are one superblock, and a mount's options are the superblock's.
var sharedCgroup2Options = []string{"nsdelegate", "memory_recursiveprot"}

// withHostCgroup2Options adds to the container's cgroupfs mount the shared options the host's
// has (hostOptions), when the container shares the host's cgroup namespace (a privileged one,
// or any where cgroup namespaces are off), as containerd's CRI plugin does. Without them, the
// first privileged pod on a cgroup v2 gateway (a CNI or device plugin daemon) cleared
// nsdelegate and memory_recursiveprot for the whole host: systemd's MemoryLow and MemoryMin
// stopped protecting recursively until a remount.
func withHostCgroup2Options(hostOptions []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux != nil && slices.ContainsFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.CgroupNamespace }) {
			return nil
		}
		for i := range s.Mounts {
			m := &s.Mounts[i]
			if m.Destination != cgroupRoot || m.Type != "cgroup" {
				continue
			}
			for _, o := range sharedCgroup2Options {
				if slices.Contains(hostOptions, o) && !slices.Contains(m.Options, o) {
					m.Options = append(m.Options, o)
				}
			}
		}
		return nil
	}
}

// withKubernetesArgs sets the process arguments the way Kubernetes combines a container's
// command and args with the image's Entrypoint and Cmd.
func withKubernetesArgs(img client.Image, command, args []string) oci.SpecOpts {
	return func(ctx context.Context, c oci.Client, ctr *containers.Container, s *oci.Spec) error {
		if len(command) == 0 && len(args) == 0 {
			return nil // the image's Entrypoint+Cmd, already set by WithImageConfig
		}
		argv, err := KubernetesArgv(ctx, img, command, args)
		if err != nil {
			return err
		}
		if len(argv) == 0 {
			return errors.New("no command specified: the pod sets none and the image has no entrypoint")
		}
		s.Process.Args = argv
		return nil
	}
}

// KubernetesArgv applies the API's rule: command replaces Entrypoint, args replaces Cmd, and
// setting command alone drops the image's Cmd.
func KubernetesArgv(ctx context.Context, img client.Image, command, args []string) ([]string, error) {
	cfg, err := img.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("read image config of %q: %w", img.Name(), err)
	}
	entrypoint, cmd := cfg.Config.Entrypoint, cfg.Config.Cmd
	if len(command) > 0 {
		entrypoint, cmd = command, nil
	}
	if len(args) > 0 {
		cmd = args
	}
	return append(append([]string{}, entrypoint...), cmd...), nil
}

// StartContainer starts the container's process, its stdout and stderr going to its log file.
// The shim writes the log itself, so logs survive an agent restart.
func (r *Runtime) StartContainer(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: load container %s: %v", runtime.ErrStartContainer, id, err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return fmt.Errorf("%w: labels of %s: %v", runtime.ErrStartContainer, id, err)
	}
	logPath := labels[LabelLogPath]
	stdio, err := r.stdio(id, labels)
	if err != nil {
		return fmt.Errorf("%w: %v", runtime.ErrStartContainer, err)
	}
	ioc := cio.NullIO
	if logPath != "" {
		// The shim runs holdfast's logger, which writes the CRI log format and rotates.
		if ioc, err = TaskIO(logPath, stdio); err != nil {
			return fmt.Errorf("%w: container log: %v", runtime.ErrStartContainer, err)
		}
	}
	task, err := c.NewTask(ctx, ioc, withRecordedRuncOptions(c))
	if errdefs.IsAlreadyExists(err) {
		return r.resumeStart(ctx, c, labels)
	} else if err != nil {
		return fmt.Errorf("%w: create task: %v", runtime.ErrStartContainer, err)
	}
	failpoint.Inject(failpoint.TaskBeforeStart)
	if err := r.startTask(ctx, c, task); err != nil {
		return err
	}
	if _, err := c.SetLabels(ctx, map[string]string{LabelStartedAt: formatTime(time.Now())}); err != nil {
		return fmt.Errorf("record start of %s: %w", id, err)
	}
	return nil
}

// resumeStart finishes the start of a container whose task an earlier try made: a start cut
// (the agent killed) after the task's creation left it created and never started, or started
// with its start not recorded. Taking the task's existence for a start left such a container
// in ContainerCreating for good (TestFailpointsCrossedByKill, killed at another point while
// a worker was at this one).
func (r *Runtime) resumeStart(ctx context.Context, c client.Container, labels map[string]string) error {
	id := c.ID()
	task, err := c.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: load the task of an earlier start of %s: %v", runtime.ErrStartContainer, id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return fmt.Errorf("%w: task status %s: %v", runtime.ErrStartContainer, id, err)
	}
	if st.Status == client.Created {
		r.log.Info("starting the task an interrupted start created", "container", id)
		if err := r.startTask(ctx, c, task); err != nil {
			return err
		}
	}
	if labels[LabelStartedAt] == "" {
		if _, err := c.SetLabels(ctx, map[string]string{LabelStartedAt: formatTime(time.Now())}); err != nil {
			return fmt.Errorf("record start of %s: %w", id, err)
		}
	}
	return nil
}

// startTask starts a created task; one that fails to start is deleted and its failure
// recorded as the container's exit.
func (r *Runtime) startTask(ctx context.Context, c client.Container, task client.Task) error {
	if err := task.Start(ctx); err != nil {
		if _, derr := task.Delete(ctx, client.WithProcessKill); derr != nil {
			r.log.Warn("delete task that failed to start", "container", c.ID(), "err", derr)
		}
		r.recordFailure(ctx, c, err)
		return fmt.Errorf("%w: %v", runtime.ErrStartContainer, err)
	}
	return nil
}

// recordFailure marks a container whose process could not start as exited with code 128, as
// runc-based runtimes report it, so that restart policy and back-off apply to it.
func (r *Runtime) recordFailure(ctx context.Context, c client.Container, cause error) {
	now := formatTime(time.Now())
	_, err := c.SetLabels(ctx, map[string]string{
		LabelStartedAt:  now,
		LabelFinishedAt: now,
		LabelExitCode:   "128",
		LabelReason:     "StartError",
		LabelMessage:    truncate(cause.Error(), 1024),
	})
	if err != nil {
		r.log.Warn("record start failure", "container", c.ID(), "err", err)
	}
}

// StopContainer sends SIGTERM (or the image's StopSignal), waits up to grace, then SIGKILL,
// and records the exit. A container that is not running is left as it is.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	// Cancelled on return: the wait for the exit (Tasks.Wait, unbounded by callDeadlines) must
	// not outlive a stop that gave up, on a containerd that does not answer.
	ctx, cancel := context.WithCancel(r.ctx(ctx))
	defer cancel()
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("load task %s: %w", id, err)
	}
	status, err := task.Status(ctx)
	if err != nil {
		return fmt.Errorf("task status %s: %w", id, err)
	}
	if status.Status != client.Stopped {
		exitCh, err := task.Wait(ctx)
		if err != nil {
			return fmt.Errorf("wait task %s: %w", id, err)
		}
		sig := syscall.SIGTERM
		if s, err := client.GetStopSignal(ctx, c, syscall.SIGTERM); err == nil {
			sig = s
		}
		if grace > 0 {
			if err := task.Kill(ctx, sig); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("signal %s to %s: %w", sig, id, err)
			}
			select {
			case <-exitCh:
			case <-time.After(grace):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-exitCh:
		default:
			if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("kill %s: %w", id, err)
			}
			select {
			case <-exitCh:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	_, err = r.RecordExit(ctx, id)
	return err
}

// RecordExit writes a stopped task's exit into the container's labels and deletes the task.
// It is idempotent and safe to call for a running task (it does nothing then). It returns the
// reason it recorded, empty when it recorded nothing: an OOM kill is known only here when the
// shim sent no OOM event (see oomKilledInCgroup).
func (r *Runtime) RecordExit(ctx context.Context, id string) (string, error) {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return "", r.recordLost(ctx, c)
	} else if err != nil {
		return "", fmt.Errorf("load task %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return "", fmt.Errorf("task status %s: %w", id, err)
	}
	if st.Status != client.Stopped {
		return "", nil
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return "", fmt.Errorf("labels of %s: %w", id, err)
	}
	var recorded string
	if labels[LabelFinishedAt] == "" {
		reason := runtime.ReasonCompleted
		if st.ExitStatus != 0 {
			reason = runtime.ReasonError
		}
		// Before the task is deleted, which removes its cgroup.
		if labels[LabelReason] == runtime.ReasonOOMKilled || (st.ExitStatus != 0 && oomKilledInCgroup(ctx, c)) {
			reason = runtime.ReasonOOMKilled
		}
		finished := st.ExitTime
		if finished.IsZero() {
			finished = time.Now()
		}
		if _, err := c.SetLabels(ctx, map[string]string{
			LabelFinishedAt: formatTime(finished),
			LabelExitCode:   strconv.Itoa(int(st.ExitStatus)),
			LabelReason:     reason,
		}); err != nil {
			return "", fmt.Errorf("record exit of %s: %w", id, err)
		}
		recorded = reason
	}
	if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return recorded, fmt.Errorf("delete task %s: %w", id, err)
	}
	return recorded, nil
}

// recordLost records the exit of a container that was started but whose task is gone with
// no exit record, so that it is reported and restarted like any exit.
func (r *Runtime) recordLost(ctx context.Context, c client.Container) error {
	labels, err := c.Labels(ctx)
	if err != nil {
		return fmt.Errorf("labels of %s: %w", c.ID(), err)
	}
	if labels[LabelStartedAt] == "" || labels[LabelFinishedAt] != "" {
		return nil
	}
	lost := fromRecord(containers.Container{ID: c.ID(), Labels: labels}, nil)
	_, err = c.SetLabels(ctx, map[string]string{
		LabelFinishedAt: formatTime(lost.FinishedAt),
		LabelExitCode:   strconv.Itoa(int(lost.ExitCode)),
		LabelReason:     lost.Reason,
		LabelMessage:    lost.Message,
	})
	return err
}

// RecordOOM marks the container as killed by the OOM killer; RecordExit keeps the reason.
func (r *Runtime) RecordOOM(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	_, err = c.SetLabels(ctx, map[string]string{LabelReason: runtime.ReasonOOMKilled})
	return err
}

// RemoveContainer kills the container's task if any and deletes the container and its
// snapshot. Removing a container that does not exist is not an error.
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	if task, err := c.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task of %s: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("load task of %s: %w", id, err)
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", id, err)
	}
	r.removeStdin(id)
	return nil
}

// List returns every container holdfast created, with its state. It makes two calls to
// containerd whatever the number of containers: one for the records, one for the tasks
// (which containerd 1.6 answers by asking every shim).
func (r *Runtime) List(ctx context.Context) ([]runtime.Container, error) {
	ctx = r.ctx(ctx)
	recs, err := r.client.ContainerService().List(ctx, `labels."`+LabelPodUID+`"`)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	resp, err := r.client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	tasks := make(map[string]*tasktypes.Process, len(resp.Tasks))
	for _, t := range resp.Tasks {
		tasks[t.ID] = t
	}
	out := make([]runtime.Container, 0, len(recs))
	for _, rec := range recs {
		out = append(out, fromRecord(rec, tasks[rec.ID]))
	}
	return out, nil
}

// ListPod returns the containers of one pod. It asks for the tasks of these containers only,
// one call each: containerd 1.6 answers a task list by asking every shim on the node for its
// state, and pods are synced often, so listing every task here would cost each sync of each
// pod a call to every shim.
func (r *Runtime) ListPod(ctx context.Context, podUID string) ([]runtime.Container, error) {
	ctx = r.ctx(ctx)
	recs, err := r.client.ContainerService().List(ctx, `labels."`+LabelPodUID+`"==`+strconv.Quote(podUID))
	if err != nil {
		return nil, fmt.Errorf("list containers of pod %s: %w", podUID, err)
	}
	out := make([]runtime.Container, 0, len(recs))
	for _, rec := range recs {
		var task *tasktypes.Process
		resp, err := r.client.TaskService().Get(ctx, &tasksapi.GetRequest{ContainerID: rec.ID})
		switch err = errgrpc.ToNative(err); {
		case err == nil:
			task = resp.Process
		case !errdefs.IsNotFound(err): // not found: the container has no task
			return nil, fmt.Errorf("get task of container %s: %w", rec.ID, err)
		}
		out = append(out, fromRecord(rec, task))
	}
	return out, nil
}

func fromRecord(rec containers.Container, task *tasktypes.Process) runtime.Container {
	l := rec.Labels
	c := runtime.Container{
		ID:           rec.ID,
		PodUID:       l[LabelPodUID],
		PodName:      l[LabelPodName],
		PodNamespace: l[LabelPodNamespace],
		Name:         l[LabelContainerName],
		Attempt:      parseInt(l[LabelAttempt]),
		Image:        l[LabelImage],
		SpecHash:     l[LabelSpecHash],
		LogPath:      l[LabelLogPath],
		CreatedAt:    rec.CreatedAt,
		StartedAt:    parseTime(l[LabelStartedAt]),
		FinishedAt:   parseTime(l[LabelFinishedAt]),
		Reason:       l[LabelReason],
		Message:      l[LabelMessage],
		ExitCode:     int32(parseInt(l[LabelExitCode])),
		ImageRef:     l[LabelImageID],
		Static:       l[LabelStatic] == "true",

		MemoryRequest: parseBytes(l[LabelMemoryRequest]),
	}
	switch {
	case !c.FinishedAt.IsZero():
		c.State = runtime.StateExited
		c.Recorded = task == nil
	case task != nil && task.Status == tasktypes.Status_STOPPED:
		// Exited, not yet recorded: report it now; RecordExit persists it.
		c.State = runtime.StateExited
		c.ExitCode = int32(task.ExitStatus)
		if task.ExitedAt != nil {
			c.FinishedAt = task.ExitedAt.AsTime()
		}
		if c.Reason != runtime.ReasonOOMKilled {
			c.Reason = runtime.ReasonCompleted
			if c.ExitCode != 0 {
				c.Reason = runtime.ReasonError
			}
		}
	case task != nil && (task.Status == tasktypes.Status_RUNNING || task.Status == tasktypes.Status_PAUSED || task.Status == tasktypes.Status_PAUSING):
		c.State = runtime.StateRunning
		c.Pid = task.Pid
	case task != nil && task.Status == tasktypes.Status_CREATED:
		c.State = runtime.StateCreated
	case task != nil:
		// The task exists but containerd could not tell its state: it gives up asking the
		// shim after 2 seconds (io.containerd.timeout.task.state) and answers UNKNOWN, with no
		// pid, which a loaded or emulated machine's shims often exceed. Taken for its last
		// known state, not for a lost task: that would start the container a second time
		// beside the one still running. An exit is seen at a later relist or by its event.
		c.State = runtime.StateCreated
		if !c.StartedAt.IsZero() {
			c.State = runtime.StateRunning
		}
	case !c.StartedAt.IsZero():
		// Started once, no task and no exit record: the runtime or the host restarted.
		c.State = runtime.StateExited
		c.ExitCode = 255
		c.Reason = runtime.ReasonTaskLost
		c.Message = "the container's process is gone without an exit record (containerd or the host restarted)"
		c.FinishedAt = c.StartedAt
	default:
		c.State = runtime.StateCreated
	}
	return c
}

// imageID is the digest form kubelet reports as a container's imageID: name@sha256:...
func imageID(img client.Image) string {
	name := img.Name()
	if named, err := reference.ParseNormalizedNamed(name); err == nil {
		name = named.Name()
	}
	return name + "@" + img.Target().Digest.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
