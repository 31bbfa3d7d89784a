package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// pullPod is a pod of one container running image, pulled per policy.
func pullPod(name, image string, policy v1.PullPolicy) *v1.Pod {
	pod := sleeperPod(name, true)
	pod.Spec.Containers[0].Image = image
	pod.Spec.Containers[0].ImagePullPolicy = policy
	return pod
}

// startPullEnv starts a registry with the test images pushed, and an agent (with the API)
// whose registry host configuration names it.
func startPullEnv(t *testing.T, opts testenv.RegistryOptions, tune func(*config.Config)) (*env, *testenv.Registry) {
	testenv.RequireIntegration(t)
	reg := testenv.StartRegistry(t, opts)
	reg.PushTestImages(context.Background())
	hostsDir := filepath.Join(t.TempDir(), "certs.d")
	reg.WriteHostsDir(hostsDir)
	e := startEnv(t, true, func(c *config.Config) {
		c.Containerd.RegistryConfigPath = hostsDir
		if tune != nil {
			tune(c)
		}
	})
	return e, reg
}

// waitContainerRunning waits for the pod's only container to run and returns its status.
func (e *env) waitContainerRunning(t *testing.T, name string, timeout time.Duration) v1.ContainerStatus {
	t.Helper()
	var cs v1.ContainerStatus
	testenv.Eventually(t, timeout, "pod "+name+" running", func() error {
		p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		cs = p.Status.ContainerStatuses[0]
		return nil
	})
	return cs
}

// TestPullFromRegistry: an image that is not present is pulled from a real registry
// (IfNotPresent), over plain HTTP and over TLS with the registry's CA named in its
// hosts.toml, and the container reports the registry's manifest digest as its imageID.
func TestPullFromRegistry(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts testenv.RegistryOptions
	}{
		{"http", testenv.RegistryOptions{}},
		{"tls", testenv.RegistryOptions{TLS: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := testenv.StartRegistry(t, tc.opts)
			digests := reg.PushTestImages(context.Background())
			hostsDir := filepath.Join(t.TempDir(), "certs.d")
			reg.WriteHostsDir(hostsDir)
			e := startEnv(t, true, func(c *config.Config) { c.Containerd.RegistryConfigPath = hostsDir })
			image, _ := reg.TestImageRefs()
			if _, err := e.cp.Admin.CoreV1().Pods("default").Create(context.Background(), pullPod("pulled", image, v1.PullIfNotPresent), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cs := e.waitContainerRunning(t, "pulled", 90*time.Second)
			want := reg.Host + "/holdfast/busybox@" + digests[image].String()
			if cs.ImageID != want || cs.Image != image {
				t.Errorf("image %q imageID %q, want %q and %q", cs.Image, cs.ImageID, image, want)
			}
		})
	}
}

// dockerConfigJSON is a docker config.json granting user:pass on host.
func dockerConfigJSON(host, user, pass string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, auth))
}

// waitingReason returns the waiting reason and message of the pod's only container.
func (e *env) waitingReason(name string) (string, string, error) {
	p, err := e.cp.Admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
		return "", "", fmt.Errorf("not waiting: %+v", p.Status.ContainerStatuses)
	}
	w := p.Status.ContainerStatuses[0].State.Waiting
	return w.Reason, w.Message, nil
}

