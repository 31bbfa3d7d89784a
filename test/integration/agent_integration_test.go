package integration

import (
	"context"
	"fmt"
	"net"
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

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestPodEndToEnd: a two-container pod with its own network, bound to the node through the
// API, runs; the containers reach each other on localhost; the status says so; deleting the
// pod removes its containers, its network namespace and the pod object.
func TestPodEndToEnd(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pair"},
		Spec: v1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](3),
			// No controller-manager publishes kube-root-ca.crt here; service account volumes
			// are covered by the volume tests.
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []v1.Container{
				{
					Name: "server", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
					Command: []string{"sh", "-c", "mkdir -p /www && echo hello-from-$(POD_NAME) > /www/index.html && exec httpd -f -p 8080 -h /www"},
					Env:     []v1.EnvVar{{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				},
				{
					Name: "client", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever,
					Command: []string{"sh", "-c", "until wget -q -O - http://127.0.0.1:8080/; do sleep 0.2; done; exec sleep 3600"},
				},
			},
		},
	}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var running *v1.Pod
	testenv.Eventually(t, 60*time.Second, "pod Running with both containers ready", func() error {
		p, err := pods.Get(ctx, "pair", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("phase %q, statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready || cs.State.Running == nil {
				return fmt.Errorf("container %s not ready: %+v", cs.Name, cs.State)
			}
		}
		running = p
		return nil
	})

	st := running.Status
	if ip := net.ParseIP(st.PodIP); ip == nil || !e.cni.Subnet.Contains(ip) {
		t.Errorf("podIP %q is not in the CNI subnet %s", st.PodIP, e.cni.Subnet)
	}
	if len(st.PodIPs) == 0 || st.PodIPs[0].IP != st.PodIP {
		t.Errorf("podIPs %v do not start with podIP %s", st.PodIPs, st.PodIP)
	}
	if st.StartTime == nil || st.StartTime.IsZero() || st.HostIP == "" {
		t.Errorf("startTime %v hostIP %q", st.StartTime, st.HostIP)
	}
	if st.QOSClass != v1.PodQOSBestEffort {
		t.Errorf("qosClass %q, want BestEffort", st.QOSClass)
	}
	for _, ct := range []v1.PodConditionType{v1.PodScheduled, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		if !hasCondition(st, ct, v1.ConditionTrue) {
			t.Errorf("condition %s not True in %+v", ct, st.Conditions)
		}
	}
	inRuntime := e.containers(t)
	for _, cs := range st.ContainerStatuses {
		id := strings.TrimPrefix(cs.ContainerID, "containerd://")
		if c, ok := inRuntime[id]; !ok || c.Name != cs.Name || c.PodUID != string(created.UID) {
			t.Errorf("containerID %q of %s is not that container in containerd (%+v)", cs.ContainerID, cs.Name, c)
		}
		// The image's repository digest; from the CRI, the runtime's image reference, which is
		// the image's ID for one imported without a repository digest (as the kubelet shows).
		wantImageID := strings.Contains(cs.ImageID, "@sha256:") || e.cd.CRI && strings.HasPrefix(cs.ImageID, "sha256:")
		if !wantImageID || cs.Image != testenv.BusyboxImage || cs.Started == nil || !*cs.Started {
			t.Errorf("container %s: image %q imageID %q started %v", cs.Name, cs.Image, cs.ImageID, cs.Started)
		}
	}

	// The client container fetched the server's page over the pod's loopback.
	logPath := filepath.Join(e.agent.Config.PodLogDir, "default_pair_"+string(created.UID), "client", "0.log")
	testenv.Eventually(t, 30*time.Second, "client reached server over localhost", func() error {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "hello-from-pair") {
			return fmt.Errorf("client log: %q", b)
		}
		return nil
	})
	netns := e.podNetNS(t, created.UID)
	if _, err := os.Stat(netns); err != nil {
		t.Fatalf("pod network namespace: %v", err)
	}

	// Delete: containers stopped (SIGKILL after the 3s grace: httpd and sleep ignore SIGTERM
	// as PID 1), removed, network gone, and the agent deletes the object for good.
	if err := pods.Delete(ctx, "pair", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "pod object deleted by the agent", func() error {
		_, err := pods.Get(ctx, "pair", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	if left := e.containers(t); len(left) != 0 {
		t.Errorf("containers left after delete: %v", left)
	}
	if _, err := os.Stat(netns); !os.IsNotExist(err) {
		t.Errorf("network namespace %s still exists (%v)", netns, err)
	}
}

// TestNodeRegistrationAndLease: the node registers Ready with measured capacity and nodeInfo,
// and its Lease is renewed at the configured interval.
func TestNodeRegistrationAndLease(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) {
		c.NodeStatus.LeaseRenewInterval = config.D(time.Second)
		c.NodeStatus.LeaseDuration = config.D(5 * time.Second)
		c.NodeStatus.UpdateFrequency = config.D(time.Second)
	})
	ctx := context.Background()
	var n *v1.Node
	testenv.Eventually(t, 60*time.Second, "node Ready", func() error {
		var err error
		if n, err = e.cp.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", n.Status.Conditions)
	})
	for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, v1.ResourcePods} {
		q, ok := n.Status.Capacity[r]
		if !ok || q.IsZero() {
			t.Errorf("capacity %s = %v", r, q)
		}
		if _, ok := n.Status.Allocatable[r]; !ok {
			t.Errorf("allocatable %s missing", r)
		}
	}
	if pods := n.Status.Capacity[v1.ResourcePods]; pods.Value() != 110 {
		t.Errorf("pods capacity %v, want 110", pods.Value())
	}
	info := n.Status.NodeInfo
	if !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://1.") || info.KubeletVersion == "" || info.KernelVersion == "" || info.OSImage == "" || info.Architecture == "" {
		t.Errorf("nodeInfo incomplete: %+v", info)
	}
	for _, ct := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		found := false
		for _, c := range n.Status.Conditions {
			found = found || c.Type == ct
		}
		if !found {
			t.Errorf("condition %s missing", ct)
		}
	}
	if len(n.Status.Addresses) < 2 {
		t.Errorf("addresses %v", n.Status.Addresses)
	}

	leases := e.cp.Admin.CoordinationV1().Leases("kube-node-lease")
	var first time.Time
	testenv.Eventually(t, 30*time.Second, "lease exists", func() error {
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 5 {
			return fmt.Errorf("lease spec %+v", l.Spec)
		}
		if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != n.UID {
			return fmt.Errorf("lease not owned by the node: %+v", l.OwnerReferences)
		}
		first = l.Spec.RenewTime.Time
		return nil
	})
	renewals := 0
	last := first
	testenv.Eventually(t, 30*time.Second, "lease renewed three times", func() error {
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if rt := l.Spec.RenewTime.Time; rt.After(last) {
			renewals++
			last = rt
		}
		if renewals < 3 {
			return fmt.Errorf("%d renewals so far", renewals)
		}
		return nil
	})
	// Three renewals at a 1s interval: well under the 5s lease, far from the 10s default.
	if span := last.Sub(first); span > 8*time.Second {
		t.Errorf("three renewals took %s with a 1s interval", span)
	}
	// The renewals send the Lease without its managedFields (fewer bytes on the uplink): the
	// apiserver keeps them, holdfast still named as the manager of the fields it sets.
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	managed := false
	for _, m := range l.ManagedFields {
		managed = managed || (strings.HasPrefix(m.Manager, "holdfast") && m.FieldsV1 != nil && strings.Contains(string(m.FieldsV1.Raw), "renewTime"))
	}
	if !managed {
		t.Errorf("the Lease's managedFields lost holdfast's entry after renewals: %+v", l.ManagedFields)
	}
}

