package volumes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/offline"
)

// newFakeAPI is an in-memory apiserver holding the objects a test pod references, answering
// TokenRequests with a token that names the pod it is bound to. Tests of this package's own
// logic use it; the integration tests run the real apiserver.
func newFakeAPI(tokens *atomic.Int64) *fake.Clientset {
	client := fake.NewClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cfg"}, Data: map[string]string{"greeting": "hello", "other": "x"}},
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "CA PEM"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "creds"}, Data: map[string][]byte{"password": []byte("s3cret")}},
	)
	client.PrependReactor("create", "serviceaccounts", func(action k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(k8stesting.CreateAction)
		if !ok || action.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := ca.GetObject().(*authenticationv1.TokenRequest)
		n := tokens.Add(1)
		ref := tr.Spec.BoundObjectRef
		tr = tr.DeepCopy()
		tr.Status.Token = fmt.Sprintf("token-%d-for-%s/%s", n, ref.Kind, ref.Name)
		tr.Status.ExpirationTimestamp = metav1.NewTime(time.Now().Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second))
		return true, tr, nil
	})
	return client
}

func testPod(hostDir string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web", Labels: map[string]string{"app": "demo", "tier": "edge"}},
		Spec: v1.PodSpec{
			NodeName: "gw", ServiceAccountName: "default",
			Containers: []v1.Container{{
				Name:      "app",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}},
				VolumeMounts: []v1.VolumeMount{
					{Name: "scratch", MountPath: "/scratch"},
					{Name: "scratch", MountPath: "/scratch/logs/web", SubPathExpr: "$(POD_NAME)/logs"},
					{Name: "host", MountPath: "/host", ReadOnly: true},
					{Name: "config", MountPath: "/config"},
					{Name: "config", MountPath: "/etc/app", SubPath: "conf"},
					{Name: "creds", MountPath: "/creds"},
					{Name: "info", MountPath: "/info"},
					{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
					{Name: "ram", MountPath: "/ram"},
				},
			}},
			Volumes: []v1.Volume{
				{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
				{Name: "ram", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("8Mi"))}}},
				{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: hostDir, Type: ptr.To(v1.HostPathDirectoryOrCreate)}}},
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
					LocalObjectReference: v1.LocalObjectReference{Name: "cfg"},
					Items:                []v1.KeyToPath{{Key: "greeting", Path: "conf/greeting", Mode: ptr.To[int32](0o600)}},
				}}},
				{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds", DefaultMode: ptr.To[int32](0o400)}}},
				{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
					{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
					{Path: "mem", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
					{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.cpu"}},
				}}}},
				{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o644), Sources: []v1.VolumeProjection{
					{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
					{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
				}}}},
				{Name: "maybe", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}}},
			},
		},
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

func mountOptions(t *testing.T, dir string) (fsType, superOptions string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(dir)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == real {
			for i, x := range f {
				if x == "-" && i+3 < len(f) {
					fsType, superOptions = f[i+1], f[i+3]
				}
			}
		}
	}
	return fsType, superOptions
}

