package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/offline"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// crashyUIDs remembers the UID of the crashing pod per test, read while the apiserver is up.
var crashyUIDs = map[string]string{}

func crashyUID(t *testing.T, _ *env) string { return crashyUIDs[t.Name()] }

// TestOfflineRestartAndReconnect covers a gateway losing its apiserver: the agent is killed
// and started again with the apiserver still down (every pod keeps running, no container is
// restarted, restarts and their counts go on offline), a pod deleted in the API meanwhile is
// stopped only after reconnecting, and the statuses in the API then match reality.
func TestOfflineRestartAndReconnect(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	crashy := sleeperPod("crashy", true)
	crashy.Spec.RestartPolicy = v1.RestartPolicyOnFailure
	crashy.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 1; exit 3"}
	for _, p := range []*v1.Pod{sleeperPod("keep", false), sleeperPod("doomed", true), crashy} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.waitAPIRunning(t, "keep", "doomed")
	crashyUIDs[t.Name()] = mustUID(t, e, "crashy")
	containersBefore := e.containers(t)

	// The agent dies; meanwhile the pod "doomed" is deleted and the apiserver goes away.
	e.agent.Kill()
	if err := pods.Delete(ctx, "doomed", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.cp.Stop()
	offlineFrom := time.Now().Truncate(time.Second) // events carry whole seconds
	e.agent.Start()

	e.waitLocalRunning(t, "keep", "doomed")
	for _, n := range []string{"keep", "doomed"} {
		p, _ := e.localPod(n)
		if got, want := p.Status.ContainerStatuses[0].ContainerID, containerIDOf(before[n]); got != want {
			t.Errorf("%s: container %s after the restart, was %s: it was restarted", n, got, want)
		}
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 0 {
			t.Errorf("%s: restartCount %d after an agent restart", n, rc)
		}
	}
	// Restarts go on while offline.
	var offlineRestarts int32
	testenv.Eventually(t, 60*time.Second, "crashy restarts while offline", func() error {
		p, err := e.localPod("crashy")
		if err != nil {
			return err
		}
		if offlineRestarts = p.Status.ContainerStatuses[0].RestartCount; offlineRestarts < 2 {
			return fmt.Errorf("restartCount %d", offlineRestarts)
		}
		return nil
	})
	// Offline as /metrics tells it on the local socket: since the agent started (the
	// apiserver never answered it), one offline period, crashy's statuses waiting.
	checkOfflineMetrics(t, e)
	// No authoritative delete yet: "doomed" still runs.
	if p, err := e.localPod("doomed"); err != nil || p.Status.Phase != v1.PodRunning {
		t.Fatalf("doomed stopped before the apiserver said so: %+v %v", p.Status.Phase, err)
	}
	now := e.containers(t)
	for id, c := range containersBefore {
		if _, ok := now[id]; !ok && c.PodUID != string(crashyUID(t, e)) {
			t.Errorf("container %s of pod %s vanished while offline", id, c.PodUID)
		}
	}

	// Reconnect: the deletion is applied, the statuses catch up, the events of the outage
	// arrive with their own times.
	offlineTo := time.Now()
	e.cp.Start()
	testenv.Eventually(t, 90*time.Second, "doomed stopped after reconnect", func() error {
		if _, err := e.localPod("doomed"); err == nil {
			return fmt.Errorf("agent still reports doomed")
		}
		for _, c := range e.containers(t) {
			if strings.HasPrefix(c.Name, "main") && c.PodUID == string(before["doomed"].UID) {
				return fmt.Errorf("doomed's container %s still exists", c.ID)
			}
		}
		return nil
	})
	if !strings.Contains(e.agent.Log(), "deleted in the API while the node was disconnected") {
		t.Error("the agent did not say why doomed was stopped")
	}
	testenv.Eventually(t, 60*time.Second, "API status matches the agent", func() error {
		for _, n := range []string{"keep", "crashy"} {
			local, err := e.localPod(n)
			if err != nil {
				return err
			}
			api, err := pods.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(api.Status.ContainerStatuses) == 0 {
				return fmt.Errorf("%s: no container status in the API", n)
			}
			l, a := local.Status.ContainerStatuses[0], api.Status.ContainerStatuses[0]
			if l.RestartCount != a.RestartCount || l.ContainerID != a.ContainerID {
				return fmt.Errorf("%s: API has restartCount %d container %s, agent %d %s", n, a.RestartCount, a.ContainerID, l.RestartCount, l.ContainerID)
			}
		}
		return nil
	})
	checkOnlineAgainMetrics(t, e)
	testenv.Eventually(t, 60*time.Second, "crashy's events from the outage in the API", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=crashy"})
		if err != nil {
			return err
		}
		var seen []string
		for _, ev := range evs.Items {
			// A series of events goes on after the outage (one event, its count growing):
			// it began during it.
			if at := ev.FirstTimestamp.Time; !at.Before(offlineFrom) && !at.After(offlineTo) {
				return nil
			}
			seen = append(seen, fmt.Sprintf("%s %s..%s x%d", ev.Reason, ev.FirstTimestamp.Format(time.RFC3339), ev.LastTimestamp.Format(time.RFC3339), ev.Count))
		}
		return fmt.Errorf("no event of crashy between %s and %s: %v", offlineFrom.Format(time.RFC3339), offlineTo.Format(time.RFC3339), seen)
	})
	api, _ := pods.Get(ctx, "crashy", metav1.GetOptions{})
	if rc := api.Status.ContainerStatuses[0].RestartCount; rc < offlineRestarts {
		t.Errorf("restartCount went back from %d (offline) to %d (API)", offlineRestarts, rc)
	}
	if cs := api.Status.ContainerStatuses[0]; cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.ExitCode != 3 {
		t.Errorf("crashy lastState %+v, want exit code 3", cs.LastTerminationState)
	}
	keep, _ := pods.Get(ctx, "keep", metav1.GetOptions{})
	if containerIDOf(keep) != containerIDOf(before["keep"]) {
		t.Errorf("keep's container changed: %s -> %s", containerIDOf(before["keep"]), containerIDOf(keep))
	}
}

