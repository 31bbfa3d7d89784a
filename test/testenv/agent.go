package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/status"
	testpoll "github.com/holdfast-dev/holdfast/test/poll"
)

var holdfastBinary = sync.OnceValues(func() (string, error) {
	removeStaleBinaries()
	dir, err := os.MkdirTemp("", binDirPrefix)
	if err != nil {
		return "", err
	}
	// The test process that owns the directory: a later one removes it once this one is gone
	// (a package-level build has no test to clean up after it; 130 MiB each, they filled the
	// disk of a machine that ran the suite a hundred times).
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", err
	}
	// Both binaries, as a gateway has them: the agent finds its container logger beside it.
	// Under -race the agent is built with -race as well (see failOnDataRace). With the
	// failpoints compiled in, unarmed (a no-op unless Agent.SetEnv arms one; internal/failpoint):
	// the production build has none. grpcnotrace as the production build (hack/firmware.sh).
	args := []string{"build", "-tags", "failpoints,grpcnotrace"}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "-o", dir+"/", "github.com/holdfast-dev/holdfast/cmd/holdfast", "github.com/holdfast-dev/holdfast/cmd/holdfast-logger")
	cmd := exec.Command("go", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build holdfast: %v\n%s", err, b)
	}
	return filepath.Join(dir, "holdfast"), nil
})

// binDirPrefix names the temporary directories the holdfast binaries are built into.
const binDirPrefix = "holdfast-bin-"

// removeStaleBinaries removes the binary directories of test processes that have exited.
func removeStaleBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue // being made, or made before owners were recorded: not ours to judge
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

// Agent is a holdfast process under test, run from the binary users run, so that a test can
// kill -9 it and start it again exactly as an operator's machine would.
type Agent struct {
	// Config is what the agent runs with; tests may change it between Stop and Start.
	Config config.Config
	// Dir holds the agent's config file, state, logs and manifests.
	Dir string

	t    testing.TB
	proc *Process
}

// NewAgentConfig returns a configuration whose every path lies under dir, talking to the given
// containerd (its own namespace) and CNI network, with a free local healthz port.
func NewAgentConfig(t testing.TB, dir string, cd *Containerd, cni *CNINetwork) config.Config {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// The node API on a port of its own: 10250 may be another kubelet's on this machine.
	apiLn, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	apiPort := apiLn.Addr().(*net.TCPAddr).Port
	apiLn.Close()
	// The state key, as the firmware provisions it on a gateway.
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatalf("state key: %v", err)
	}
	keyFile := filepath.Join(dir, "state.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatalf("state key: %v", err)
	}
	cfg := config.Config{
		NodeName:        "gw-test",
		StateDir:        filepath.Join(dir, "state"),
		LocalAPISocket:  filepath.Join(dir, "api.sock"),
		StateKeyFile:    keyFile,
		ManifestDir:     filepath.Join(dir, "manifests"),
		PodLogDir:       filepath.Join(dir, "pods"),
		ImagePreloadDir: "-",
		PolicyCacheDir:  filepath.Join(dir, "wasm-cache"),
		HealthzAddress:  addr,
		Port:            &apiPort,
		// The test machines' disks are shared with others, whose files can take them past the
		// kubelet's 10% and 15% defaults: a test that does not test eviction must not find its
		// pods refused under a DiskPressure it did not cause. Tests of eviction set their own.
		EvictionHard: map[string]string{"nodefs.available": "1%", "imagefs.available": "1%"},
	}
	// Its own kubepods: other agents (tests in parallel, other engineers') share the host's
	// cgroups, and each caps and cleans up its own hierarchy.
	cfg.CgroupRoot = "/holdfast-test-" + hex.EncodeToString(key[:6])
	cd.cgroupRoots = append(cd.cgroupRoots, cfg.CgroupRoot)
	cfg.Containerd.Address = cd.Address
	cfg.Containerd.Namespace = "holdfast"
	if cni != nil {
		cfg.CNI.ConfDir = cni.ConfDir
		cfg.CNI.BinDirs = []string{cni.BinDir}
	}
	cfg.CNI.NetNSDir = filepath.Join(dir, "netns")
	return cfg
}