// TestUnrunnablePodReportsReason: a pod whose image is absent with pullPolicy Never says so
// in its status, the way kubelet names it, and the other pod on the node runs undisturbed.
func TestUnrunnablePodReportsReason(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	mk := func(name, image string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
			NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []v1.Container{{Name: "c", Image: image, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}},
		}}
	}
	for _, p := range []*v1.Pod{mk("good", testenv.BusyboxImage), mk("missing", "docker.io/holdfast/absent:1")} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "missing image reported as ErrImageNeverPull", func() error {
		p, err := pods.Get(ctx, "missing", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return fmt.Errorf("status %+v", p.Status)
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if w.Reason != "ErrImageNeverPull" || !strings.Contains(w.Message, "docker.io/holdfast/absent:1") {
			return fmt.Errorf("waiting %+v", w)
		}
		if p.Status.Phase != v1.PodPending {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	testenv.Eventually(t, 60*time.Second, "good pod running", func() error {
		p, err := pods.Get(ctx, "good", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "a Failed event for the missing image", func() error {
		evs, err := e.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=missing"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "Failed" && strings.Contains(ev.Message, "ErrImageNeverPull") {
				return nil
			}
		}
		return fmt.Errorf("events %d", len(evs.Items))
	})
}

// TestNodeAdmission: a pod that does not fit the node's allocatable cpu, or whose nodeSelector
// does not match, ends Failed with kubelet's reason and a message; an agent restart does not
// judge the running pods again.
func TestNodeAdmission(t *testing.T) {
	e := startEnv(t, true, func(c *config.Config) { c.NodeLabels = map[string]string{"site": "plant-7"} })
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")
	mk := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
			NodeName: node, HostNetwork: true, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
			Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}},
		}}
	}
	big := mk("big")
	big.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("1000")}
	elsewhere := mk("elsewhere")
	elsewhere.Spec.NodeSelector = map[string]string{"site": "plant-8"}
	here := mk("here")
	here.Spec.NodeSelector = map[string]string{"site": "plant-7"}
	windows := mk("windows")
	windows.Spec.OS = &v1.PodOS{Name: v1.Windows}
	for _, p := range []*v1.Pod{big, elsewhere, here, windows} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, reason := range map[string]string{"big": "OutOfcpu", "elsewhere": "NodeAffinity", "windows": "PodOSNotSupported"} {
		testenv.Eventually(t, 60*time.Second, name+" rejected with "+reason, func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodFailed || p.Status.Reason != reason || !strings.HasPrefix(p.Status.Message, "Pod was rejected: ") {
				return fmt.Errorf("status %s %s %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
			}
			return nil
		})
	}
	before := e.waitAPIRunning(t, "here")["here"]
	for _, c := range e.containers(t) {
		if c.Name == "c" && c.PodUID != string(before.UID) {
			t.Errorf("a rejected pod got a container: %+v", c)
		}
	}
	// After a restart nothing is judged again: the running pod keeps its container.
	e.agent.Kill()
	e.agent.Start()
	testenv.Eventually(t, 60*time.Second, "here still running, same container", func() error {
		p, err := e.localPod("here")
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning || p.Status.ContainerStatuses[0].ContainerID != containerIDOf(before) {
			return fmt.Errorf("phase %s container %s", p.Status.Phase, p.Status.ContainerStatuses[0].ContainerID)
		}
		return nil
	})
}