// userPod is a pod as users write it: the API mounts the default service account token, and
// the container reads a ConfigMap volume, a Secret volume, a Secret in env, and keeps data in an
// emptyDir on disk and one in memory. Its first start stamps the disk emptyDir; every start
// appends a line to it.
func userPod(name string, hostNetwork bool) *v1.Pod {
	script := `[ -s /data/first ] || cat /proc/sys/kernel/random/uuid > /data/first; echo start >> /data/starts; ` +
		`[ -s /scratch/mem ] || echo in-memory > /scratch/mem; exec sleep 3600`
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: hostNetwork, TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers: []v1.Container{{
			Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"sh", "-c", script},
			Env: []v1.EnvVar{{Name: "PASSWORD", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
				LocalObjectReference: v1.LocalObjectReference{Name: "app-secret"}, Key: "password"}}}},
			VolumeMounts: []v1.VolumeMount{
				{Name: "config", MountPath: "/config"},
				{Name: "secret", MountPath: "/secret"},
				{Name: "data", MountPath: "/data"},
				{Name: "scratch", MountPath: "/scratch"},
			},
		}},
		Volumes: []v1.Volume{
			{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}}},
			{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "app-secret"}}},
			{Name: "data", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
		},
	}}
}

// podView is what a userPod's container sees, read from inside it.
type podView struct {
	config, secret, envSecret, token, first, starts, scratch string
}

const saTokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"

func (e *env) readPodView(containerID string) (podView, error) {
	containerID = strings.TrimPrefix(containerID, "containerd://")
	var v podView
	for _, f := range []struct {
		dst *string
		cmd string
	}{
		{&v.config, "cat /config/greeting"},
		{&v.secret, "cat /secret/password"},
		{&v.envSecret, "echo -n $PASSWORD"},
		{&v.token, "cat " + saTokenPath},
		{&v.first, "cat /data/first"},
		{&v.starts, "cat /data/starts"},
		{&v.scratch, "cat /scratch/mem 2>/dev/null; true"},
	} {
		out, err := e.exec(containerID, "sh", "-c", f.cmd)
		if err != nil {
			return v, fmt.Errorf("%s: %v (%s)", f.cmd, err, out)
		}
		*f.dst = strings.TrimSpace(out)
	}
	return v, nil
}