func drainEvents(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestSetupMountsTeardown prepares every supported kind of volume for a pod, checks the files,
// modes, memory backing and mounts a container gets, refreshes content, keeps it when the API
// fails, and tears everything down from the pod UID alone, as after an agent restart.
func TestSetupMountsTeardown(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	podsDir := filepath.Join(base, "pods")
	hostDir := filepath.Join(base, "host/data")
	var tokens atomic.Int64
	client := newFakeAPI(&tokens)
	rec := record.NewFakeRecorder(100)
	allocatable := v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("2Gi")}
	m := NewManager(podsDir, kubetest.Wrap(client), rec, nil, Options{Allocatable: func() v1.ResourceList { return allocatable }})
	pod := testPod(hostDir)
	t.Cleanup(func() { unmountUnder(podsDir) })

	pv, err := m.Setup(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	vol := func(kind, name string) string { return filepath.Join(podsDir, "uid-web", "volumes", kind, name) }

	// Content, modes, and where each volume lives.
	for _, c := range []struct {
		path, want string
		mode       os.FileMode
	}{
		{vol(dirConfigMap, "config") + "/conf/greeting", "hello", 0o600},
		{vol(dirSecret, "creds") + "/password", "s3cret", 0o400},
		{vol(dirDownwardAPI, "info") + "/labels", "app=\"demo\"\ntier=\"edge\"", 0o644},
		{vol(dirDownwardAPI, "info") + "/mem", "64", 0o644},
		{vol(dirDownwardAPI, "info") + "/cpu", "4", 0o644}, // no cpu limit: the node's allocatable
		{vol(dirProjected, "kube-api-access") + "/token", "token-1-for-Pod/web", 0o644},
		{vol(dirProjected, "kube-api-access") + "/ca.crt", "CA PEM", 0o644},
		{vol(dirProjected, "kube-api-access") + "/namespace", "default", 0o644},
	} {
		if got := readFile(t, c.path); got != c.want {
			t.Errorf("%s = %q, want %q", c.path, got, c.want)
		}
		if fi, err := os.Stat(c.path); err != nil || fi.Mode().Perm() != c.mode {
			t.Errorf("%s mode %v, want %v (%v)", c.path, fi.Mode().Perm(), c.mode, err)
		}
	}
	if entries, err := os.ReadDir(vol(dirConfigMap, "maybe")); err != nil || slices.ContainsFunc(entries, func(e os.DirEntry) bool { return !strings.HasPrefix(e.Name(), "..") }) {
		t.Errorf("optional missing configMap: %v, %v", entries, err)
	}
	if fi, err := os.Stat(hostDir); err != nil || !fi.IsDir() {
		t.Errorf("DirectoryOrCreate did not create %s: %v", hostDir, err)
	}
	for dir, wantTmpfs := range map[string]bool{
		vol(dirSecret, "creds"): true, vol(dirDownwardAPI, "info"): true, vol(dirProjected, "kube-api-access"): true,
		vol(dirEmptyDir, "ram"): true, vol(dirConfigMap, "config"): false, vol(dirEmptyDir, "scratch"): false,
	} {
		if isTmpfs(dir) != wantTmpfs {
			t.Errorf("%s: tmpfs %v, want %v", dir, !wantTmpfs, wantTmpfs)
		}
	}
	// sizeLimit 8Mi is below the pod's 64Mi limit: it is the size.
	if _, opts := mountOptions(t, vol(dirEmptyDir, "ram")); !strings.Contains(opts, "size=8192k") {
		t.Errorf("memory emptyDir options %q, want size=8192k", opts)
	}
	// A memory emptyDir is a tmpfs's root as kubelet mounts it: world-writable and sticky.
	if fi, err := os.Stat(vol(dirEmptyDir, "ram")); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("memory emptyDir mode %v (%v), want world-writable and sticky", fi.Mode(), err)
	}
	// A secret volume without sizeLimit gets the pod's memory limit.
	if _, opts := mountOptions(t, vol(dirSecret, "creds")); !strings.Contains(opts, "size=65536k") {
		t.Errorf("secret tmpfs options %q, want size=65536k", opts)
	}

	// Mounts: sorted parent first, read-only where due, subPaths bound outside the volume.
	mounts, err := pv.Mounts(&pod.Spec.Containers[0], map[string]string{"POD_NAME": "web"})
	if err != nil {
		t.Fatal(err)
	}
	byDest := map[string]specs.Mount{}
	for i, mnt := range mounts {
		byDest[mnt.Destination] = mnt
		if i > 0 && depth(mounts[i-1].Destination) > depth(mnt.Destination) {
			t.Errorf("mounts not sorted by depth: %s before %s", mounts[i-1].Destination, mnt.Destination)
		}
	}
	for dest, wantRO := range map[string]bool{
		"/scratch": false, "/scratch/logs/web": false, "/host": true, "/config": true, "/etc/app": true,
		"/creds": true, "/info": true, "/var/run/secrets/kubernetes.io/serviceaccount": true, "/ram": false,
	} {
		mnt, ok := byDest[dest]
		if !ok {
			t.Errorf("no mount at %s", dest)
			continue
		}
		if ro := slices.Contains(mnt.Options, "ro"); ro != wantRO || mnt.Type != "bind" || !slices.Contains(mnt.Options, "rbind") {
			t.Errorf("mount %s: %+v, want read-only %v", dest, mnt, wantRO)
		}
	}
	if src := byDest["/etc/app"].Source; !strings.Contains(src, "/volume-subpaths/config/app/") || readFile(t, filepath.Join(src, "greeting")) != "hello" {
		t.Errorf("subPath mount source %s", src)
	}
	if fi, err := os.Stat(vol(dirEmptyDir, "scratch") + "/web/logs"); err != nil || !fi.IsDir() {
		t.Errorf("subPathExpr directory not created: %v", err)
	}
	if src := byDest["/host"].Source; src != hostDir {
		t.Errorf("hostPath source %s, want %s", src, hostDir)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "keep"), []byte("host data"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Setup again: nothing mounted twice, the token reused.
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{vol(dirSecret, "creds"), vol(dirEmptyDir, "ram"), vol(dirProjected, "kube-api-access")} {
		if n := countMounts(t, d); n != 1 {
			t.Errorf("%d mounts on %s after a second Setup", n, d)
		}
	}
	if n := tokens.Load(); n != 1 {
		t.Errorf("%d token requests, want 1 (reused until 80%% of its life)", n)
	}

	// A changed ConfigMap reaches the file on resync; a changed label too.
	cm, _ := client.CoreV1().ConfigMaps("default").Get(ctx, "cfg", metav1.GetOptions{})
	cm.Data["greeting"] = "bonjour"
	if _, err := client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	relabelled := pod.DeepCopy()
	relabelled.Labels["tier"] = "core"
	if _, err := m.Setup(ctx, relabelled); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, vol(dirConfigMap, "config")+"/conf/greeting"); got != "bonjour" {
		t.Errorf("greeting after update = %q", got)
	}
	if got := readFile(t, vol(dirDownwardAPI, "info")+"/labels"); got != "app=\"demo\"\ntier=\"core\"" {
		t.Errorf("labels after relabel = %q", got)
	}

	// The apiserver fails: the secret volume keeps what it has and says so.
	drainEvents(rec)
	client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	m.resync(ctx)
	if got := readFile(t, vol(dirSecret, "creds")+"/password"); got != "s3cret" {
		t.Errorf("password after a failed refresh = %q", got)
	}
	if evs := drainEvents(rec); len(evs) != 1 || !strings.Contains(evs[0], "FailedMount") || !strings.Contains(evs[0], "keeps its previous content") {
		t.Errorf("events after a failed refresh: %q", evs)
	}
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Errorf("Setup with content already written must not fail while the API is down: %v", err)
	}

	// An agent restart: a new manager knows the pod only by its UID, and removes it all.
	fresh := NewManager(podsDir, nil, nil, nil, Options{})
	if got := fresh.Known(); !slices.Equal(got, []string{"uid-web"}) {
		t.Errorf("Known() = %v", got)
	}
	if err := fresh.Teardown(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-web"}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), filepath.Join(podsDir, "uid-web")) {
		t.Errorf("mounts left under the pod after teardown")
	}
	for _, sub := range []string{"volumes", "volume-subpaths"} {
		if _, err := os.Stat(filepath.Join(podsDir, "uid-web", sub)); !os.IsNotExist(err) {
			t.Errorf("%s left after teardown (%v)", sub, err)
		}
	}
	if got := readFile(t, filepath.Join(hostDir, "keep")); got != "host data" {
		t.Errorf("host data after teardown = %q", got)
	}
	// Teardown is idempotent.
	if err := fresh.Teardown(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-web"}}); err != nil {
		t.Fatal(err)
	}
}

