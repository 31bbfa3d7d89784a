package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestStandaloneStaticPods: with no apiserver at all, the pods of the manifest directory run;
// a malformed manifest beside them is reported with its path and hurts nothing; editing a
// manifest replaces its pod; removing the file stops it.
func TestStandaloneStaticPods(t *testing.T) {
	e := startEnv(t, false, nil)
	dir := e.agent.Config.ManifestDir
	ctx := context.Background()
	write := func(name, content string) {
		t.Helper()
		// Written aside and renamed in, as a careful operator (or an image build) does.
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("sensor.yaml", fmt.Sprintf(staticPod, "v1"))
	write("broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec:\n  containers: [{name: x}]\n")

	running := func() (status.PodView, error) {
		pods, err := e.agent.Pods(ctx)
		if err != nil {
			return status.PodView{}, err
		}
		for _, p := range pods {
			if p.Name == "sensor-"+node && p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				return p, nil
			}
		}
		return status.PodView{}, fmt.Errorf("no running sensor pod in %+v", pods)
	}
	var first status.PodView
	testenv.Eventually(t, 60*time.Second, "static pod running", func() (err error) {
		first, err = running()
		return err
	})
	if first.Source != "file" || first.Namespace != "default" {
		t.Errorf("static pod view %+v", first)
	}
	testenv.Eventually(t, 10*time.Second, "broken manifest reported with its path", func() error {
		log := e.agent.Log()
		if !strings.Contains(log, filepath.Join(dir, "broken.yaml")) || !strings.Contains(log, "spec.containers[0].image: Required") {
			return fmt.Errorf("no log line naming broken.yaml and its error")
		}
		return nil
	})
	firstIDs := containerIDs(e.containers(t))
	if len(firstIDs) != 1 {
		t.Fatalf("containers %v, want 1", firstIDs)
	}

	// Edit: a new pod (new UID) replaces the old one, whose containers go.
	write("sensor.yaml", fmt.Sprintf(staticPod, "v2"))
	testenv.Eventually(t, 60*time.Second, "edited pod replaced", func() error {
		p, err := running()
		if err != nil {
			return err
		}
		if p.UID == first.UID {
			return fmt.Errorf("still the old pod %s", p.UID)
		}
		ids := containerIDs(e.containers(t))
		if len(ids) != 1 || ids[0] == firstIDs[0] {
			return fmt.Errorf("containers %v (old %v)", ids, firstIDs)
		}
		return nil
	})

	// Remove: the pod stops, its containers and network go.
	if err := os.Remove(filepath.Join(dir, "sensor.yaml")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "removed manifest stops its pod", func() error {
		if ids := containerIDs(e.containers(t)); len(ids) != 0 {
			return fmt.Errorf("containers left: %v", ids)
		}
		entries, _ := os.ReadDir(e.agent.Config.CNI.NetNSDir)
		if len(entries) != 0 {
			return fmt.Errorf("network namespaces left: %d", len(entries))
		}
		return nil
	})
	// Nothing of the two versions is left in the store: before, a record per version of a
	// manifest was kept for good.
	e.agent.Stop()
	if names := e.storedPods(t); len(names) != 0 {
		t.Errorf("records left in the state store: %v", names)
	}
}

// storedPods opens the state database of the stopped agent and returns the pods it holds
// records of (name/UID).
func (e *env) storedPods(t *testing.T) []string {
	t.Helper()
	store, _ := e.openStore(t)
	defer store.Close()
	recs, _, err := store.LoadPods()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Pod.Name+"/"+string(r.UID))
	}
	return names
}

// TestPreloadedImagesBootOfflineGateway: a fresh gateway with no registry and no images in
// containerd imports the firmware's image tarballs at boot and runs its static pods; the next
// boot finds them present and skips the import.
func TestPreloadedImagesBootOfflineGateway(t *testing.T) {
	testenv.RequireIntegration(t)
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	cni := testenv.CNI(t)
	dir := t.TempDir()
	cfg := testenv.NewAgentConfig(t, dir, cd, cni)
	cfg.NodeName = node
	cfg.ImagePreloadDir = testenv.ImagesDir()
	if err := os.MkdirAll(cfg.ManifestDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ManifestDir, "sensor.yaml"), []byte(fmt.Sprintf(staticPod, "v1")), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := testenv.StartAgent(t, dir, cfg)
	e := &env{cd: cd, cni: cni, agent: agent}
	e.waitLocalRunning(t, "sensor-"+node)
	if !strings.Contains(agent.Log(), `msg="preloaded images"`) {
		t.Error("no log line for the imported tarballs")
	}
	agent.Kill()
	agent.Start()
	testenv.Eventually(t, 30*time.Second, "second boot skips present images", func() error {
		if !strings.Contains(agent.Log(), "preloaded images already present") {
			return fmt.Errorf("no skip logged")
		}
		return nil
	})
	e.waitLocalRunning(t, "sensor-"+node)
}