// StartAgent writes cfg to a file and starts holdfast with it. The agent is killed when the
// test ends (its containers are the containerd fixture's to clean up) and its log printed if
// the test failed.
func StartAgent(t testing.TB, dir string, cfg config.Config) *Agent {
	t.Helper()
	return StartAgentEnv(t, dir, cfg, nil)
}

// StartAgentEnv is StartAgent with variables ("KEY=VALUE") added to the agent's environment,
// e.g. NOTIFY_SOCKET to play systemd.
func StartAgentEnv(t testing.TB, dir string, cfg config.Config, env []string) *Agent {
	t.Helper()
	bin, err := holdfastBinary()
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{Config: cfg, Dir: dir, t: t}
	a.proc = NewProcess("holdfast", filepath.Join(dir, "holdfast.log"), bin, "run", "--config", filepath.Join(dir, "config.yaml"), "--log-level", "debug")
	a.proc.env = env
	t.Cleanup(func() {
		_ = a.proc.Stop(syscall.SIGKILL, 0)
		failOnDataRace(t, a.proc.LogPath())
		// Pod network namespaces are bind mounts under dir; the killed agent left them.
		if err := unmountUnder(dir); err != nil {
			t.Errorf("unmount what the agent left in %s: %v", dir, err)
		}
	})
	logTailOnFailure(t, a.proc)
	a.Start()
	return a
}

// failOnDataRace fails t when the race detector reported a data race in the agent's log: an
// agent built with -race reports races on stderr and goes on, so without this check a race would
// pass unnoticed whenever the test's own assertions hold.
func failOnDataRace(t testing.TB, logPath string) {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		return // never started
	}
	if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
		end := min(len(b), i+8<<10)
		t.Errorf("the agent reported a data race (%s):\n%s", logPath, b[i:end])
	}
}

// Start writes the current Config and starts the agent.
func (a *Agent) Start() {
	a.t.Helper()
	b, err := yaml.Marshal(a.Config)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Dir, "config.yaml"), b, 0o600); err != nil {
		a.t.Fatal(err)
	}
	if err := a.proc.Start(); err != nil {
		a.t.Fatal(err)
	}
}

// SetEnv replaces the variables ("KEY=VALUE") added to the agent's environment from its next
// Start on, e.g. to arm a failpoint (internal/failpoint) for one run.
func (a *Agent) SetEnv(env []string) {
	a.proc.env = env
}

// Kill kills the agent with SIGKILL, as a crash or a power cut would stop it.
func (a *Agent) Kill() {
	a.t.Helper()
	if err := a.proc.Stop(syscall.SIGKILL, 0); err != nil {
		a.t.Fatal(err)
	}
}

// Stop stops the agent with SIGTERM.
func (a *Agent) Stop() {
	a.t.Helper()
	if err := a.proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		a.t.Fatal(err)
	}
}

// Pid is the pid of the running agent, 0 if it is not running: for tests that read what the
// kernel says of it (/proc/PID/stat, /proc/PID/status).
func (a *Agent) Pid() int { return a.proc.Pid() }

// Binary is the holdfast binary the agent runs, for tests of its CLI.
func (a *Agent) Binary() string {
	a.t.Helper()
	return HoldfastBinary(a.t)
}

// HoldfastBinary is the holdfast binary agents run (built once per test binary), for tests
// that run it themselves.
func HoldfastBinary(t testing.TB) string {
	t.Helper()
	p, err := holdfastBinary()
	if err != nil {
		t.Fatalf("holdfast binary: %v", err)
	}
	return p
}

// Log returns the agent's log so far.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(a.proc.LogPath())
	return string(b)
}