// TestSetupFailures: what cannot be prepared fails Setup with an error naming the volume in
// kubelet's words, records FailedMount, and leaves nothing behind after Teardown.
func TestSetupFailures(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	var tokens atomic.Int64
	client := newFakeAPI(&tokens)
	pod := func(uid string, annotations map[string]string, vols ...v1.Volume) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p-" + uid, UID: types.UID(uid), Annotations: annotations},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}, Volumes: vols}}
	}
	secretVol := v1.Volume{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "nope"}}}
	static := map[string]string{"kubernetes.io/config.source": "file"}
	for _, tc := range []struct {
		name       string
		standalone bool
		pod        *v1.Pod
		wantErr    string
		is         error
	}{
		{name: "missing secret", pod: pod("a", nil, secretVol), wantErr: `MountVolume.SetUp failed for volume "creds" : secret "nope" not found`},
		{name: "missing key", pod: pod("b", nil, v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}, Items: []v1.KeyToPath{{Key: "absent", Path: "x"}}}}}),
			wantErr: "configmap references non-existent config key: absent"},
		{name: "unsupported type", pod: pod("c", nil, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}}),
			wantErr: `volume "data" : persistentVolumeClaim volumes are not supported by holdfast`},
		{name: "static pod with a configMap", pod: pod("d", static, v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}),
			is: ErrStaticPod},
		{name: "standalone with a secret", standalone: true, pod: pod("e", static, v1.Volume{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds"}}}),
			is: ErrNoAPIServer},
		{name: "standalone with a token", standalone: true, pod: pod("f", static, v1.Volume{Name: "t", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}}}}}}),
			is: ErrNoAPIServer},
		{name: "hostPath type", pod: pod("g", nil, v1.Volume{Name: "dev", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/dev/null", Type: ptr.To(v1.HostPathDirectory)}}}),
			wantErr: "hostPath type check failed: /dev/null is not a directory, it's a CharDevice"},
		{name: "standalone static pod with what it may use", standalone: true, pod: pod("h", static,
			v1.Volume{Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/dev/null"}}},
			v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podsDir := t.TempDir()
			rec := record.NewFakeRecorder(10)
			var m *Manager
			if tc.standalone {
				m = NewManager(podsDir, nil, rec, nil, Options{})
			} else {
				m = NewManager(podsDir, kubetest.Wrap(client), rec, nil, Options{})
			}
			_, err := m.Setup(ctx, tc.pod)
			switch {
			case tc.wantErr == "" && tc.is == nil:
				if err != nil {
					t.Fatal(err)
				}
			case tc.is != nil:
				if !errors.Is(err, tc.is) {
					t.Fatalf("err = %v, want %v", err, tc.is)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
			}
			if err != nil {
				evs := drainEvents(rec)
				if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning FailedMount MountVolume.SetUp failed for volume") {
					t.Errorf("events %q, want one FailedMount", evs)
				}
				// Retrying soon does not record the same event again.
				m.Setup(ctx, tc.pod)
				if evs := drainEvents(rec); len(evs) != 0 {
					t.Errorf("repeated events %q", evs)
				}
			}
			if err := m.Teardown(ctx, tc.pod); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), podsDir) {
				t.Errorf("mounts left under %s", podsDir)
			}
		})
	}
}

