package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// The agents measured.
const (
	// Holdfast is holdfast on its default backend (runtime: containerd): containerd through
	// its client, holdfast's own CNI and container logger.
	Holdfast = "holdfast"
	// HoldfastCRI is the same holdfast binary on its CRI backend (runtime: cri): containerd's
	// CRI plugin makes a pause sandbox per pod with its own CNI, and writes the logs.
	HoldfastCRI = "holdfast-cri"
	Kubelet     = "kubelet"
)

// isHoldfast reports whether kind is holdfast, on either backend: what the agent binary does
// whatever its backend (its start trace and /metrics on the local socket, its /pods on that socket,
// its pod cache for an offline boot) applies to both.
func isHoldfast(kind string) bool { return kind == Holdfast || kind == HoldfastCRI }

// NodeName is the node an agent registers: one per agent, so that no two see each other's
// pods or Node on the shared apiserver.
func NodeName(agent string) string { return "bench-" + agent }

// containerdNamespace is where an agent's containers live: holdfast's own namespace on its
// containerd backend, and k8s.io for the kubelet and holdfast's CRI backend, which reach
// containerd through its CRI plugin (pause sandboxes included).
func containerdNamespace(agent string) string {
	if agent == Holdfast {
		return "holdfast"
	}
	return "k8s.io"
}

// pauseArgv is the command line of the CRI plugin's sandbox containers: the test pause image
// runs busybox's sleep (see test/testenv/testimages).
var pauseArgv = []string{"sleep", "2147483647"}

// agentProc is a running node agent the harness can kill -9 and start again.
type agentProc struct {
	kind string
	bin  string
	node string
	dir  string
	proc *testenv.Process
	// socket is holdfast's local API socket (its /metrics, and its /pods, which works with
	// the apiserver down).
	socket string
}

// isHelper reports whether a child of a containerd shim is a process the node runs on the
// agent's behalf rather than a workload: holdfast's container loggers (its own binary, run
// by the shim under the holdfast-logger name) and the CRI plugin's pause sandboxes (the
// kubelet's and holdfast-cri's alike).
func isHelper(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	return filepath.Base(argv[0]) == logs.LoggerName || slices.Equal(argv, pauseArgv)
}

// buildHoldfast builds holdfast and its container logger as the firmware ships them, for this
// machine's architecture: hack/firmware.sh --build, static (CGO_ENABLED=0), stripped of its
// symbol table and DWARF (-s -w) as the kubelet is (hack/build-kubelet.sh, like upstream's
// release builds), -trimpath, its tags. A build with cgo (go build's default where a C compiler
// is found) links libc dynamically: the agent's RSS then counted libc's and the dynamic
// loader's pages, which no gateway has, and the
// kubelet beside it is static. The logger lands beside the agent, where a gateway has it and
// the agent looks for it. The binaries go to a directory removed when t ends; the agent's is
// returned.
func buildHoldfast(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	arch := runtime.GOARCH
	if arch == "arm" {
		arch = "armv7" // firmware.sh's name for GOARCH=arm GOARM=7
	}
	cmd := exec.Command("nice", "-n", "10", filepath.Join(repo.Root(t), "hack", "firmware.sh"), "--build", arch, dir)
	cmd.Dir = repo.Root(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build holdfast (hack/firmware.sh --build %s): %v\n%s", arch, err, b)
	}
	return filepath.Join(dir, "holdfast")
}