// TestImagePullSecrets: from a registry with TLS and basic auth, a pod pulls with its
// imagePullSecrets (dockerconfigjson and dockercfg, read with the node's identity); a pod
// without one fails with ErrImagePull until the node's registryCredentialsFile grants access.
func TestImagePullSecrets(t *testing.T) {
	credsFile := filepath.Join(t.TempDir(), "registry-auth.json")
	e, reg := startPullEnv(t, testenv.RegistryOptions{TLS: true, Username: "gw", Password: "s3cret"}, func(c *config.Config) {
		c.Containerd.RegistryCredentialsFile = credsFile // absent until the end
		c.Pods.ImagePullBackOffBase = config.D(time.Second)
		c.Pods.ImagePullBackOffMax = config.D(2 * time.Second)
	})
	ctx := context.Background()
	core := e.cp.Admin.CoreV1()
	image, _ := reg.TestImageRefs()
	legacy := fmt.Sprintf(`{%q: {"username": "gw", "password": "s3cret"}}`, reg.Host)
	for _, s := range []*v1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: v1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{v1.DockerConfigJsonKey: dockerConfigJSON(reg.Host, "gw", "s3cret")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "legacycred"}, Type: v1.SecretTypeDockercfg,
			Data: map[string][]byte{v1.DockerConfigKey: []byte(legacy)}},
	} {
		if _, err := core.Secrets("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The pod without a secret pulls an image of its own: once present, an image needs no
	// credentials, so sharing one with the others would let it run unchallenged.
	other := reg.Ref("holdfast/busybox:nosecret")
	reg.Push(ctx, other, testenv.BusyboxVariant(t, "nosecret"))
	for name, secret := range map[string]string{"with-json": "regcred", "with-cfg": "legacycred", "without": ""} {
		pod := pullPod(name, image, v1.PullIfNotPresent)
		if secret == "" {
			pod.Spec.Containers[0].Image = other
		}
		if secret != "" {
			pod.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: secret}}
		}
		if _, err := core.Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 90*time.Second, "pod without pull secret refused", func() error {
		reason, msg, err := e.waitingReason("without")
		if err != nil {
			return err
		}
		if reason != "ErrImagePull" && reason != "ImagePullBackOff" {
			return fmt.Errorf("waiting %s: %s", reason, msg)
		}
		return nil
	})
	e.waitContainerRunning(t, "with-json", 90*time.Second)
	e.waitContainerRunning(t, "with-cfg", 90*time.Second)
	if err := os.WriteFile(credsFile, dockerConfigJSON(reg.Host, "gw", "s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.waitContainerRunning(t, "without", 60*time.Second)
}

// TestImagePullBackOff: a pull that fails reports ErrImagePull, then ImagePullBackOff with
// kubelet's message, and is tried again only after a back-off that doubles up to its cap,
// with kubelet's events.
func TestImagePullBackOff(t *testing.T) {
	const base, maxDelay = 2 * time.Second, 8 * time.Second
	e, reg := startPullEnv(t, testenv.RegistryOptions{}, func(c *config.Config) {
		c.Pods.ImagePullBackOffBase = config.D(base)
		c.Pods.ImagePullBackOffMax = config.D(maxDelay)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := e.cp.Admin.CoreV1().Pods("default")
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=unpullable"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	image := reg.Ref("holdfast/busybox:no-such-tag")
	if _, err := pods.Create(ctx, pullPod("unpullable", image, v1.PullIfNotPresent), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	delay := func(n int) time.Duration { return min(base<<n, maxDelay) } // after failure n (0-based)
	wantBackOff := fmt.Sprintf("Back-off pulling image %q", image)
	var failures []time.Time // when each ErrImagePull was seen
	last, backOffs := "", 0
	for len(failures) < 5 {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			t.Fatalf("saw %d failed pulls, %d back-offs before the deadline", len(failures), backOffs)
		}
		p, ok := ev.Object.(*v1.Pod)
		if !ok || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			continue
		}
		wt := p.Status.ContainerStatuses[0].State.Waiting
		if wt.Reason == last {
			continue
		}
		last = wt.Reason
		switch wt.Reason {
		case "ErrImagePull":
			failures = append(failures, time.Now())
		case "ImagePullBackOff":
			backOffs++
			if wt.Message != wantBackOff {
				t.Errorf("ImagePullBackOff message %q, want %q", wt.Message, wantBackOff)
			}
		}
	}
	if backOffs < len(failures)-1 {
		t.Errorf("%d failed pulls but only %d ImagePullBackOff periods between them", len(failures), backOffs)
	}
	// Seen through the watch, so each failure is seen late by the time its status takes to be
	// written; the next one cannot come before the back-off less that lateness.
	const lateness = time.Second
	for n := 0; n+1 < len(failures); n++ {
		if gap := failures[n+1].Sub(failures[n]); gap < delay(n)-lateness {
			t.Errorf("pull %d came %s after pull %d failed, before its back-off of %s", n+2, gap, n+1, delay(n))
		}
	}
	evs, err := e.cp.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=unpullable"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ev := range evs.Items {
		seen[ev.Type+"/"+ev.Reason+"/"+ev.Message] = true
	}
	for _, want := range []string{"Normal/BackOff/" + wantBackOff, "Warning/Failed/Error: ErrImagePull", "Warning/Failed/Error: ImagePullBackOff"} {
		if !seen[want] {
			t.Errorf("no event %q in %v", want, seen)
		}
	}
}

// TestPullAlwaysWithRegistryOutOfReach: with imagePullPolicy Always (the API default for
// :latest), a registry that serves a new digest under the tag is pulled from; a registry out
// of reach does not stop a pod whose image is present: it runs, with a Warning event.
func TestPullAlwaysWithRegistryOutOfReach(t *testing.T) {
	e, reg := startPullEnv(t, testenv.RegistryOptions{}, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	image := reg.Ref("holdfast/busybox:latest")
	first := reg.Push(ctx, image, testenv.BusyboxVariant(t, "one"))
	// As a user writes it: no pull policy, so the API defaults it to Always for :latest.
	pod := pullPod("fresh-1", image, "")
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.Spec.Containers[0].ImagePullPolicy; got != v1.PullAlways {
		t.Fatalf("API defaulted imagePullPolicy to %q, want Always", got)
	}
	if cs := e.waitContainerRunning(t, "fresh-1", 90*time.Second); !strings.HasSuffix(cs.ImageID, "@"+first.String()) {
		t.Errorf("imageID %q, want digest %s", cs.ImageID, first)
	}

	second := reg.Push(ctx, image, testenv.BusyboxVariant(t, "two"))
	if _, err := pods.Create(ctx, pullPod("fresh-2", image, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if cs := e.waitContainerRunning(t, "fresh-2", 90*time.Second); !strings.HasSuffix(cs.ImageID, "@"+second.String()) {
		t.Errorf("under Always, a changed tag was not pulled: imageID %q, want digest %s", cs.ImageID, second)
	}

	reg.Stop()
	if _, err := pods.Create(ctx, pullPod("offline", image, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if cs := e.waitContainerRunning(t, "offline", 90*time.Second); !strings.HasSuffix(cs.ImageID, "@"+second.String()) {
		t.Errorf("imageID %q, want the present digest %s", cs.ImageID, second)
	}
	testenv.Eventually(t, 30*time.Second, "Warning event naming the cached image", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=offline"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == v1.EventTypeWarning && ev.Reason == "PullFailedUsingCachedImage" && strings.Contains(ev.Message, second.String()) {
				return nil
			}
		}
		return fmt.Errorf("events: %+v", evs.Items)
	})
}

// TestPullStalledMidBlob: a registry whose answer stops half-way through a blob (the link
// drops packets without a reset, or a proxy hangs) fails the pull after
// containerd.imagePullProgressTimeout with a message that says so, instead of holding the pod
// in its pull forever: containerd's registry client bounds the wait for an answer's headers
// (30 s), nothing bounds its body. Once the answers flow again, the back-off's next pull runs
// the pod. The registry is real; the link to it is a proxy on loopback that can stall.
func TestPullStalledMidBlob(t *testing.T) {
	if testenv.RuntimeUnderTest() == config.RuntimeCRI {
		// skip-ok: behaviour of the containerd backend alone
		t.Skip("on the CRI backend pulls are the runtime's, and so is the timeout of a stalled one " +
			"(containerd's image_pull_progress_timeout, 1.7 and later; Debian 12's 1.6 has none): " +
			"containerd.imagePullProgressTimeout is the containerd backend's")
	}
	var stalling atomic.Bool
	stalling.Store(true)
	release := make(chan struct{})
	e, reg := startPullEnv(t, testenv.RegistryOptions{}, func(c *config.Config) {
		c.Containerd.ImagePullProgressTimeout = config.D(3 * time.Second)
		c.Pods.ImagePullBackOffBase = config.D(time.Second)
		c.Pods.ImagePullBackOffMax = config.D(2 * time.Second)
	})
	link := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, reg.URL()+r.URL.RequestURI(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		maps.Copy(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && stalling.Load() && resp.ContentLength > 1 {
			io.CopyN(w, resp.Body, resp.ContentLength/2)
			w.(http.Flusher).Flush()
			select { // half a blob, then nothing, until the test ends
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(link.Close)
	t.Cleanup(func() { close(release) }) // before the link's Close, which waits for its handlers
	// The pulls go through the link: the registry's host configuration names it as the server.
	hostsFile := filepath.Join(e.agent.Config.Containerd.RegistryConfigPath, reg.Host, "hosts.toml")
	if err := os.WriteFile(hostsFile, []byte(fmt.Sprintf("server = %q\n", link.URL)), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	// An image of its own: the test images' blobs are in containerd already (preloaded), and
	// a pull fetches only what is missing.
	image := reg.Ref("holdfast/busybox:stalled")
	reg.Push(ctx, image, testenv.BusyboxVariant(t, "stalled"))
	if _, err := e.cp.Admin.CoreV1().Pods("default").Create(ctx, pullPod("stalled", image, v1.PullIfNotPresent), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Failed to pull image %q: ", image)
	testenv.Eventually(t, 2*time.Minute, "a Failed event for the stalled pull", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=stalled"})
		if err != nil {
			return err
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == "Failed" && strings.HasPrefix(ev.Message, want) {
				if !strings.Contains(ev.Message, "the registry sent nothing for") {
					t.Fatalf("the stalled pull failed with %q, want it to say the registry sent nothing", ev.Message)
				}
				return nil
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return fmt.Errorf("events %q", seen)
	})
	stalling.Store(false)
	e.waitContainerRunning(t, "stalled", 2*time.Minute)
}