// TestRunFollowsObjects: with Run running, a ConfigMap change reaches the volume through the
// object's watch well before the resync period, and Run returns once its watches have stopped.
func TestRunFollowsObjects(t *testing.T) {
	requireRoot(t)
	var tokens atomic.Int64
	client := newFakeAPI(&tokens)
	podsDir := t.TempDir()
	m := NewManager(podsDir, kubetest.Wrap(client), nil, nil, Options{ResyncPeriod: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
		unmountUnder(podsDir)
	}()

	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-w"}, Spec: v1.PodSpec{
		Containers: []v1.Container{{Name: "c", Env: []v1.EnvVar{{Name: "P", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: "creds"}, Key: "password"}}}}}},
		Volumes: []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}},
	}}
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// The watches start with Setup once Run runs, or when Run starts if Setup came first (the
	// goroutine above may not have begun yet).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.mu.Lock()
		watched := len(m.watches)
		m.mu.Unlock()
		if watched == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d objects watched, want 2 (the volume's ConfigMap and the env's Secret)", watched)
		}
	}
	cm, _ := client.CoreV1().ConfigMaps("default").Get(ctx, "cfg", metav1.GetOptions{})
	cm.Data["greeting"] = "salut"
	if _, err := client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(podsDir, "uid-w/volumes", dirConfigMap, "cfg/greeting")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(path); string(b) == "salut" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("greeting not updated through the watch")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Reads for env come from the watch's store too.
	s, err := m.Secret(ctx, pod, "creds")
	if err != nil || string(s.Data["password"]) != "s3cret" {
		t.Errorf("Secret() = %v, %v", s, err)
	}
	if err := m.Teardown(ctx, pod); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	watched := len(m.watches)
	m.mu.Unlock()
	if watched != 0 {
		t.Errorf("%d objects still watched after the only pod referencing them went", watched)
	}
}

var _ Cache = offline.Store(nil)

