package network

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"

	"github.com/holdfast-dev/holdfast/test/prereq"
)

// recorderPlugin is a CNI plugin that appends each call (command, container ID, namespace
// path) to a log and answers ADD with an address of its own: real CNI execs through libcni
// and go-cni, with a plugin whose calls a test can read.
const recorderPlugin = `#!/bin/sh
cat >/dev/null
echo "$CNI_COMMAND $CNI_CONTAINERID ${CNI_NETNS:-none}" >>"$(dirname "$0")/calls"
if [ "$CNI_COMMAND" = ADD ]; then
  n=$(grep -c '^ADD' "$(dirname "$0")/calls")
  printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"address":"10.9.0.%d/24","interface":0}]}' "$CNI_IFNAME" "$CNI_NETNS" "$n"
fi
`

type recorderNet struct {
	bin, netns string
	m          *Manager
}

func newRecorderNet(t *testing.T) *recorderNet {
	t.Helper()
	prereq.Root(t, "network namespaces")
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "conf")
	for _, d := range []string{bin, conf} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "recorder"), []byte(recorderPlugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "10-test.conflist"), []byte(`{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"recorder"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &recorderNet{bin: bin, netns: filepath.Join(dir, "netns")}
	n.m = NewManager(conf, []string{bin}, n.netns, filepath.Join(dir, "state"))
	t.Cleanup(func() {
		entries, _ := os.ReadDir(n.netns)
		for _, e := range entries {
			_ = RemoveNetNS(filepath.Join(n.netns, e.Name()))
		}
	})
	return n
}

// calls returns the plugin's calls so far, one "COMMAND ID NETNS" per line.
func (n *recorderNet) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.bin, "calls"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}

// reboot takes the pods' namespaces away, as a reboot does (they live on tmpfs).
func (n *recorderNet) reboot(t *testing.T, uid string) {
	t.Helper()
	if err := RemoveNetNS(n.m.netnsPath(uid)); err != nil {
		t.Fatal(err)
	}
}

// After a reboot a pod is attached again under a new CNI container ID at once, and its
// previous attachment is DELeted afterwards, without a namespace (never the new one at the
// same path), by Run once setups are quiet, or by Teardown.
func TestSetupAfterRebootDefersTheOldDel(t *testing.T) {
	defer func(q time.Duration) { releaseQuiet = q }(releaseQuiet)
	releaseQuiet = 50 * time.Millisecond
	n := newRecorderNet(t)
	ctx := context.Background()
	const uid = "0b5c-uid"
	pn, err := n.m.setup(ctx, uid, "default", "web", nil)
	if err != nil {
		t.Fatal(err)
	}
	ns := pn.NetNSPath
	n.reboot(t, uid)
	if pn, err = n.m.setup(ctx, uid, "default", "web", nil); err != nil {
		t.Fatal(err)
	}
	want := []string{"ADD_" + uid + "_" + ns, "ADD_" + uid + "-g1_" + ns}
	if got := n.calls(t); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("calls after the reboot's setup %v, want %v (no DEL before the new ADD)", got, want)
	}
	if len(pn.IPs) != 1 || pn.IPs[0] != "10.9.0.2" {
		t.Errorf("new attachment's IPs %v", pn.IPs)
	}

	// A second reboot: the next generation; the first set-aside attachment is still there.
	n.reboot(t, uid)
	if _, err := n.m.setup(ctx, uid, "default", "web", nil); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- n.m.Run(runCtx) }()
	// Until both DELs have run and their records are removed: a DEL the plugin has recorded
	// may still be running, and cancelled it fails and leaves its record (to be tried again
	// by the next run, as it should be), which the check below would take for a leak.
	released := func() bool {
		entries, _ := os.ReadDir(n.m.staleDir())
		return len(n.calls(t)) >= 5 && len(entries) == 0
	}
	deadline := time.Now().Add(30 * time.Second)
	for !released() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := n.calls(t)
	if len(got) == 5 {
		slices.Sort(got[3:]) // the two releases, in no particular order
	}
	want = append(want, "ADD_"+uid+"-g2_"+ns, "DEL_"+uid+"-g1_none", "DEL_"+uid+"_none")
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("calls %v, want %v: the old attachments released without a namespace", got, want)
	}
	if entries, _ := os.ReadDir(n.m.staleDir()); len(entries) != 0 {
		t.Errorf("set-aside records left after the release: %v", entries)
	}
	if n.m.Get(uid) == nil {
		t.Error("the pod's current network is gone after the release")
	}
}

// A pod deleted before its previous boot's attachment was released: Teardown releases both.
func TestTeardownReleasesSetAside(t *testing.T) {
	n := newRecorderNet(t)
	ctx := context.Background()
	const uid = "77aa-uid"
	if _, err := n.m.setup(ctx, uid, "default", "web", nil); err != nil {
		t.Fatal(err)
	}
	n.reboot(t, uid)
	if _, err := n.m.setup(ctx, uid, "default", "web", nil); err != nil {
		t.Fatal(err)
	}
	if err := n.m.Teardown(ctx, uid, "default", "web"); err != nil {
		t.Fatal(err)
	}
	var dels []string
	for _, c := range n.calls(t) {
		if strings.HasPrefix(c, "DEL_") {
			dels = append(dels, c)
		}
	}
	if len(dels) != 2 || dels[0] != "DEL_"+uid+"_none" || !strings.HasPrefix(dels[1], "DEL_"+uid+"-g1_/") {
		t.Errorf("DELs %v: want the old attachment's without a namespace, then the current one's", dels)
	}
	if len(n.m.Known()) != 0 {
		t.Errorf("records left: %v", n.m.Known())
	}
}

// A pod with host ports is DELeted before its new ADD, as before: the previous boot's port
// rules must not shadow the new ones.
func TestSetupAfterRebootWithHostPortsDelsFirst(t *testing.T) {
	n := newRecorderNet(t)
	ctx := context.Background()
	const uid = "c3d4-uid"
	ports := []gocni.PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}
	pn, err := n.m.setup(ctx, uid, "default", "web", ports)
	if err != nil {
		t.Fatal(err)
	}
	n.reboot(t, uid)
	if _, err := n.m.setup(ctx, uid, "default", "web", ports); err != nil {
		t.Fatal(err)
	}
	want := []string{"ADD_" + uid + "_" + pn.NetNSPath, "DEL_" + uid + "_none", "ADD_" + uid + "_" + pn.NetNSPath}
	if got := n.calls(t); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("calls %v, want %v", got, want)
	}
}

// Pods' networks are set up at once (the pod workers run in parallel), and every build must
// survive it: under -race go-cni's mutexes are go-deadlock's, whose detector took two
// goroutines' read locks for one goroutine locking twice and exited the process (the bench
// harness's test binary, in CI on 2026-12-05). The plugin holds each ADD for a while so that
// the setups overlap inside go-cni's lock.
func TestConcurrentSetups(t *testing.T) {
	n := newRecorderNet(t)
	slow := strings.Replace(recorderPlugin, "cat >/dev/null\n", "cat >/dev/null\nsleep 0.3\n", 1)
	if err := os.WriteFile(filepath.Join(n.bin, "recorder"), []byte(slow), 0o755); err != nil {
		t.Fatal(err)
	}
	const pods = 8
	errs := make(chan error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			_, err := n.m.setup(context.Background(), fmt.Sprintf("concurrent-%d", i), "default", fmt.Sprintf("web-%d", i), nil)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := n.calls(t); len(got) != pods {
		t.Errorf("plugin calls %v, want %d ADDs", got, pods)
	}
	for i := range pods {
		if n.m.Get(fmt.Sprintf("concurrent-%d", i)) == nil {
			t.Errorf("pod %d has no network record", i)
		}
	}
}

// The agent's records of a pod's network are gone (a state directory wiped or lost, as the
// demo's make run wiped it between runs) but IPAM's allocation under the pod's CNI container
// ID is not: the next setup releases it and attaches the pod, rather than failing with
// host-local's "duplicate allocation is not allowed" until a later retry. Real bridge and
// host-local plugins, their allocations in a directory of the test's.
func TestSetupWhenIPAMOutlivedTheRecord(t *testing.T) {
	prereq.Root(t, "network namespaces and a bridge")
	const pluginDir = "/usr/lib/cni"
	if _, err := os.Stat(filepath.Join(pluginDir, "host-local")); err != nil {
		t.Fatalf("CNI plugins (Debian package containernetworking-plugins, installed by hack/deps.sh): %v", err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "conf")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	const bridge = "hfipamtest0"
	conflist := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ipamtest","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,
		"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.231.7.0/29"}]]}}]}`, bridge, filepath.Join(dir, "ipam"))
	if err := os.WriteFile(filepath.Join(conf, "10-ipamtest.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	netns := filepath.Join(dir, "netns")
	newManager := func() *Manager { return NewManager(conf, []string{pluginDir}, netns, filepath.Join(dir, "state")) }
	t.Cleanup(func() {
		entries, _ := os.ReadDir(netns)
		for _, e := range entries {
			_ = RemoveNetNS(filepath.Join(netns, e.Name()))
		}
		_ = exec.Command("ip", "link", "delete", bridge).Run()
	})
	ctx := context.Background()
	const uid = "5e1f-uid"
	first, err := newManager().setup(ctx, uid, "default", "web", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's state and the namespace go; IPAM's directory stays.
	if err := RemoveNetNS(first.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	m := newManager()
	pn, err := m.setup(ctx, uid, "default", "web", nil)
	if err != nil {
		t.Fatalf("setup after the records were lost: %v", err)
	}
	if len(pn.IPs) != 1 {
		t.Fatalf("IPs %v, want one", pn.IPs)
	}
	// One allocation held, the pod's current one: the lost one was released, not leaked.
	held, _ := filepath.Glob(filepath.Join(dir, "ipam", "ipamtest", "10.*"))
	if len(held) != 1 || filepath.Base(held[0]) != pn.IPs[0] {
		t.Errorf("IPAM holds %v, want only the pod's %s", held, pn.IPs[0])
	}
	if err := m.Teardown(ctx, uid, "default", "web"); err != nil {
		t.Fatal(err)
	}
}