// TestLocalCLIWithoutApiserver: with no apiserver at all, an operator on the gateway reads a
// container's logs, runs a command in it (stdin included), restarts its pod and describes it
// (status, admission, the agent's recent events) with the holdfast CLI, through the agent's
// root-only local socket; each action is in the agent's log.
func TestLocalCLIWithoutApiserver(t *testing.T) {
	e := startEnv(t, false, nil)
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml"), []byte(fmt.Sprintf(staticPod, "v1")), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := "sensor-" + node
	restarts := func() (int32, error) {
		pods, err := e.agent.Pods(ctx)
		if err != nil {
			return 0, err
		}
		for _, p := range pods {
			if p.Name == pod && p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
				return p.Status.ContainerStatuses[0].RestartCount, nil
			}
		}
		return 0, fmt.Errorf("%s not running", pod)
	}
	testenv.Eventually(t, 60*time.Second, pod+" running", func() error { _, err := restarts(); return err })

	socket := e.agent.Config.LocalAPISocket
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local socket %s: %v, %v; want a socket only root can open", socket, fi, err)
	}
	cli := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(e.agent.Binary(), append(args, "--socket", socket)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	testenv.Eventually(t, 30*time.Second, "holdfast logs", func() error {
		out, err := cli("", "logs", pod)
		if err != nil || out != "reading v1\n" {
			return fmt.Errorf("%q, %v", out, err)
		}
		return nil
	})
	if out, err := cli("", "logs", pod, "-c", "nope"); err == nil || !strings.Contains(out, `container "nope" not found`) {
		t.Errorf("logs of an unknown container: %q, %v", out, err)
	}
	if out, err := cli("", "pods"); err != nil || !regexp.MustCompile(`(?m)^\S+ +`+pod+` +file +Running +1/1 +0 `).MatchString(out) {
		t.Errorf("holdfast pods: %q, %v; want %s running from its manifest", out, err, pod)
	}
	// The health port answers anyone on the machine (a hostNetwork pod included) without
	// authentication: it says healthy or not, and lists nothing.
	for _, path := range []string{"/pods", "/pods/", "/runningpods"} {
		resp, err := http.Get("http://" + e.agent.Config.HealthzAddress + path)
		if err != nil {
			t.Fatalf("health port %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.Contains(string(body), pod) {
			t.Errorf("health port %s: %s %.200q; want 404 and no pod", path, resp.Status, body)
		}
	}
	// `--` ends holdfast's flags; --socket goes before it.
	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(e.agent.Binary(), append([]string{"exec", "--socket", socket}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("through stdin\n", "-i", pod, "--", "cat"); err != nil || out != "through stdin\n" {
		t.Errorf("exec -i cat: %q, %v", out, err)
	}
	var exitErr *exec.ExitError
	if out, err := run("", pod, "--", "sh", "-c", "exit 3"); !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Errorf("exec exit 3: %q, %v; want holdfast to exit 3", out, err)
	}
	if out, err := cli("", "restart", pod); err != nil {
		t.Fatalf("restart: %q, %v", out, err)
	}
	testenv.Eventually(t, 60*time.Second, pod+" restarted", func() error {
		n, err := restarts()
		if err != nil || n != 1 {
			return fmt.Errorf("restartCount %d, %v", n, err)
		}
		return nil
	})
	checkStandaloneMetrics(t, e)
	out, err := cli("", "describe", pod)
	for _, want := range []string{"Name:       " + pod, "Source:     static manifest", "Phase:      Running", "Admission:  admitted",
		"reader: running since", "restarts 1", "Killing", "restarted with holdfast restart (local API)"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("describe lacks %q (%v):\n%s", want, err, out)
		}
	}
	for _, want := range []string{`msg="local API request" component=nodeapi method=POST path=/exec/default/` + pod, `path=/restart/default/` + pod} {
		if !strings.Contains(e.agent.Log(), want) {
			t.Errorf("the agent's log lacks %q", want)
		}
	}
}