// TestOfflineRestartFromCache: an agent that restarts while the apiserver is out of reach
// projects ConfigMaps from the copies its Cache kept, and Secrets only when told to keep them.
func TestOfflineRestartFromCache(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	store := offline.NewMemStore(time.Now)
	store.SetKey(testStateKey(t, 1))
	var tokens atomic.Int64
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-off"}, Spec: v1.PodSpec{
		Containers: []v1.Container{{Name: "c"}},
		Volumes: []v1.Volume{
			{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
			{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds"}}},
		},
	}}
	onlineDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(onlineDir) })
	online := NewManager(onlineDir, kubetest.Wrap(newFakeAPI(&tokens)), nil, nil, Options{Cache: store, PersistSecrets: true})
	if _, err := online.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}

	down := newFakeAPI(&tokens)
	var calls atomic.Int64
	down.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls.Add(1)
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: no route to host")
	})
	for _, persist := range []bool{false, true} {
		t.Run(fmt.Sprintf("PersistSecrets=%v", persist), func(t *testing.T) {
			podsDir := t.TempDir() // a reboot: nothing on disk or tmpfs
			t.Cleanup(func() { unmountUnder(podsDir) })
			m := NewManager(podsDir, kubetest.Wrap(down), nil, nil, Options{Cache: store, PersistSecrets: persist})
			_, err := m.Setup(ctx, pod)
			if got := readFile(t, filepath.Join(podsDir, "uid-off/volumes", dirConfigMap, "cfg/greeting")); got != "hello" {
				t.Errorf("greeting from the cache = %q", got)
			}
			if persist && err != nil {
				t.Errorf("Setup with the secret kept: %v", err)
			}
			if !persist && (err == nil || !strings.Contains(err.Error(), `volume "creds"`) || !strings.Contains(err.Error(), "no route to host")) {
				t.Errorf("Setup without the secret kept: %v", err)
			}
			// The next syncs do not wait on the unreachable apiserver again and again.
			before := calls.Load()
			m.Setup(ctx, pod)
			m.Setup(ctx, pod)
			if n := calls.Load() - before; n != 0 {
				t.Errorf("%d requests to an apiserver found unreachable a moment ago", n)
			}
		})
	}
}

// TestOfflineBootDoesNotWaitForWatches: after a reboot with the apiserver out of reach, a
// pod's ConfigMap comes from the kept copy as soon as the new watch's list has failed, not
// after the wait a watch gets for its first list: with 30 pods in an offline boot, that wait
// was most of each pod's start. (syncWait is made far longer than the test's deadline, so a
// lookup that waits for it fails the test.)
func TestOfflineBootDoesNotWaitForWatches(t *testing.T) {
	requireRoot(t)
	defer func(d time.Duration) { syncWait = d }(syncWait)
	syncWait = time.Hour
	store := offline.NewMemStore(time.Now)
	store.SetKey(testStateKey(t, 1))
	var tokens atomic.Int64
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-boot"}, Spec: v1.PodSpec{
		Containers: []v1.Container{{Name: "c"}},
		Volumes:    []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}},
	}}
	onlineDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(onlineDir) })
	if _, err := NewManager(onlineDir, kubetest.Wrap(newFakeAPI(&tokens)), nil, nil, Options{Cache: store}).Setup(context.Background(), pod); err != nil {
		t.Fatal(err)
	}

	down := newFakeAPI(&tokens)
	down.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	})
	podsDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(podsDir) })
	m := NewManager(podsDir, kubetest.Wrap(down), nil, nil, Options{Cache: store})
	runManager(t, m)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("Setup returned only when its context ended: it waited for the first list of a watch whose list had failed")
	}
	m.mu.Lock()
	watched := len(m.watches)
	m.mu.Unlock()
	if watched != 1 {
		t.Errorf("%d watches, want the ConfigMap's: the lookup did not go through a watch", watched)
	}
	if got := readFile(t, filepath.Join(podsDir, "uid-boot/volumes", dirConfigMap, "cfg/greeting")); got != "hello" {
		t.Errorf("greeting from the kept copy = %q", got)
	}
}

