package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/holdfast-dev/holdfast/agent/cgroups"
)

// ContainerdOptions configures StartContainerd.
type ContainerdOptions struct {
	// EnableCRI turns on containerd's CRI plugin, with restrict_oom_score_adj (this sandbox
	// lacks CAP_SYS_RESOURCE, and the pause container's -998 would fail), PauseImage as the
	// sandbox image and a streaming server on a free port. Import the test images before
	// running pod sandboxes. Defaults to false: holdfast drives containerd through its client.
	EnableCRI bool
	// CNI is the network the CRI plugin gives pod sandboxes (with EnableCRI). Defaults to an
	// empty configuration directory, so sandboxes get no network and never read the host's
	// /etc/cni/net.d.
	CNI *CNINetwork
}

// Containerd is a containerd daemon private to one test: its own root, state directory and
// socket, started with the Debian containerd binary.
//
// Containers in different daemons still share the host's cgroup tree, where runc places a
// container at /NAMESPACE/ID: give containers IDs unique to the test (or use a namespace no
// other test uses) when tests may run in parallel.
type Containerd struct {
	// Address is the daemon's gRPC socket.
	Address string
	// Client is connected to Address. It stays valid across Stop and Start: like any client of
	// a restarted daemon, it reconnects.
	Client *client.Client
	// Root and State are the daemon's --root and --state directories.
	Root, State string
	// CRI: started with its CRI plugin (ContainerdOptions.EnableCRI).
	CRI bool
	// RegistryConfigPath is the CRI plugin's registry configuration directory (its
	// config_path: HOST[:PORT]/hosts.toml, read at each pull), with EnableCRI. It starts
	// empty; UseRegistryConfig points it at a test's own.
	RegistryConfigPath string

	t         testing.TB
	dir       string // holds Root, State and Address; short, since socket paths are limited to 108 bytes
	ownerLock *os.File
	proc      *Process
	// cgroupRoots are the agents' cgroup roots (NewAgentConfig): their kubepods trees go once
	// the containers in them are gone, so that tests leave no cgroups on the host.
	cgroupRoots []string
}

// containerdConfig is containerd 1.6's configuration, version 2.
var containerdConfig = template.Must(template.New("config.toml").Parse(`version = 2
root = {{printf "%q" .Root}}
state = {{printf "%q" .State}}
disabled_plugins = [
{{- if not .EnableCRI}}"io.containerd.grpc.v1.cri", {{end -}}
"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = {{printf "%q" .Address}}

[ttrpc]
  address = {{printf "%q" (print .Address ".ttrpc")}}

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {{printf "%q" .OptDir}}
{{if .EnableCRI}}
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = {{printf "%q" .PauseImage}}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {{printf "%q" .CNIBinDir}}
    conf_dir = {{printf "%q" .CNIConfDir}}
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {{printf "%q" .RegistryConfigPath}}
{{end}}`))

// testRoot returns $HOLDFAST_TEST_ROOT, or /var/lib/holdfast-test: a real file system that
// supports overlayfs (not tmpfs or overlay) and gives short paths for sockets.
func testRoot() string {
	if d := os.Getenv("HOLDFAST_TEST_ROOT"); d != "" {
		return d
	}
	return "/var/lib/holdfast-test"
}

