package agent_test

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
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/internal/testenv"
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