// Pods asks the agent's local API socket for its pods.
func (a *Agent) Pods(ctx context.Context) ([]status.PodView, error) {
	return LocalPods(ctx, a.Config.LocalAPISocket)
}

// LocalPods asks the local API socket of a holdfast for /pods: the pods as the agent itself
// sees them, with or without an apiserver (what `holdfast pods` shows).
func LocalPods(ctx context.Context, socket string) ([]status.PodView, error) {
	body, err := LocalGet(ctx, socket, "/pods")
	if err != nil {
		return nil, err
	}
	var list v1.PodList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode /pods on %s: %w", socket, err)
	}
	views := make([]status.PodView, 0, len(list.Items))
	for i := range list.Items {
		views = append(views, status.ViewOf(&list.Items[i]))
	}
	return views, nil
}

// LocalGet GETs path from the local API socket of an agent, as `curl --unix-socket` on the
// gateway would, with no apiserver involved, and returns the body of a 200.
func LocalGet(ctx context.Context, socket, path string) ([]byte, error) {
	// One connection per call, closed with it: a transport per call that kept its idle
	// connection would leave it open on the agent until the server's idle timeout (2 min),
	// and tests that poll would read the agent's open files and goroutines grow
	// (TestLinkFlapping did, after the pod list moved to the socket).
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://holdfast"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s on %s: %w", path, socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s on %s: %w", path, socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s on %s: %s %.200s", path, socket, resp.Status, body)
	}
	return body, nil
}

// Eventually polls cond every 100ms until it returns nil or timeout passes, then fails t with
// the last error. Tests wait for conditions with it, never with a bare sleep.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	// Every 100 ms: most conditions here are read from the apiserver or the agent's socket.
	testpoll.Until(t, timeout, 100*time.Millisecond, what, cond)
}

// LoseVolatileState does to the agent's directory what a reboot does to a gateway: every mount
// under it is gone, and so is what lived on it: the tmpfs of Secret, token, downwardAPI and
// emptyDir Memory volumes, the bind mounts that keep pod network namespaces alive (their files
// live on tmpfs /run on a gateway, so they go too) and subPath bind mounts. Files on disk stay.
// Call it with the agent killed and containerd stopped (Containerd.Stop), as Reboot does.
func (a *Agent) LoseVolatileState() {
	a.t.Helper()
	if err := LoseVolatileState(a.Dir, a.Config.CNI.NetNSDir); err != nil {
		a.t.Fatalf("reboot: %v", err)
	}
}

// LoseVolatileState is Agent.LoseVolatileState for an agent run from dir (holdfast's or any
// other) whose pod network namespaces live in netnsDir ("": none of its own).
func LoseVolatileState(dir, netnsDir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
	}
	if err := unmountUnder(dir); err != nil {
		return err
	}
	for _, m := range mounts {
		if err := clearMountPoint(m.Mountpoint); err != nil {
			return err
		}
	}
	// The namespace directory itself is on tmpfs on a gateway (/var/run/netns).
	if netnsDir != "" {
		if err := clearMountPoint(netnsDir); err != nil {
			return err
		}
	}
	return nil
}

// clearMountPoint removes what is left at an unmounted mount point: a file (a network namespace
// bind mount) is removed, a directory emptied.
func clearMountPoint(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return os.Remove(path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(path, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Reboot does to the node what a reboot does, power back on included: the agents are killed,
// containerd loses every task and its state directory (Containerd.Stop), the agents lose their
// mounts and what was on tmpfs (LoseVolatileState), and containerd starts again. The caller
// starts the agents again, with whatever network conditions the test wants at boot.
func Reboot(cd *Containerd, agents ...*Agent) {
	cd.t.Helper()
	for _, a := range agents {
		a.Kill()
	}
	cd.Stop()
	for _, a := range agents {
		a.LoseVolatileState()
	}
	cd.Start()
}
