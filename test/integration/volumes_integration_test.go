package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// readReport parses the key=value lines a test container writes, "" if the file is not there
// yet.
func readReport(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// mountOf returns the file system type of what is mounted exactly at dir in this (the
// agent's) mount namespace, "" if nothing is.
func mountOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return ""
	}
	fsType := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == real {
			for i, x := range f {
				if x == "-" && i+1 < len(f) {
					fsType = f[i+1]
				}
			}
		}
	}
	return fsType
}

// procMountType is the file system type in a /proc/mounts line ("tmpfs /secret tmpfs ro,...").
func procMountType(line string) string {
	if f := strings.Fields(line); len(f) >= 3 {
		return f[2]
	}
	return ""
}

// decodeJWT returns the claims of a JWT, failing the test if it is not one.
func decodeJWT(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q is not a JWT (%d parts)", token, len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("token payload: %v", err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatalf("token claims: %v", err)
	}
	return claims
}

const volumesWriterScript = `
cp /var/run/secrets/kubernetes.io/serviceaccount/ca.crt /report/ca.crt
echo from-writer > /shared/msg
while true; do
  {
    echo "greeting=$(cat /config/greeting)"
    echo "conf=$(cat /config/app.conf)"
    echo "password=$(cat /secret/password)"
    echo "env_greeting=$GREETING"
    echo "env_password=$PASSWORD"
    echo "envfrom_greeting=$CFG_greeting"
    echo "envfrom_apikey=$SEC_apikey"
    echo "name=$(cat /podinfo/name)"
    echo "labels=$(cat /podinfo/labels)"
    echo "mem=$(cat /podinfo/mem_limit)"
    echo "namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
    echo "token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)"
    echo "mount_secret=$(grep ' /secret ' /proc/mounts)"
    echo "mount_config=$(grep ' /config ' /proc/mounts)"
    echo "mount_shared=$(grep ' /shared ' /proc/mounts)"
    if touch /config/probe 2>/dev/null; then echo config_mode=rw; else echo config_mode=ro; fi
    if touch /shared/probe 2>/dev/null; then echo shared_mode=rw; else echo shared_mode=ro; fi
  } > /report/writer.tmp && mv /report/writer.tmp /report/writer.txt
  sleep 0.3
done`