func testStateKey(t *testing.T, b byte) *offline.Key {
	t.Helper()
	k, err := offline.NewKey(bytes.Repeat([]byte{b}, offline.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestTokenAcrossOfflineReboot: the service account token a pod had is kept (encrypted) in the
// Cache; after a reboot with the apiserver out of reach it is mounted again, even past its
// expiry, and renewed as soon as the apiserver answers. A token kept under another state key
// counts as missing, and the log says why.
func TestTokenAcrossOfflineReboot(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	store := offline.NewMemStore(time.Now)
	store.SetKey(testStateKey(t, 1))
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-tok"}, Spec: v1.PodSpec{
		ServiceAccountName: "default",
		Containers:         []v1.Container{{Name: "c"}},
		Volumes: []v1.Volume{{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
		}}}}},
	}}
	if err := store.PutPod(offline.SourceAPI, pod); err != nil {
		t.Fatal(err)
	}
	var tokens atomic.Int64
	var down atomic.Bool
	api := newFakeAPI(&tokens)
	api.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	tokenFile := func(dir string) string {
		return readFile(t, filepath.Join(dir, "uid-tok/volumes", dirProjected, "kube-api-access/token"))
	}
	onlineDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(onlineDir) })
	online := NewManager(onlineDir, kubetest.Wrap(api), nil, nil, Options{Cache: store, PersistSecrets: true})
	if _, err := online.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	first := tokenFile(onlineDir)
	if first != "token-1-for-Pod/w" {
		t.Fatalf("token %q", first)
	}

	// Reboot offline, two hours later: the token has expired, it is mounted all the same.
	down.Store(true)
	now := time.Now().Add(2 * time.Hour)
	clock := func() time.Time { return now }
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	podsDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(podsDir) })
	m := NewManager(podsDir, kubetest.Wrap(api), nil, log, Options{Cache: store, PersistSecrets: true, Now: clock})
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatalf("Setup offline with a kept token: %v", err)
	}
	if got := tokenFile(podsDir); got != first {
		t.Errorf("token after an offline reboot = %q, want the kept %q", got, first)
	}
	if n := tokens.Load(); n != 1 {
		t.Errorf("%d tokens issued", n)
	}

	// The apiserver answers: the next resync renews it, and the new one is kept.
	down.Store(false)
	now = now.Add(apiRetryInterval)
	m.resync(ctx)
	if got := tokenFile(podsDir); got != "token-2-for-Pod/w" {
		t.Errorf("token after reconnect = %q, want a renewed one", got)
	}
	kept, err := store.GetToken("uid-tok", "default/3607/")
	if err != nil || kept.Token != "token-2-for-Pod/w" {
		t.Errorf("kept token %+v, %v", kept, err)
	}

	// Without PersistSecrets, nothing is kept or restored.
	plainDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(plainDir) })
	down.Store(true)
	plain := NewManager(plainDir, kubetest.Wrap(api), nil, nil, Options{Cache: store, Now: clock})
	if _, err := plain.Setup(ctx, pod); err == nil || !strings.Contains(err.Error(), "failed to fetch token") {
		t.Errorf("Setup offline without kept tokens: %v", err)
	}

	// Another state key: the kept token is missing, and the log says why.
	store.SetKey(testStateKey(t, 2))
	otherDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(otherDir) })
	other := NewManager(otherDir, kubetest.Wrap(api), nil, log, Options{Cache: store, PersistSecrets: true, Now: clock})
	if _, err := other.Setup(ctx, pod); err == nil {
		t.Error("Setup with a token sealed under another key succeeded")
	}
	if !strings.Contains(logs.String(), "encrypted with another state key") {
		t.Errorf("no log line about the key change:\n%s", logs.String())
	}
}

// TestOfflineBootBehindAClosingLink: after a reboot, an apiserver behind something that accepts
// connections and closes them at once (a load balancer, a tunnel, a relay with nothing behind
// it: the requests fail with EOF, which client-go retries for a GET, a second apart) must not
// hold a pod's volumes: its ConfigMap and its token come from the kept copies within
// keptCopyWait, not after the watch's wait and ten retries of each request. The apiserver is a
// real HTTP server and the client a real clientset. (syncWait is made far longer than the
// test's deadline, so a lookup that waits for it fails the test.)
func TestOfflineBootBehindAClosingLink(t *testing.T) {
	defer func(d, k time.Duration) { syncWait, keptCopyWait = d, k }(syncWait, keptCopyWait)
	syncWait, keptCopyWait = time.Hour, 500*time.Millisecond
	f := newClosingLinkBoot(t)
	f.setupFromKeptCopies(t, NewManager(f.podsDir, f.down, nil, nil, Options{Cache: f.store, PersistSecrets: true}))
	if f.requests.Load() == 0 {
		t.Error("no request reached the closing apiserver: the test did not test the link")
	}
}