// StartContainerd starts a private containerd for t. When t ends, every task in every
// namespace is killed, every container deleted, the daemon stopped, anything still mounted
// under its directory unmounted and the directory removed.
func StartContainerd(t testing.TB, opts ContainerdOptions) *Containerd {
	t.Helper()
	RequireIntegration(t)
	start := time.Now()

	// Config and log go to the test's own directory. Created before the cleanup below is
	// registered, it is removed after it: the cleanup may need to start the daemon again, and
	// the log can still be printed if the test failed.
	filesDir := t.TempDir()

	if err := os.MkdirAll(testRoot(), 0o711); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	if err := sweepStaleOnce(); err != nil {
		t.Logf("clean up after earlier test runs: %v", err) // not this test's failure
	}
	dir, ownerLock, err := createOwnedDir()
	if err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	c := &Containerd{
		Address:   filepath.Join(dir, "containerd.sock"),
		Root:      filepath.Join(dir, "root"),
		State:     filepath.Join(dir, "state"),
		CRI:       opts.EnableCRI,
		t:         t,
		dir:       dir,
		ownerLock: ownerLock,
	}
	t.Cleanup(func() {
		if err := c.cleanup(); err != nil {
			t.Errorf("containerd cleanup: %v", err)
		}
		if err := c.removeCgroups(); err != nil {
			t.Logf("cgroups left on the host: %v", err)
		}
	})

	if opts.EnableCRI {
		c.RegistryConfigPath = filepath.Join(filesDir, "certs.d")
		if err := os.Mkdir(c.RegistryConfigPath, 0o755); err != nil {
			t.Fatalf("start containerd: %v", err)
		}
	}
	cniConfDir, cniBinDir := filepath.Join(filesDir, "no-cni"), CNIBinDir
	if opts.CNI != nil {
		cniConfDir, cniBinDir = opts.CNI.ConfDir, opts.CNI.BinDir
	} else if err := os.Mkdir(cniConfDir, 0o755); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	var config strings.Builder
	err = containerdConfig.Execute(&config, map[string]any{
		"Root":               c.Root,
		"State":              c.State,
		"Address":            c.Address,
		"OptDir":             filepath.Join(dir, "opt"),
		"EnableCRI":          opts.EnableCRI,
		"PauseImage":         PauseImage,
		"CNIBinDir":          cniBinDir,
		"CNIConfDir":         cniConfDir,
		"RegistryConfigPath": c.RegistryConfigPath,
	})
	if err != nil {
		t.Fatalf("start containerd: render config: %v", err)
	}
	configPath := filepath.Join(filesDir, "config.toml")
	if err := os.WriteFile(configPath, []byte(config.String()), 0o644); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	c.proc = NewProcess("containerd", filepath.Join(filesDir, "containerd.log"), "containerd", "--config", configPath)
	logTailOnFailure(t, c.proc)

	c.Client, err = client.New(c.Address, client.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatalf("start containerd: client: %v", err)
	}
	if err := c.startDaemon(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	t.Logf("containerd ready at %s in %v (config and log in %s)", c.Address, time.Since(start).Round(time.Millisecond), filesDir)
	return c
}

// UseRegistryConfig makes dir the CRI plugin's registry configuration, as an operator gives
// the runtime the same hosts.toml files as holdfast's registryConfigPath: with the CRI
// backend, pulls are the runtime's and follow its configuration only. The plugin reads the
// directory at each pull, so a running daemon follows, and later changes to dir too.
func (c *Containerd) UseRegistryConfig(dir string) {
	c.t.Helper()
	if !c.CRI {
		c.t.Fatal("UseRegistryConfig: containerd runs without its CRI plugin")
	}
	if err := os.Remove(c.RegistryConfigPath); err != nil {
		c.t.Fatalf("use registry configuration %s: %v", dir, err)
	}
	if err := os.Symlink(dir, c.RegistryConfigPath); err != nil {
		c.t.Fatalf("use registry configuration %s: %v", dir, err)
	}
}

// Stop does to the daemon what a reboot does: every task is killed and its state is gone, the
// containers remain as records (with their snapshots) in Root. Start brings the daemon back.
func (c *Containerd) Stop() {
	c.t.Helper()
	if err := c.reboot(); err != nil {
		c.t.Fatalf("stop containerd: %v", err)
	}
}

// StopDaemon stops only the daemon, as a crash or an upgrade of containerd does: the shims
// and the tasks they run keep running, and after Start a client re-attaches to them.
func (c *Containerd) StopDaemon() {
	c.t.Helper()
	if err := c.proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		c.t.Fatalf("stop containerd daemon: %v", err)
	}
}

