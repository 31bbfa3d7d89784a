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

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// ipamFiles lists the addresses host-local holds in the test network (one file per address).
func ipamFiles(t *testing.T, e *env) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.cni.ConfDir, "ipam", e.cni.Name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ips []string
	for _, en := range entries {
		if net.ParseIP(en.Name()) != nil {
			ips = append(ips, en.Name())
		}
	}
	return ips
}

func netPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{
		NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1), AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxImage, ImagePullPolicy: v1.PullNever, Command: []string{"sleep", "3600"}}},
	}}
}

// TestCNIDelAfterRestartAndReboot: a pod's address goes back to IPAM when the pod is deleted
// after the agent was restarted as a new process, and when it is deleted while the agent is
// down after a reboot (its network namespace gone: CNI DEL runs with no namespace, from what
// holdfast recorded at ADD; on the CRI backend, from what the runtime recorded of its sandbox).
func TestCNIDelAfterRestartAndReboot(t *testing.T) {
	e := startEnv(t, true, nil)
	ctx := context.Background()
	pods := e.cp.Admin.CoreV1().Pods("default")

	t.Run("agent restarted", func(t *testing.T) {
		if _, err := pods.Create(ctx, netPod("restarted"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ip := e.waitPodIP(t, "restarted").Status.PodIP
		if files := ipamFiles(t, e); !strings.Contains(strings.Join(files, " "), ip) {
			t.Fatalf("host-local holds %v, not the pod's %s", files, ip)
		}
		e.agent.Kill()
		e.agent.Start()
		if err := pods.Delete(ctx, "restarted", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(t, "restarted")
		if files := ipamFiles(t, e); len(files) != 0 {
			t.Errorf("host-local still holds %v after the pod was deleted", files)
		}
	})

	// After a reboot the pod is attached again at once under a new CNI container ID, and the
	// previous boot's address is released afterwards: in the end IPAM holds only the pod's
	// new address, and none once the pod is deleted.
	t.Run("reboot, pod kept", func(t *testing.T) {
		if _, err := pods.Create(ctx, netPod("kept"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		before := e.waitPodIP(t, "kept").Status.PodIP
		testenv.Reboot(e.cd, e.agent)
		if files := ipamFiles(t, e); len(files) != 1 || files[0] != before {
			t.Fatalf("host-local holds %v before the agent comes back, want the pod's %s", files, before)
		}
		e.agent.Start()
		var after string
		testenv.Eventually(t, 90*time.Second, "the pod running again with its new address, and only that held", func() error {
			p, err := e.localPod("kept")
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodRunning || p.Status.PodIP == "" || p.Status.PodIP == before {
				return fmt.Errorf("phase %s, podIP %q (before the reboot %s)", p.Status.Phase, p.Status.PodIP, before)
			}
			after = p.Status.PodIP
			if files := ipamFiles(t, e); len(files) != 1 || files[0] != after {
				return fmt.Errorf("host-local holds %v, want only the pod's %s", files, after)
			}
			return nil
		})
		if err := pods.Delete(ctx, "kept", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(t, "kept")
		if files := ipamFiles(t, e); len(files) != 0 {
			t.Errorf("host-local still holds %v after the pod was deleted", files)
		}
	})

	t.Run("reboot", func(t *testing.T) {
		// A static pod, so that nothing starts it again after the reboot: its file is removed
		// while the machine is down.
		manifestPath := filepath.Join(e.agent.Config.ManifestDir, "rebooted.yaml")
		manifest := "apiVersion: v1\nkind: Pod\nmetadata: {name: rebooted, namespace: default}\nspec:\n" +
			"  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: " + testenv.BusyboxImage +
			", imagePullPolicy: Never, command: [sleep, '3600']}\n"
		if err := os.WriteFile(manifestPath, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		var uid string
		testenv.Eventually(t, 90*time.Second, "the static pod running with an IP", func() error {
			p, err := e.localPod("rebooted-" + node) // a static pod's name ends with its node's
			if err != nil {
				return err
			}
			if p.Status.Phase != v1.PodRunning || p.Status.PodIP == "" {
				return fmt.Errorf("phase %s, podIP %q", p.Status.Phase, p.Status.PodIP)
			}
			uid = string(p.UID)
			return nil
		})
		// The reboot: the agent and every task die, the namespace mount goes with the old
		// kernel; the pod's file is gone when the agent comes back.
		netns := e.podNetNS(t, types.UID(uid))
		e.agent.Kill()
		e.cd.Stop()
		if err := unix.Unmount(netns, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", netns, err)
		}
		if err := os.Remove(netns); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(manifestPath); err != nil {
			t.Fatal(err)
		}
		if files := ipamFiles(t, e); len(files) != 1 {
			t.Fatalf("host-local holds %v before the agent comes back, want the pod's address", files)
		}
		e.cd.Start()
		e.agent.Start()
		testenv.Eventually(t, 90*time.Second, "the removed pod's address released", func() error {
			if files := ipamFiles(t, e); len(files) != 0 {
				return fmt.Errorf("host-local still holds %v", files)
			}
			return nil
		})
	})
}
