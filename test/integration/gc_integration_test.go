package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/ociimage"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Images of the collection test, each a one-file layer with its own content (so its own
// digest).
const (
	gcUnusedA   = "docker.io/holdfast/gc-unused-a:1"
	gcUnusedB   = "docker.io/holdfast/gc-unused-b:1"
	gcPinned    = "docker.io/holdfast/gc-pinned:1"
	gcPreloaded = "docker.io/holdfast/gc-preloaded:1"
)

func gcImageTar(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	err := ociimage.WriteLayout(&buf, ociimage.Image{
		Name:   name,
		Config: ocispec.ImageConfig{Cmd: []string{"/hello"}},
		Layers: [][]ociimage.Entry{{ociimage.File("hello", 0o644, []byte("I am "+name+"\n"))}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gcFullTmpfs mounts a 4 MiB tmpfs filled to 95% and unmounts it when t ends: an image file
// system above the default 85% threshold, whatever the machine's disks hold.
func gcFullTmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "holdfast-gc-test", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "ballast"), make([]byte, 4<<20*95/100), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

const gcCrashManifest = `apiVersion: v1
kind: Pod
metadata:
  name: crasher
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: crash
    image: docker.io/holdfast/busybox:test
    imagePullPolicy: Never
    command: ["sh", "-c", "echo attempt; exit 1"]
`

const gcSleeperManifest = `apiVersion: v1
kind: Pod
metadata:
  name: sleeper
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: sleep
    image: docker.io/holdfast/busybox:test
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`

// TestGarbageCollection: with the image file system above its high threshold, images no
// container uses are removed while the images in use, the pause image, the configured pinned
// image and the preloaded image stay; a crash-looping container keeps one exited attempt (its
// restart count going on), older attempts go with their logs; a deleted pod's log directory
// goes.
func TestGarbageCollection(t *testing.T) {
	preloadDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(preloadDir, "preloaded.tar"), gcImageTar(t, gcPreloaded), 0o644); err != nil {
		t.Fatal(err)
	}
	imageFS := gcFullTmpfs(t)
	e := startEnv(t, false, func(c *config.Config) {
		c.ImagePreloadDir = preloadDir
		c.GC.Period = config.D(time.Second)
		c.GC.ImageMinAge = config.D(time.Nanosecond)
		c.GC.ImageFSPath = imageFS
		c.GC.PinnedImages = []string{gcPinned}
		c.Pods.BackOffBase = config.D(time.Second)
		c.Pods.BackOffMax = config.D(4 * time.Second)
		// The pods are there from the start: the busybox image they use is never unused.
		if err := os.MkdirAll(c.ManifestDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, manifest := range map[string]string{"sleeper.yaml": gcSleeperManifest, "crasher.yaml": gcCrashManifest} {
			if err := os.WriteFile(filepath.Join(c.ManifestDir, name), []byte(manifest), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	ctx := namespaces.WithNamespace(context.Background(), e.namespace())
	for _, name := range []string{gcUnusedA, gcUnusedB, gcPinned} {
		if _, err := e.cd.Client.Import(ctx, bytes.NewReader(gcImageTar(t, name))); err != nil {
			t.Fatalf("import %s: %v", name, err)
		}
	}
	exists := func(name string) (bool, error) {
		_, err := e.cd.Client.ImageService().Get(ctx, name)
		if errdefs.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}

	// Images: the unused ones go; the log says collection then ran short of removable ones.
	testenv.Eventually(t, 60*time.Second, "unused images removed", func() error {
		for _, name := range []string{gcUnusedA, gcUnusedB} {
			if ok, err := exists(name); err != nil || ok {
				return fmt.Errorf("%s still there (%v)", name, err)
			}
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "a collection after the removals", func() error {
		log := e.agent.Log()
		i := strings.LastIndex(log, "removed unused image")
		if i < 0 || !strings.Contains(log[i:], "image collection could not free enough") {
			return fmt.Errorf("no collection logged after the last removal")
		}
		return nil
	})
	for _, name := range []string{testenv.BusyboxImage, testenv.PauseImage, gcPinned, gcPreloaded} {
		if ok, err := exists(name); err != nil || !ok {
			t.Errorf("%s was removed (%v): it is in use or pinned", name, err)
		}
	}
	log := e.agent.Log()
	for _, name := range []string{gcUnusedA, gcUnusedB} {
		if !strings.Contains(log, `msg="removed unused image" component=gc image=`+name) {
			t.Errorf("no log line for the removal of %s", name)
		}
	}

	// Containers: the crash loop restarts, and while it waits in back-off only its latest
	// attempt is left (the pod worker alone keeps the last two), with its log alone.
	var crasher status.PodView
	testenv.Eventually(t, 90*time.Second, "one exited attempt kept for the crash loop", func() error {
		pods, err := e.agent.Pods(context.Background())
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.Name == "crasher-"+node {
				crasher = p
			}
		}
		if crasher.UID == "" || len(crasher.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("no crasher status yet")
		}
		var mine []runtime.Container
		for _, c := range e.containers(t) {
			if c.PodUID == string(crasher.UID) {
				mine = append(mine, c)
			}
		}
		cs := crasher.Status.ContainerStatuses[0]
		if cs.RestartCount < 2 || len(mine) != 1 || cs.State.Waiting == nil {
			return fmt.Errorf("restartCount %d, %d containers, state %+v", cs.RestartCount, len(mine), cs.State)
		}
		logDir := filepath.Join(e.agent.Config.PodLogDir, "default_crasher-"+node+"_"+string(crasher.UID), "crash")
		entries, err := os.ReadDir(logDir)
		if err != nil {
			return err
		}
		want := strconv.Itoa(int(cs.RestartCount)) + ".log"
		if len(entries) != 1 || entries[0].Name() != want {
			var names []string
			for _, en := range entries {
				names = append(names, en.Name())
			}
			return fmt.Errorf("log files %v, want only %s", names, want)
		}
		return nil
	})

	// A deleted pod's log directory goes with its containers; the collection removes one that
	// an agent killed in the middle of a termination left behind (no pod, no container).
	crasherLogs := filepath.Join(e.agent.Config.PodLogDir, "default_crasher-"+node+"_"+string(crasher.UID))
	strayLogs := filepath.Join(e.agent.Config.PodLogDir, "default_gone-"+node+"_0b6a3d52-3f0e-4c1e-9d43-5c8f5b0e2a11")
	if err := os.MkdirAll(filepath.Join(strayLogs, "main"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(strayLogs, "main", "0.log"), []byte("2026-01-01T00:00:00Z stdout F bye\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.agent.Config.ManifestDir, "crasher.yaml")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "deleted pods' logs removed", func() error {
		for _, dir := range []string{crasherLogs, strayLogs} {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				return fmt.Errorf("%s still there (%v)", dir, err)
			}
		}
		return nil
	})
	sleeperLogs, _ := filepath.Glob(filepath.Join(e.agent.Config.PodLogDir, "default_sleeper-"+node+"_*", "sleep", "0.log"))
	if len(sleeperLogs) != 1 {
		t.Errorf("the running pod's log is gone: %v", sleeperLogs)
	}
}