// TestVolumesEndToEnd: through the real apiserver, containerd and the holdfast binary, a pod
// gets an emptyDir shared by its two containers, a hostPath, a configMap and a secret volume
// and env from both, a downwardAPI volume and the service account volume the API injects;
// each value is proved by what the containers write into the hostPath. The secret is on
// tmpfs, the configMap is not, and both are read-only. A ConfigMap update reaches the running
// container's file (not its env) within seconds. Deleting the pod unmounts and removes every
// volume and leaves the hostPath alone.
func TestVolumesEndToEnd(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	publishRootCA(t, e, "default")
	if _, err := core.ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config"},
		Data: map[string]string{"greeting": "hello", "app.conf": "mode=edge\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret"},
		Data: map[string][]byte{"password": []byte("s3cret"), "apikey": []byte("k3y")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report") // DirectoryOrCreate: the agent makes it
	dirOrCreate := v1.HostPathDirectoryOrCreate
	busybox := func(name, script string) v1.Container {
		return v1.Container{Name: name, Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", script}}
	}
	writer := busybox("writer", volumesWriterScript)
	writer.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	writer.VolumeMounts = []v1.VolumeMount{
		{Name: "shared", MountPath: "/shared"},
		{Name: "report", MountPath: "/report"},
		{Name: "config", MountPath: "/config"},
		{Name: "secret", MountPath: "/secret"},
		{Name: "podinfo", MountPath: "/podinfo"},
	}
	writer.Env = []v1.EnvVar{
		{Name: "GREETING", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}, Key: "greeting"}}},
		{Name: "PASSWORD", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "app-secret"}, Key: "password"}}},
	}
	writer.EnvFrom = []v1.EnvFromSource{
		{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}},
		{Prefix: "SEC_", SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-secret"}}},
	}
	reader := busybox("reader", "until [ -s /shared/msg ]; do sleep 0.2; done; cp /shared/msg /report/reader.tmp && mv /report/reader.tmp /report/reader.txt; exec sleep 3600")
	reader.VolumeMounts = []v1.VolumeMount{{Name: "shared", MountPath: "/shared"}, {Name: "report", MountPath: "/report"}}

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vols", Labels: map[string]string{"app": "demo"}},
		Spec: v1.PodSpec{
			NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
			// automountServiceAccountToken left unset: the API injects kube-api-access-*.
			Containers: []v1.Container{writer, reader},
			Volumes: []v1.Volume{
				{Name: "shared", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
				{Name: "report", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: report, Type: &dirOrCreate}}},
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}}},
				{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "app-secret"}}},
				{Name: "podinfo", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
					{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}},
					{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
					{Path: "mem_limit", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "writer", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
				}}}},
			},
		},
	}
	created, err := core.Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	injected := ""
	for _, v := range created.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil {
			injected = v.Name
		}
	}
	if injected == "" {
		t.Fatalf("the API injected no service account volume: %+v", created.Spec.Volumes)
	}

	var rep map[string]string
	testenv.Eventually(t, 90*time.Second, "the writer's report", func() error {
		var err error
		if rep, err = readReport(filepath.Join(report, "writer.txt")); err != nil {
			return fmt.Errorf("%v (pod status: %s)", err, podStatusSummary(ctx, e, "vols"))
		}
		if rep["token"] == "" {
			return fmt.Errorf("report incomplete: %v", rep)
		}
		return nil
	})
	for k, want := range map[string]string{
		"greeting": "hello", "conf": "mode=edge", "password": "s3cret",
		"env_greeting": "hello", "env_password": "s3cret", "envfrom_greeting": "hello", "envfrom_apikey": "k3y",
		"name": "vols", "labels": `app="demo"`, "mem": "64", "namespace": "default",
		"config_mode": "ro", "shared_mode": "rw",
	} {
		if rep[k] != want {
			t.Errorf("%s = %q, want %q", k, rep[k], want)
		}
	}
	if got := procMountType(rep["mount_secret"]); got != "tmpfs" {
		t.Errorf("secret volume in the container is on %q, want tmpfs (%q)", got, rep["mount_secret"])
	}
	for _, k := range []string{"mount_config", "mount_shared"} {
		if got := procMountType(rep[k]); got == "" || got == "tmpfs" {
			t.Errorf("%s: on %q, want the disk (%q)", k, got, rep[k])
		}
	}
	claims := decodeJWT(t, rep["token"])
	if claims["sub"] != "system:serviceaccount:default:default" {
		t.Errorf("token subject %v", claims["sub"])
	}
	if k8s, _ := claims["kubernetes.io"].(map[string]any); k8s == nil || fmt.Sprint(k8s["pod"]) != fmt.Sprintf("map[name:vols uid:%s]", created.UID) {
		t.Errorf("token not bound to the pod: %v", claims["kubernetes.io"])
	}
	if b, err := os.ReadFile(filepath.Join(report, "ca.crt")); err != nil || string(b) != string(e.cp.CAData()) {
		t.Errorf("ca.crt in the container is not the cluster CA (%v)", err)
	}
	testenv.Eventually(t, 30*time.Second, "the reader saw the writer's file through the emptyDir", func() error {
		b, err := os.ReadFile(filepath.Join(report, "reader.txt"))
		if err != nil || strings.TrimSpace(string(b)) != "from-writer" {
			return fmt.Errorf("reader.txt %q, %v", b, err)
		}
		return nil
	})

	// On the node: the secret and the token are on tmpfs mounts of their own, the configMap
	// on the disk, all written through ..data.
	volDir := filepath.Join(e.agent.Config.StateDir, "pods", string(created.UID), "volumes")
	for dir, want := range map[string]string{
		"kubernetes.io~secret/secret":         "tmpfs",
		"kubernetes.io~projected/" + injected: "tmpfs",
		"kubernetes.io~downward-api/podinfo":  "tmpfs",
		"kubernetes.io~configmap/config":      "",
		"kubernetes.io~empty-dir/shared":      "",
	} {
		if got := mountOf(t, filepath.Join(volDir, dir)); got != want {
			t.Errorf("%s: mounted %q, want %q", dir, got, want)
		}
	}
	if _, err := os.Readlink(filepath.Join(volDir, "kubernetes.io~configmap/config/..data")); err != nil {
		t.Errorf("configMap volume not written through ..data: %v", err)
	}

	// A ConfigMap update reaches the file in the running container, not its env.
	cm, err := core.ConfigMaps("default").Get(ctx, "app-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["greeting"] = "bonjour"
	if _, err := core.ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	updated := time.Now()
	testenv.Eventually(t, 30*time.Second, "the updated greeting in the container", func() error {
		r, err := readReport(filepath.Join(report, "writer.txt"))
		if err != nil || r["greeting"] != "bonjour" {
			return fmt.Errorf("greeting %q (%v)", r["greeting"], err)
		}
		if r["env_greeting"] != "hello" {
			t.Errorf("env changed under a running container: %q", r["env_greeting"])
		}
		return nil
	})
	t.Logf("ConfigMap update visible in the container after %v", time.Since(updated).Round(10*time.Millisecond))

	// Deleting the pod tears every volume down; the hostPath keeps its files.
	if err := core.Pods("default").Delete(ctx, "vols", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "pod deleted by the agent", func() error {
		_, err := core.Pods("default").Get(ctx, "vols", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	podDir := filepath.Join(e.agent.Config.StateDir, "pods", string(created.UID))
	realPodDir, _ := filepath.EvalSymlinks(filepath.Dir(podDir))
	if left := mountsUnder(t, filepath.Join(realPodDir, string(created.UID))); len(left) > 0 {
		t.Errorf("mounts left after the pod's deletion: %v", left)
	}
	if _, err := os.Stat(podDir); !os.IsNotExist(err) {
		t.Errorf("pod directory left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(report, "reader.txt")); err != nil {
		t.Errorf("hostPath content lost with the pod: %v", err)
	}
}

// TestVolumeMissingSecret: a pod whose secret volume names a Secret that does not exist stays
// ContainerCreating with a FailedMount event naming it, the other pod runs, and once the Secret
// is created the pod starts.
func TestVolumeMissingSecret(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	mk := func(name string, vols []v1.Volume, mounts []v1.VolumeMount) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
			NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
				Command: []string{"sleep", "3600"}, VolumeMounts: mounts}},
			Volumes: vols,
		}}
	}
	missing := mk("vol-missing",
		[]v1.Volume{{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "late-secret"}}}},
		[]v1.VolumeMount{{Name: "creds", MountPath: "/creds"}})
	for _, p := range []*v1.Pod{missing, mk("fine", nil, nil)} {
		if _, err := core.Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	volRunning(t, e, "fine")
	testenv.Eventually(t, 60*time.Second, "a FailedMount event naming the secret", func() error {
		evs, err := core.Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=vol-missing"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "FailedMount" && ev.Type == v1.EventTypeWarning &&
				strings.Contains(ev.Message, `MountVolume.SetUp failed for volume "creds" : secret "late-secret" not found`) {
				return nil
			}
		}
		return fmt.Errorf("%d events, none FailedMount for the secret", len(evs.Items))
	})
	p, err := core.Pods("default").Get(ctx, "vol-missing", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodPending || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
		p.Status.ContainerStatuses[0].State.Waiting.Reason != "ContainerCreating" {
		t.Errorf("pod with a missing secret volume: %s", podStatusSummary(ctx, e, "vol-missing"))
	}

	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "late-secret"},
		Data: map[string][]byte{"password": []byte("x")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	volRunning(t, e, "vol-missing")
}