// KillDaemon kills only the daemon with SIGKILL, as a crash or the OOM killer does: the shims
// and their tasks keep running, and after Start a client re-attaches to them.
func (c *Containerd) KillDaemon() {
	c.t.Helper()
	if err := c.proc.Stop(syscall.SIGKILL, 0); err != nil {
		c.t.Fatalf("kill containerd daemon: %v", err)
	}
}

// Start starts the daemon again on the same root after Stop or StopDaemon and waits until it
// answers.
func (c *Containerd) Start() {
	c.t.Helper()
	if err := c.startDaemon(); err != nil {
		c.t.Fatalf("restart containerd: %v", err)
	}
}

// RunningTasks maps the ID of every running task in namespace to its pid.
func (c *Containerd) RunningTasks(ctx context.Context, namespace string) (map[string]uint32, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	resp, err := c.Client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks in %s: %w", namespace, err)
	}
	out := map[string]uint32{}
	for _, p := range resp.Tasks {
		if p.Status == tasktypes.Status_RUNNING {
			out[p.ID] = p.Pid
		}
	}
	return out, nil
}

// Running reports whether the daemon is running.
func (c *Containerd) Running() bool { return c.proc.Running() }

// ImportTestImages imports BusyboxImage and PauseImage into namespace, from the tarballs in
// ImagesDir, and unpacks them into the default snapshotter (overlayfs). An image already
// present is not imported again.
func (c *Containerd) ImportTestImages(ctx context.Context, namespace string) {
	c.t.Helper()
	ctx = namespaces.WithNamespace(ctx, namespace)
	for _, img := range []struct{ name, file string }{
		{BusyboxImage, BusyboxImageFile},
		{PauseImage, PauseImageFile},
	} {
		if err := c.importImage(ctx, img.name, filepath.Join(ImagesDir(), img.file)); err != nil {
			c.t.Fatalf("import test image %s into namespace %q: %v", img.name, namespace, err)
		}
	}
}

func (c *Containerd) importImage(ctx context.Context, name, path string) error {
	image, err := c.Client.GetImage(ctx, name)
	if errdefs.IsNotFound(err) {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		imported, err := c.Client.Import(ctx, f)
		if err != nil {
			return fmt.Errorf("import %s: %w", path, err)
		}
		var names []string
		for _, img := range imported {
			names = append(names, img.Name)
			if img.Name == name {
				image = client.NewImage(c.Client, img)
			}
		}
		if image == nil {
			return fmt.Errorf("import %s registered %q, not %s (rebuild it: go run ./hack/mkimage -o %s)",
				path, names, name, ImagesDir())
		}
	} else if err != nil {
		return err
	}
	unpacked, err := image.IsUnpacked(ctx, "")
	if err != nil {
		return fmt.Errorf("check unpacked: %w", err)
	}
	if !unpacked {
		if err := image.Unpack(ctx, ""); err != nil {
			return fmt.Errorf("unpack: %w", err)
		}
	}
	return nil
}

func (c *Containerd) startDaemon() error {
	if err := c.proc.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	err := poll(ctx, c.proc, func(ctx context.Context) error {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.Client.Version(callCtx)
		return err
	})
	if err != nil {
		return fmt.Errorf("wait for containerd to answer Version: %w", err)
	}
	return nil
}

// reboot kills all tasks, stops the daemon, and clears what a reboot clears: mounts and the
// state directory (tmpfs /run on a real machine).
func (c *Containerd) reboot() error {
	if !c.proc.Running() {
		// After StopDaemon the tasks still run; only the daemon can kill them properly.
		if err := c.startDaemon(); err != nil {
			return err
		}
	}
	var errs []error
	if err := c.killAllTasks(false); err != nil {
		errs = append(errs, err)
	}
	if err := c.proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, killShims(c.Address))
	errs = append(errs, unmountUnder(c.dir))
	if err := os.RemoveAll(c.State); err != nil {
		errs = append(errs, fmt.Errorf("clear state directory: %w", err))
	}
	return errors.Join(errs...)
}

