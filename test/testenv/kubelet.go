package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// kubeletSysctls are the kernel settings the upstream kubelet insists on at startup. It would
// write them to the host's /proc/sys (kernel.panic_on_oops=1 on a shared machine is no test's
// business, and the kubelet cannot be told to leave them alone), so it runs in a mount namespace
// of its own where these files are bind mounts of files holding the values it expects.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletConfig is the KubeletConfiguration the harnesses run the upstream kubelet with: what
// ENVIRONMENT.md lists for these machines (cgroup v1 allowed, cgroupfs, swap tolerated), the
// cgroup hierarchy as {{.Cgroups}} says (KubeletOptions.CgroupRoot), no iptables chains (they would change the shared
// host's firewall; holdfast makes none either), the disk eviction thresholds holdfast runs
// with in the harnesses (testenv's agent config: 1%; the shared disks pass the kubelet's 10%
// and 15% defaults by others' files, and the kubelet then refused the harness's pods under a
// DiskPressure neither agent caused; the other signals at the kubelet's defaults, written out
// because a partial evictionHard drops them), image garbage collection off for the same reason
// (imageGCHighThresholdPercent 100: at its default 85, passed by others' files, the kubelet
// removed the CRI plugin's preloaded sandbox image in a conformance run of 2026-12-06 and then
// started no pod; holdfast pins its pause image, agent/gc), and everything else at the
// kubelet's defaults,
// as holdfast's heartbeats are. {{.Serving}} is how the node API is served.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
{{.Cgroups}}failSwapOn: false
containerRuntimeEndpoint: unix://{{.Socket}}
port: {{.Port}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{.HealthzPort}}
authorization:
  mode: AlwaysAllow
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "5%"
  imagefs.inodesFree: "5%"
podLogsDir: {{.Dir}}/pods
volumePluginDir: {{.Dir}}/volume-plugins
{{.Serving}}`

// KubeletOptions says how KubeletCommand runs the upstream kubelet.
type KubeletOptions struct {
	// Dir holds the kubelet's configuration, root directory, certificates and logs.
	Dir string
	// Bin is the kubelet binary (hack/build-kubelet.sh).
	Bin string
	// Socket is the containerd whose CRI plugin it uses.
	Socket string
	// NodeName and Kubeconfig: the node it registers, with that node's credentials.
	NodeName, Kubeconfig string
	// ClientCA, when set, serves the node API as on a real node: on every address, to clients
	// with a certificate of this CA (the apiserver, for logs, exec and port-forward). Without
	// it the node API listens on loopback only and nobody is authenticated.
	ClientCA string
	// CgroupRoot, when set, runs the kubelet with its cgroup hierarchy at its defaults
	// (cgroupsPerQOS true, enforceNodeAllocatable [pods]) below this cgroup of its own
	// (Containerd.NewCgroupRoot), as make conformance judges it. Without it there are no QoS
	// cgroups and nothing is enforced (cgroupsPerQOS false, enforceNodeAllocatable []), as make
	// bench has measured it so far (docs/benchmarks.md).
	CgroupRoot string
}

// KubeletCommand prepares opts.Dir for the upstream kubelet and returns its command line. The
// kubelet runs in a mount namespace of its own (KubeletMountScript), so that it never writes
// the shared host's /proc/sys; nothing else differs from a node's: same network namespace,
// cgroups and containerd. It mounts pod volumes (tmpfs for Secrets and tokens) under its root
// directory in that namespace, and containerd, in the host's, must see them: the root
// directory is a shared mount, so its mounts propagate back. Everything mounted under
// opts.Dir is unmounted when t ends; stop the kubelet in a cleanup registered after this call.
func KubeletCommand(t testing.TB, opts KubeletOptions) []string {
	t.Helper()
	ports := make([]string, 2)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	serving := "address: 127.0.0.1\nauthentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n"
	if opts.ClientCA != "" {
		serving = "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: false\n  x509:\n    clientCAFile: " + opts.ClientCA + "\n"
	}
	cgroupConf := "cgroupsPerQOS: false\nenforceNodeAllocatable: []\n"
	if opts.CgroupRoot != "" {
		cgroupConf = "cgroupRoot: " + opts.CgroupRoot + "\n"
	}
	conf := strings.NewReplacer("{{.Socket}}", opts.Socket, "{{.Cgroups}}", cgroupConf, "{{.Port}}", ports[0], "{{.HealthzPort}}", ports[1],
		"{{.Dir}}", opts.Dir, "{{.Serving}}", serving).Replace(kubeletConfig)
	confPath := filepath.Join(opts.Dir, "kubelet-config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := KubeletMountScript(opts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	rootDir := filepath.Join(opts.Dir, "root")
	if err := os.MkdirAll(rootDir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the kubelet has stopped
		if err := UnmountUnder(opts.Dir); err != nil {
			t.Errorf("unmount the kubelet's volumes: %v", err)
		}
	})
	if err := unix.Mount(rootDir, rootDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", rootDir, err)
	}
	if err := unix.Mount("", rootDir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", rootDir, err)
	}
	// The host's other mounts stay as they are (private on these machines), so the bind mounts
	// of the script stay the kubelet's.
	return []string{
		"unshare", "--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", script,
		opts.Bin,
		"--config=" + confPath,
		"--kubeconfig=" + opts.Kubeconfig,
		"--root-dir=" + rootDir,
		"--cert-dir=" + filepath.Join(opts.Dir, "pki"),
		"--hostname-override=" + opts.NodeName,
	}
}

// UnmountUnder lazily unmounts every mount point under dir, deepest first: a kubelet's volumes,
// or the network namespaces a killed holdfast left bind-mounted.
func UnmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return err
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
		}
	}
	return nil
}

// KubeletMountScript prepares, under dir, what the upstream kubelet (run by make bench and make
// conformance beside holdfast) needs in a mount namespace of its own, and returns the shell
// script that sets it up there and then runs its arguments (`exec "$0" "$@"`): the sysctl files
// above bind-mounted over /proc/sys, and this run's private copies of the paths the kubelet
// uses whatever its --root-dir (the device plugin directory under /var/lib/kubelet, the log
// symlinks in /var/log/containers); the host keeps, or gets, only empty directories. Run it as
// `unshare --mount ... -- /bin/sh -c SCRIPT KUBELET ARGS...`.
func KubeletMountScript(dir string) (string, error) {
	sysDir := filepath.Join(dir, "sysctl")
	if err := os.MkdirAll(sysDir, 0o755); err != nil {
		return "", err
	}
	keys := make([]string, 0, len(kubeletSysctls))
	for k := range kubeletSysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var binds []string
	for _, k := range keys {
		f := filepath.Join(sysDir, strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(kubeletSysctls[k]+"\n"), 0o644); err != nil {
			return "", err
		}
		binds = append(binds, fmt.Sprintf("mount --bind %s /proc/sys/%s", f, k))
	}
	for _, p := range []string{"/var/lib/kubelet", "/var/log/containers"} {
		private := filepath.Join(dir, "host", strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-"))
		if err := os.MkdirAll(private, 0o755); err != nil {
			return "", err
		}
		binds = append(binds, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", p, private, p))
	}
	return strings.Join(binds, " && ") + ` && exec "$0" "$@"`, nil
}