// TestVolumesOrphanCleanup: a pod deleted for good while the agent is down (kill -9) has its
// tmpfs and subPath mounts and its volume directories removed after the agent restarts.
func TestVolumesOrphanCleanup(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	if _, err := core.Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Data: map[string][]byte{"k": []byte("v")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orphan"}, Spec: v1.PodSpec{
		NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"},
			VolumeMounts: []v1.VolumeMount{
				{Name: "s", MountPath: "/s"},
				{Name: "ram", MountPath: "/ram"},
				{Name: "scratch", MountPath: "/data/logs", SubPath: "logs"},
			}}},
		Volumes: []v1.Volume{
			{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}},
			{Name: "ram", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
			{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		},
	}}
	created, err := core.Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	volRunning(t, e, "orphan")
	podsDir, err := filepath.EvalSymlinks(filepath.Join(e.agent.Config.StateDir, "pods"))
	if err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(podsDir, string(created.UID))
	if n := len(mountsUnder(t, podDir)); n != 3 { // secret tmpfs, memory emptyDir, subPath bind
		t.Fatalf("%d mounts under the pod, want 3: %v", n, mountsUnder(t, podDir))
	}

	e.agent.Kill()
	if err := core.Pods("default").Delete(ctx, "orphan", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.agent.Start()
	testenv.Eventually(t, 90*time.Second, "orphan's volumes gone", func() error {
		if left := mountsUnder(t, podDir); len(left) > 0 {
			return fmt.Errorf("mounts left: %v", left)
		}
		if _, err := os.Stat(podDir); !os.IsNotExist(err) {
			return fmt.Errorf("pod directory still there (%v)", err)
		}
		return nil
	})
	for id, c := range e.containers(t) {
		if c.PodUID == string(created.UID) {
			t.Errorf("container %s of the orphan left", id)
		}
	}
}