// TestOfflineRebootBootsFromCache: the gateway reboots for real while the apiserver is out of
// reach: tasks, network namespaces and every tmpfs (Secret and token volumes, emptyDir Memory)
// are gone. Every pod, written as users write them, runs again with its data, from the agent's
// state alone; when the apiserver answers again the token is renewed and the API converges.
// The gateway has a TPM (a software one): the state key the Secrets and tokens are sealed with
// is made at the first start and sealed by the TPM (the raw key file the test env provisions
// is removed, as an operator turning the TPM on does), and unsealed by it after the reboot.
func TestOfflineRebootBootsFromCache(t *testing.T) {
	tpm := testenv.StartSWTPM(t)
	e := startEnv(t, true, func(c *config.Config) {
		quickBackoff(c)
		c.StateKeyTPM = tpm.Socket
		if err := os.Remove(c.StateKeyFile); err != nil {
			t.Fatal(err)
		}
	})
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	publishRootCA(t, e, "default")
	if _, err := core.ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config"},
		Data: map[string]string{"greeting": "hello"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret"},
		Data: map[string][]byte{"password": []byte("s3cret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names := []string{"net", "host"}
	for _, p := range []*v1.Pod{userPod("net", false), userPod("host", true)} {
		if _, err := core.Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := e.waitAPIRunning(t, names...)
	before := map[string]podView{}
	for _, n := range names {
		testenv.Eventually(t, 30*time.Second, n+" wrote its data", func() error {
			v, err := e.readPodView(containerIDOf(running[n]))
			if err != nil {
				return err
			}
			if v.first == "" || v.token == "" || v.scratch != "in-memory" {
				return fmt.Errorf("%+v", v)
			}
			before[n] = v
			return nil
		})
		if v := before[n]; v.config != "hello" || v.secret != "s3cret" || v.envSecret != "s3cret" {
			t.Fatalf("%s before the reboot: %+v", n, v)
		}
	}

	if b, err := os.ReadFile(e.agent.Config.StateKeyFile); err != nil || len(b) <= offline.KeySize {
		t.Fatalf("the state key file (%d bytes, %v) is not a key sealed by the TPM", len(b), err)
	}
	e.cp.Stop()
	testenv.Reboot(e.cd, e.agent)
	e.agent.Start()

	e.waitLocalRunning(t, names...)
	after := map[string]status.PodView{}
	for _, n := range names {
		testenv.Eventually(t, 60*time.Second, n+" runs again with its data", func() error {
			p, err := e.localPod(n)
			if err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.State.Running == nil || cs.ContainerID == containerIDOf(running[n]) {
				return fmt.Errorf("container %s state %+v", cs.ContainerID, cs.State)
			}
			v, err := e.readPodView(strings.TrimPrefix(cs.ContainerID, "containerd://"))
			if err != nil {
				return err
			}
			want := before[n]
			want.starts = "start\nstart"
			want.scratch = "in-memory" // written again: the one of the first boot is gone
			if v != want {
				return fmt.Errorf("inside the container after the reboot:\n got %+v\nwant %+v", v, want)
			}
			after[n] = p
			return nil
		})
		if p := after[n]; p.Status.ContainerStatuses[0].RestartCount != running[n].Status.ContainerStatuses[0].RestartCount+1 {
			t.Errorf("%s: restartCount %d after the reboot, was %d", n, p.Status.ContainerStatuses[0].RestartCount,
				running[n].Status.ContainerStatuses[0].RestartCount)
		}
		if n == "net" && after[n].Status.PodIP == "" {
			t.Errorf("pod network not set up again after the reboot: %+v", after[n].Status)
		}
	}

	// The apiserver answers again: the token is renewed, the API shows what runs.
	e.cp.Start()
	for _, n := range names {
		id := strings.TrimPrefix(after[n].Status.ContainerStatuses[0].ContainerID, "containerd://")
		testenv.Eventually(t, 120*time.Second, n+"'s token renewed after reconnect", func() error {
			out, err := e.exec(id, "cat", saTokenPath)
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) == before[n].token {
				return fmt.Errorf("still the token from before the reboot")
			}
			return nil
		})
		testenv.Eventually(t, 60*time.Second, n+"'s status in the API", func() error {
			p, err := core.Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			a, l := p.Status.ContainerStatuses, after[n].Status.ContainerStatuses
			if len(a) == 0 || a[0].ContainerID != l[0].ContainerID || a[0].RestartCount != l[0].RestartCount || a[0].State.Running == nil {
				return fmt.Errorf("API has %+v, agent %+v", a, l)
			}
			return nil
		})
	}
}

// TestCorruptStateDatabase: a truncated and then a garbage state file never stop the boot;
// the running containers are kept, and the node condition says what happened.
func TestCorruptStateDatabase(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, sleeperPod("steady", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := containerIDOf(e.waitAPIRunning(t, "steady")["steady"])
	dbPath := filepath.Join(e.agent.Config.StateDir, "state.db")
	for _, damage := range []struct {
		name string
		do   func() error
	}{
		{"truncated", func() error {
			st, err := os.Stat(dbPath)
			if err != nil {
				return err
			}
			return os.Truncate(dbPath, st.Size()/2)
		}},
		{"garbage", func() error { return os.WriteFile(dbPath, []byte(strings.Repeat("not a database ", 2000)), 0o600) }},
	} {
		t.Run(damage.name, func(t *testing.T) {
			e.agent.Kill()
			if err := damage.do(); err != nil {
				t.Fatal(err)
			}
			movedBefore, _ := filepath.Glob(dbPath + ".corrupt-*")
			e.agent.Start()
			var movedTo string
			testenv.Eventually(t, 30*time.Second, "damaged file moved aside", func() error {
				moved, _ := filepath.Glob(dbPath + ".corrupt-*")
				if len(moved) != len(movedBefore)+1 {
					return fmt.Errorf("%d files moved aside, want %d", len(moved), len(movedBefore)+1)
				}
				movedTo = moved[len(moved)-1]
				return nil
			})
			testenv.Eventually(t, 60*time.Second, "node condition reports the rebuilt state", func() error {
				n, err := e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
				if err != nil {
					return err
				}
				for _, c := range n.Status.Conditions {
					if c.Type == "HoldfastStateRecovered" && c.Status == v1.ConditionTrue && strings.Contains(c.Message, movedTo) {
						return nil
					}
				}
				return fmt.Errorf("conditions %+v", n.Status.Conditions)
			})
			p := e.waitAPIRunning(t, "steady")["steady"]
			if containerIDOf(p) != before || p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("container changed or restarted: %s (was %s), restarts %d", containerIDOf(p), before, p.Status.ContainerStatuses[0].RestartCount)
			}
		})
	}
}

// TestStaticPodMirror: a static pod gets a mirror pod whose status tracks it; deleting the
// mirror (as kubectl does) re-creates it; editing the file updates both; removing the file
// while the agent is down removes both once it is back.
func TestStaticPodMirror(t *testing.T) {
	e := startEnv(t, true, quickBackoff)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	path := filepath.Join(e.agent.Config.ManifestDir, "sensor.yaml")
	write := func(version string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(fmt.Sprintf(staticPod, version)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("v1")
	name := "sensor-" + node
	mirror := func() (*v1.Pod, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if p.Annotations[manifest.MirrorAnnotation] == "" {
			return nil, fmt.Errorf("not a mirror pod: %v", p.Annotations)
		}
		if p.Status.Phase != v1.PodRunning {
			return nil, fmt.Errorf("mirror phase %q", p.Status.Phase)
		}
		return p, nil
	}
	var first *v1.Pod
	testenv.Eventually(t, 90*time.Second, "mirror pod Running", func() (err error) { first, err = mirror(); return err })
	if len(first.OwnerReferences) != 1 || first.OwnerReferences[0].Kind != "Node" {
		t.Errorf("mirror owner %+v", first.OwnerReferences)
	}

	// Deleted as kubectl deletes it, with the pod's grace period: nothing runs a mirror to
	// report its end, so the node deletes it for good and makes it again (before, it stayed
	// Terminating).
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var second *v1.Pod
	testenv.Eventually(t, 60*time.Second, "mirror re-created", func() error {
		p, err := mirror()
		if err != nil {
			return err
		}
		if p.UID == first.UID {
			return fmt.Errorf("still the first mirror (deletionTimestamp %v)", p.DeletionTimestamp)
		}
		if p.DeletionTimestamp != nil {
			return fmt.Errorf("the new mirror is being deleted")
		}
		second = p
		return nil
	})
	if containerIDOf(second) != containerIDOf(first) {
		t.Errorf("deleting the mirror restarted the static pod: %s -> %s", containerIDOf(first), containerIDOf(second))
	}

	write("v2")
	testenv.Eventually(t, 90*time.Second, "mirror follows the edited manifest", func() error {
		p, err := mirror()
		if err != nil {
			return err
		}
		if p.Annotations[manifest.MirrorAnnotation] == second.Annotations[manifest.MirrorAnnotation] {
			return fmt.Errorf("mirror still of the old manifest")
		}
		if !strings.Contains(strings.Join(p.Spec.Containers[0].Command, " "), "reading v2") {
			return fmt.Errorf("mirror spec %v", p.Spec.Containers[0].Command)
		}
		return nil
	})

	// The file removed while the agent is down: at its next start nothing runs the static pod,
	// and its mirror is an orphan to delete (before, it stayed in the API for good).
	e.agent.Stop()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	e.agent.Start()
	testenv.Eventually(t, 60*time.Second, "mirror removed with the file", func() error {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("mirror still there (%v)", err)
	})
}