// TestOfflineBootWhenTheNodeKnowsTheAPIIsDown: when the node's own heartbeat already found the
// apiserver out of reach (APIDown), no lookup that has a kept copy waits on it at all, not even
// keptCopyWait: the first pods of an offline boot start as fast as the later ones. (keptCopyWait
// is made far longer than the test's deadline.)
func TestOfflineBootWhenTheNodeKnowsTheAPIIsDown(t *testing.T) {
	defer func(d, k time.Duration) { syncWait, keptCopyWait = d, k }(syncWait, keptCopyWait)
	syncWait, keptCopyWait = time.Hour, time.Hour
	f := newClosingLinkBoot(t)
	f.setupFromKeptCopies(t, NewManager(f.podsDir, f.down, nil, nil, Options{Cache: f.store, PersistSecrets: true, APIDown: func() bool { return true }}))
}

// closingLinkBoot is a gateway after a reboot: a pod whose ConfigMap and token were kept in
// the Cache while the apiserver answered, and a client for an apiserver that now closes every
// connection it gets.
type closingLinkBoot struct {
	pod      *v1.Pod
	store    *offline.MemStore
	down     kube.Interface
	requests *atomic.Int64 // requests that reached the closing apiserver
	podsDir  string
}

func newClosingLinkBoot(t *testing.T) *closingLinkBoot {
	t.Helper()
	requireRoot(t)
	store := offline.NewMemStore(time.Now)
	store.SetKey(testStateKey(t, 1))
	var tokens atomic.Int64
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: "uid-relay"}, Spec: v1.PodSpec{
		ServiceAccountName: "default",
		Containers:         []v1.Container{{Name: "c"}},
		Volumes: []v1.Volume{
			{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}},
			{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			}}}},
		},
	}}
	if err := store.PutPod(offline.SourceAPI, pod); err != nil { // tokens are kept for stored pods
		t.Fatal(err)
	}
	onlineDir := t.TempDir()
	t.Cleanup(func() { unmountUnder(onlineDir) })
	if _, err := NewManager(onlineDir, kubetest.Wrap(newFakeAPI(&tokens)), nil, nil, Options{Cache: store, PersistSecrets: true}).Setup(context.Background(), pod); err != nil {
		t.Fatal(err)
	}

	f := &closingLinkBoot{pod: pod, store: store, requests: new(atomic.Int64), podsDir: t.TempDir()}
	closing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(closing.Close)
	down, err := kube.NewForConfig(&rest.Config{Host: closing.URL})
	if err != nil {
		t.Fatal(err)
	}
	f.down = down
	t.Cleanup(func() { unmountUnder(f.podsDir) })
	return f
}

// setupFromKeptCopies runs m and sets the pod up with a deadline no wait on the apiserver fits
// in, and checks its volumes hold the kept copies.
func (f *closingLinkBoot) setupFromKeptCopies(t *testing.T, m *Manager) {
	t.Helper()
	runManager(t, m)
	// Ten retries of a GET a second apart, or the watch's list, take 10 s: far past this.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if _, err := m.Setup(ctx, f.pod); err != nil {
		t.Fatalf("Setup: %v (after %d requests to the closing apiserver)", err, f.requests.Load())
	}
	if ctx.Err() != nil {
		t.Fatal("Setup returned only when its context ended: it waited on an apiserver that closes every connection")
	}
	if got := readFile(t, filepath.Join(f.podsDir, "uid-relay/volumes", dirConfigMap, "cfg/greeting")); got != "hello" {
		t.Errorf("greeting from the kept copy = %q", got)
	}
	if got := readFile(t, filepath.Join(f.podsDir, "uid-relay/volumes", dirProjected, "kube-api-access/token")); got != "token-1-for-Pod/w" {
		t.Errorf("token from the kept copy = %q", got)
	}
}

// runManager runs m until the test ends and returns once Run has started (watches need it).
func runManager(t *testing.T, m *Manager) {
	t.Helper()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	for running := false; !running; {
		m.mu.Lock()
		running = m.runCtx != nil
		m.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
}