// TestStaticPodVolumes: with no apiserver, a static pod gets its emptyDir, hostPath and
// downwardAPI volumes; a static pod with a configMap volume stays ContainerCreating and the
// agent says why.
func TestStaticPodVolumes(t *testing.T) {
	e := startEnv(t, false, nil)
	ctx := context.Background()
	report := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		tmp := filepath.Join(e.agent.Config.ManifestDir, "."+name)
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(e.agent.Config.ManifestDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("logger.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: logger, labels: {role: sensor}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo tmp > /tmp/x/f && { echo \"name=$(cat /info/name)\"; echo \"labels=$(cat /info/labels)\"; echo \"tmp=$(cat /tmp/x/f)\"; } > /out/r.tmp && mv /out/r.tmp /out/report.txt; exec sleep 3600"]
    volumeMounts:
    - {name: scratch, mountPath: /tmp/x}
    - {name: out, mountPath: /out}
    - {name: info, mountPath: /info}
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: out, hostPath: {path: %s, type: Directory}}
  - name: info
    downwardAPI:
      items:
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
`, testenv.BusyboxImage, report))
	write("needs-api.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: needs-api}
spec:
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    volumeMounts: [{name: cfg, mountPath: /cfg}]
  volumes:
  - {name: cfg, configMap: {name: settings}}
`, testenv.BusyboxImage))

	testenv.Eventually(t, 60*time.Second, "the static pod's report", func() error {
		r, err := readReport(filepath.Join(report, "report.txt"))
		if err != nil {
			return err
		}
		for k, want := range map[string]string{"name": "logger-" + node, "labels": `role="sensor"`, "tmp": "tmp"} {
			if r[k] != want {
				return fmt.Errorf("%s = %q, want %q", k, r[k], want)
			}
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "the agent says why needs-api cannot start", func() error {
		log := e.agent.Log()
		if !strings.Contains(log, `MountVolume.SetUp failed for volume \"cfg\"`) && !strings.Contains(log, `MountVolume.SetUp failed for volume "cfg"`) {
			return fmt.Errorf("no FailedMount for cfg in the agent log")
		}
		if !strings.Contains(log, "without an apiserver") {
			return fmt.Errorf("the reason is not in the agent log")
		}
		return nil
	})
	pods, err := e.agent.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Name == "needs-api-"+node {
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
				p.Status.ContainerStatuses[0].State.Waiting.Reason != "ContainerCreating" {
				t.Errorf("needs-api status %+v", p.Status.ContainerStatuses)
			}
		}
	}
}