// cleanup leaves nothing behind: no task, container, mount, shim or file.
// removeCgroups removes the agents' cgroup trees, giving the kernel a few seconds to let go
// of the processes just killed (rmdir only: what still holds a process stays).
func (c *Containerd) removeCgroups() error {
	var err error
	for range 50 {
		var errs []error
		for _, root := range c.cgroupRoots {
			errs = append(errs, cgroups.Host().Remove(root))
		}
		if err = errors.Join(errs...); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// NewCgroupRoot makes a cgroup of its own for an agent running pods on c, in every hierarchy
// the host mounts (the upstream kubelet's cgroupfs manager wants its cgroupRoot in each, the
// cpuset one with the CPUs and memory nodes of its parent), and removes it with the pods' cgroups
// when c is cleaned up: other agents (tests in parallel, other engineers') share the host's
// cgroups, and a kubelet removes the pod cgroups under its kubepods it does not know.
func (c *Containerd) NewCgroupRoot() (string, error) {
	var key [6]byte
	if _, err := rand.Read(key[:]); err != nil {
		return "", err
	}
	root := "/holdfast-test-" + hex.EncodeToString(key[:])
	c.cgroupRoots = append(c.cgroupRoots, root)
	h := cgroups.Host()
	if h.Mode == cgroups.Unified {
		return root, h.Ensure(root, cgroups.Resources{})
	}
	entries, err := os.ReadDir(h.Root)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		top := filepath.Join(h.Root, e.Name())
		if !e.IsDir() || e.Name() == "unified" {
			continue // co-mounted controllers' links (cpu,cpuacct), and the v2 part of a hybrid host
		}
		dir := filepath.Join(top, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("make cgroup %s: %w", dir, err)
		}
		if e.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(top, f))
				if err != nil {
					return "", err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return "", fmt.Errorf("write %s of %s: %w", f, dir, err)
				}
			}
		}
	}
	return root, nil
}

func (c *Containerd) cleanup() error {
	var errs []error
	if c.proc != nil && c.Client != nil {
		if !c.proc.Running() {
			if err := c.startDaemon(); err != nil {
				errs = append(errs, fmt.Errorf("start daemon to clean up: %w", err))
			}
		}
		if c.proc.Running() {
			if err := c.killAllTasks(true); err != nil {
				errs = append(errs, err)
			}
		}
		if err := c.proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Client != nil {
		_ = c.Client.Close() // the daemon is gone; its error says nothing
	}
	errs = append(errs, killShims(c.Address))
	errs = append(errs, unmountUnder(c.dir))
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.dir, err))
	}
	if c.ownerLock != nil {
		c.ownerLock.Close()
	}
	return errors.Join(errs...)
}

// dirPrefix starts the name of every containerd directory under testRoot.
const dirPrefix = "ctrd-"

// ownerLockFile, in a containerd directory, is flocked by the test binary that owns the
// directory for as long as it runs. The kernel drops the lock when that process dies, however
// it dies, so a directory whose lock can be taken was left behind by a test binary that was
// killed (a -timeout panic runs no cleanups): its shims and mounts are then swept.
const ownerLockFile = "owner.lock"

// sweepLockFile, in testRoot, serialises sweeping with the creation of containerd
// directories: without it, a sweeper in another test binary could take the owner lock of a
// directory created an instant before, between its creation and its owner's flock, and remove
// it as stale.
const sweepLockFile = ".sweep.lock"

// withSweepLock runs fn holding the sweep lock.
func withSweepLock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(testRoot(), sweepLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open sweep lock: %w", err)
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("take sweep lock: %w", err)
	}
	return fn()
}

// createOwnedDir creates a containerd directory under testRoot and takes its owner lock,
// which this test binary holds until it exits.
func createOwnedDir() (string, *os.File, error) {
	var dir string
	var lock *os.File
	err := withSweepLock(func() error {
		var err error
		if dir, err = os.MkdirTemp(testRoot(), dirPrefix); err != nil {
			return err
		}
		if lock, err = lockOwner(dir); err != nil {
			return errors.Join(err, os.RemoveAll(dir))
		}
		return nil
	})
	return dir, lock, err
}