// newHoldfast prepares holdfast of kind Holdfast or HoldfastCRI for node NodeName(kind): the
// test environment's agent configuration (every path under dir, its containerd and CNI
// network), on the CRI backend for HoldfastCRI (cd's CRI plugin, whose network is the same CNI
// configuration), the node's kubeconfig (kubeconfig: through the harness's relay), no static
// manifest directory, kubelet's default heartbeat and back-off settings (or the uplink
// profile's), logging at info.
func newHoldfast(t testing.TB, kind, dir, bin, kubeconfig, profile string, cd *testenv.Containerd, cni *testenv.CNINetwork) *agentProc {
	t.Helper()
	node := NodeName(kind)
	cfg := testenv.NewAgentConfig(t, dir, cd, cni)
	cfg.NodeName = node
	cfg.Kubeconfig = kubeconfig
	cfg.UplinkProfile = profile
	cfg.ManifestDir = "-"
	// A gateway's /run is a tmpfs (systemd mounts it), and holdfast keeps there what it makes
	// and removes all the time: the FIFOs of every exec (a probe's), its compiled policies.
	// This machine's /run is a directory of the root file system, where those FIFOs' metadata
	// writes were charged to the agent (about 600 KiB a minute for one exec probe a second):
	// the agent gets a tmpfs of its own as its /run, as on a gateway.
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", run, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs as the agent's /run: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(run, unix.MNT_DETACH) })
	cfg.ExecFIFODir = filepath.Join(run, "exec")
	cfg.PolicyCacheDir = filepath.Join(run, "wasm-cache")
	switch kind {
	case Holdfast:
		cfg.Containerd.Namespace = containerdNamespace(kind)
	case HoldfastCRI:
		// As the agent's integration tests configure it (startEnvOn); the CRI backend uses
		// the CRI plugin's namespace, not containerd.namespace.
		cfg.Runtime, cfg.CRIEndpoint = config.RuntimeCRI, "unix://"+cd.Address
	default:
		t.Fatalf("newHoldfast: %q is not holdfast", kind)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return &agentProc{
		kind:   kind,
		bin:    bin,
		node:   node,
		dir:    dir,
		socket: cfg.LocalAPISocket,
		proc:   testenv.NewProcess(kind, filepath.Join(dir, "holdfast.log"), bin, "run", "--config", cfgPath, "--log-level", "info"),
	}
}

// newKubelet prepares the upstream kubelet at bin for node NodeName(Kubelet), talking to cd's
// CRI plugin, with the node's kubeconfig (through the harness's relay), its node API on loopback (testenv.KubeletCommand).
func newKubelet(t testing.TB, dir, bin, kubeconfig string, cd *testenv.Containerd) *agentProc {
	t.Helper()
	node := NodeName(Kubelet)
	argv := testenv.KubeletCommand(t, testenv.KubeletOptions{
		Dir: dir, Bin: bin, Socket: cd.Address, NodeName: node, Kubeconfig: kubeconfig,
	})
	return &agentProc{kind: Kubelet, bin: bin, node: node, dir: dir, proc: testenv.NewProcess(Kubelet, filepath.Join(dir, "kubelet.log"), argv...)}
}

func (a *agentProc) start(t testing.TB) {
	t.Helper()
	if err := a.proc.Start(); err != nil {
		t.Fatal(err)
	}
}

// kill kills the agent with SIGKILL, as a crash or a power cut would.
func (a *agentProc) kill(t testing.TB) {
	t.Helper()
	if err := a.proc.Stop(syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
}

// pid is the agent's own pid (the kubelet's: unshare and sh exec it).
func (a *agentProc) pid() int { return a.proc.Pid() }

// localPods asks holdfast's local API socket for /pods, which answers from the agent's own
// state.
func (a *agentProc) localPods(ctx context.Context) ([]status.PodView, error) {
	if a.socket == "" {
		return nil, fmt.Errorf("%s has no local API socket", a.kind)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return testenv.LocalPods(ctx, a.socket)
}

// localRunning counts the named pods holdfast reports Running with every container ready.
func localRunning(pods []status.PodView, names map[string]bool) int {
	n := 0
	for _, p := range pods {
		if !names[p.Name] || p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		ready := true
		for _, cs := range p.Status.ContainerStatuses {
			ready = ready && cs.Ready && cs.State.Running != nil
		}
		if ready {
			n++
		}
	}
	return n
}
