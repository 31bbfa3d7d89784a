package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// runAgentOnce runs holdfast with the configuration file until it exits on its own (within the
// timeout, else the test fails) and returns its combined output and exit error.
func runAgentOnce(t *testing.T, bin, configPath string, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "run", "--config", configPath).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("holdfast did not exit within %s; it should have refused to start:\n%s", timeout, out)
	}
	return string(out), err
}

// TestSecondAgentOnSameStateDir: a second holdfast started on the state directory of a running
// one (two unit files, a careless restart script) exits at once with an error naming the
// directory and the first agent, before it touches anything: no logger installed, no
// containerd connection, no identity. The first agent's pod runs on, its container the same.
func TestSecondAgentOnSameStateDir(t *testing.T) {
	e := startEnv(t, false, nil)
	manifest := filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml")
	if err := os.WriteFile(manifest, fmt.Appendf(nil, staticPod, "v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	sensor := "sensor-" + node
	e.waitLocalRunning(t, sensor)
	before, err := e.localPod(sensor)
	if err != nil {
		t.Fatal(err)
	}

	// The same configuration, as a second unit would run it.
	out, err := runAgentOnce(t, e.agent.Binary(), filepath.Join(e.agent.Dir, "config.yaml"), time.Minute)
	if err == nil {
		t.Fatalf("the second agent exited 0:\n%s", out)
	}
	for _, want := range []string{"another holdfast may be running", e.agent.Config.StateDir} {
		if !strings.Contains(out, want) {
			t.Errorf("the second agent's error does not say %q:\n%s", want, out)
		}
	}
	for _, touched := range []string{`msg="container logger installed"`, `msg="connected to container runtime"`, `msg="holdfast running"`} {
		if strings.Contains(out, touched) {
			t.Errorf("the second agent got as far as %q before giving up:\n%s", touched, out)
		}
	}

	after, err := e.localPod(sensor)
	if err != nil {
		t.Fatal(err)
	}
	if b, a := before.Status.ContainerStatuses[0], after.Status.ContainerStatuses[0]; a.ContainerID != b.ContainerID || a.RestartCount != 0 || !a.Ready {
		t.Errorf("the first agent's pod was disturbed: container %s (restarts %d, ready %v), was %s", a.ContainerID, a.RestartCount, a.Ready, b.ContainerID)
	}
	if strings.Contains(e.agent.Log(), "level=ERROR") {
		t.Errorf("the first agent logged an error while the second tried to start:\n%s", e.agent.Log())
	}
}

// TestReadOnlyStateDir: a state directory on a read-only file system (a mount gone wrong, a
// flash card the kernel remounted read-only after errors) stops holdfast at start with an
// error naming the path and the cause, not a panic or a half-started agent.
func TestReadOnlyStateDir(t *testing.T) {
	testenv.RequireIntegration(t)
	dir := t.TempDir()
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	cfg := testenv.NewAgentConfig(t, dir, cd, nil)
	cfg.NodeName = node
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(cfg.StateDir, cfg.StateDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(cfg.StateDir, unix.MNT_DETACH) })
	if err := unix.Mount("", cfg.StateDir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runAgentOnce(t, testenv.HoldfastBinary(t), configPath, time.Minute)
	if err == nil {
		t.Fatalf("holdfast exited 0 on a read-only state directory:\n%s", out)
	}
	for _, want := range []string{cfg.StateDir, "read-only file system"} {
		if !strings.Contains(out, want) {
			t.Errorf("the error does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "panic") || strings.Contains(out, `msg="holdfast running"`) {
		t.Errorf("holdfast panicked or started:\n%s", out)
	}
}

// TestStateDirFull: the state directory's file system fills up (a pod's emptyDir, a log gone
// wild, a full flash). The pod already running runs on untouched; a new pod is not lost: it
// runs, or waits with the reason in its status, and its event says the node could not cache
// it; once there is room again it runs and is cached, with nothing restarted by hand.
func TestStateDirFull(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", c.StateDir, "tmpfs", 0, "size=32m,mode=0700"); err != nil {
			t.Fatalf("mount a small state file system: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(c.StateDir, unix.MNT_DETACH) })
		// Eviction would act on a full node file system (DiskPressure, then pods evicted, as the
		// kubelet does; TestEvictionDiskPressure): this test is about the state store.
		c.EvictionHard["nodefs.available"] = "0%"
		c.EvictionHard["nodefs.inodesFree"] = "0%"
	})
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, sleeperPod("before", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.waitAPIRunning(t, "before")["before"]

	filler := filepath.Join(e.agent.Config.StateDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()

	// A pod as large as the API allows annotations to make it: its record needs pages past the
	// end of the store's file, which a full disk cannot give. A small one may fit in pages the
	// store freed earlier (bbolt reuses them), be cached without error, and leave nothing to
	// test: the flake this test had.
	during := sleeperPod("during", false)
	during.Annotations = map[string]string{"example.com/padding": strings.Repeat("x", 200<<10)}
	if _, err := pods.Create(ctx, during, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the NotCached event of the pod created on a full disk", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=during,reason=NotCached"})
		if err != nil {
			return err
		}
		if len(evs.Items) == 0 || !strings.Contains(evs.Items[0].Message, "no space left on device") {
			return fmt.Errorf("events %+v", evs.Items)
		}
		return nil
	})
	time.Sleep(5 * time.Second) // what a full disk does to the running pod has had time to show
	e.requireUntouched(t, "before")
	if p, err := pods.Get(ctx, "before", metav1.GetOptions{}); err != nil || containerIDOf(p) != containerIDOf(before) {
		t.Errorf("before: container %v, was %s (%v)", p.Status.ContainerStatuses, containerIDOf(before), err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	e.waitAPIRunning(t, "during")
	testenv.Eventually(t, 90*time.Second, "the pod cached once there is room", func() error {
		for _, l := range strings.Split(e.agent.Log(), "\n") {
			if strings.Contains(l, `msg="pod cached after all"`) && strings.Contains(l, "pod=default/during") {
				return nil
			}
		}
		return fmt.Errorf("no \"pod cached after all\" line for default/during")
	})
	e.requireUntouched(t, "before")
}