func lockOwner(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create owner lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("take owner lock: %w", err)
	}
	return f, nil
}

var sweepStaleOnce = sync.OnceValue(sweepStale)

// sweepStale removes the containerd directories of dead test binaries: kills their shims and
// containers, unmounts, removes. The daemons themselves died with their test binary
// (Pdeathsig).
func sweepStale() error {
	return withSweepLock(sweepStaleLocked)
}

func sweepStaleLocked() error {
	entries, err := os.ReadDir(testRoot())
	if err != nil {
		return fmt.Errorf("sweep %s: %w", testRoot(), err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(testRoot(), e.Name())
		f, err := os.OpenFile(filepath.Join(dir, ownerLockFile), os.O_RDWR, 0)
		if err != nil {
			// No lock file: just created by a live test (it locks right after), or not ours.
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close() // its owner lives
			continue
		}
		errs = append(errs, killShims(filepath.Join(dir, "containerd.sock")), unmountUnder(dir))
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove stale %s: %w", dir, err))
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// killAllTasks kills and deletes the task of every container in every namespace, and with
// deleteContainers the containers and their snapshots too.
func (c *Containerd) killAllTasks(deleteContainers bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nsList, err := c.Client.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	var errs []error
	for _, ns := range nsList {
		nsCtx := namespaces.WithNamespace(ctx, ns)
		containers, err := c.Client.Containers(nsCtx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list containers in namespace %q: %w", ns, err))
			continue
		}
		for _, ctr := range containers {
			task, err := ctr.Task(nsCtx, nil)
			switch {
			case errdefs.IsNotFound(err):
			case err != nil:
				errs = append(errs, fmt.Errorf("task of container %s/%s: %w", ns, ctr.ID(), err))
			default:
				if err := deleteTask(nsCtx, ctr, task); err != nil {
					errs = append(errs, fmt.Errorf("kill task of container %s/%s: %w", ns, ctr.ID(), err))
				}
			}
			if deleteContainers {
				if err := ctr.Delete(nsCtx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete container %s/%s: %w", ns, ctr.ID(), err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// deleteTask kills and deletes task. Containers of one CRI pod share a shim, which exits with
// the pod's last task: a task whose shim went away while it was being deleted ("ttrpc:
// closed") is looked up again, and only an error for a task that still exists counts.
func deleteTask(ctx context.Context, ctr client.Container, task client.Task) error {
	_, err := task.Delete(ctx, client.WithProcessKill)
	if err == nil || errdefs.IsNotFound(err) {
		return nil
	}
	again, lerr := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(lerr) {
		return nil
	}
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	if _, err := again.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// killShims SIGKILLs, as a last resort, every containerd shim started for the daemon at
// address, and the processes they started (container inits; killing a PID namespace's init
// kills the namespace). Nothing is found when the daemon deleted its tasks.
func killShims(address string) error {
	shims, children, err := findShims(address)
	if err != nil {
		return err
	}
	for _, pid := range append(children, shims...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// findShims returns the pids of the shims serving the daemon at address, and of their
// children.
func findShims(address string) (shims, children []int, err error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, fmt.Errorf("find shims: %w", err)
	}
	parents := map[int]int{} // pid -> ppid
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat")); err == nil {
			// The command name in parentheses may hold spaces; the fields after the last ')'
			// are state, ppid, ...
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
				if fields := strings.Fields(string(stat[i+1:])); len(fields) > 1 {
					parents[pid], _ = strconv.Atoi(fields[1])
				}
			}
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args[:len(args)-1] {
			if (a == "-address" || a == "--address") && args[i+1] == address {
				shims = append(shims, pid)
				break
			}
		}
	}
	for _, shim := range shims {
		for pid, ppid := range parents {
			if ppid == shim {
				children = append(children, pid)
			}
		}
	}
	return shims, children, nil
}

// unmountUnder lazily unmounts every mount point under dir, deepest first, so that removing
// dir never reaches through an overlay into a snapshot.
func unmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
