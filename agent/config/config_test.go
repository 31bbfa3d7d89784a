package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

func TestLoadDefaults(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeStatus.LeaseRenewInterval.Duration != 10*time.Second || c.NodeStatus.LeaseDuration.Duration != 40*time.Second {
		t.Errorf("lease defaults = %s/%s, want kubelet's 10s/40s", c.NodeStatus.LeaseRenewInterval, c.NodeStatus.LeaseDuration)
	}
	if c.MaxPods != 110 || c.Containerd.Namespace != "holdfast" || !c.Standalone() {
		t.Errorf("unexpected defaults: %+v", c)
	}
	// Like kubelet's <root-dir>/seccomp, Localhost seccomp profiles live under the state dir.
	if c.SeccompProfileRoot != "/var/lib/holdfast/seccomp" || len(c.AllowedUnsafeSysctls) != 0 {
		t.Errorf("seccompProfileRoot %q, allowedUnsafeSysctls %v; want /var/lib/holdfast/seccomp and none", c.SeccompProfileRoot, c.AllowedUnsafeSysctls)
	}
	c, err = LoadWith("", func(c *Config) { c.StateDir = "/data/holdfast" })
	if err != nil || c.SeccompProfileRoot != "/data/holdfast/seccomp" {
		t.Errorf("seccompProfileRoot %q (%v), want it to follow stateDir", c.SeccompProfileRoot, err)
	}
}

// The metered profile lengthens the heartbeats it owns and leaves what the file sets; the
// default profile is the kubelet's, and an unknown one is refused.
func TestUplinkProfile(t *testing.T) {
	load := func(yaml string) (Config, error) {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(p)
	}
	c, err := load("")
	if err != nil || c.UplinkProfile != UplinkKubelet || c.NodeStatus.ReportFrequency.Duration != 5*time.Minute {
		t.Errorf("default profile %q, reportFrequency %s (%v); want kubelet, 5m", c.UplinkProfile, c.NodeStatus.ReportFrequency, err)
	}
	c, err = load("uplinkProfile: metered\nnodeStatus:\n  leaseDuration: 20m\n")
	if err != nil {
		t.Fatal(err)
	}
	ns := c.NodeStatus
	if ns.LeaseRenewInterval.Duration != 2*time.Minute || ns.LeaseDuration.Duration != 20*time.Minute ||
		ns.ReportFrequency.Duration != time.Hour || ns.UpdateFrequency.Duration != 10*time.Second {
		t.Errorf("metered with leaseDuration 20m: renew %s, lease %s, report %s, update %s; want 2m, 20m (the file's), 1h, 10s",
			ns.LeaseRenewInterval, ns.LeaseDuration, ns.ReportFrequency, ns.UpdateFrequency)
	}
	if c, err := load("uplinkProfile: metered\n"); err != nil || c.NodeStatus.LeaseDuration.Duration != 8*time.Minute {
		t.Errorf("metered: leaseDuration %s (%v), want 8m", c.NodeStatus.LeaseDuration, err)
	}
	if _, err := load("uplinkProfile: satellite\n"); err == nil || !strings.Contains(err.Error(), "uplinkProfile") {
		t.Errorf("unknown profile: %v, want an uplinkProfile error", err)
	}
}

// A relist threshold set alone below the period's default takes the period down with it (a
// third of it): a configuration written when the period was 1s stays valid.
// TestRuntimeBackend: the backend defaults to containerd; cri takes its endpoint.
func TestRuntimeBackend(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("runtime: cri\ncriEndpoint: unix:///run/k3s/containerd/containerd.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil || c.Runtime != RuntimeCRI || c.CRIEndpoint != "unix:///run/k3s/containerd/containerd.sock" {
		t.Errorf("Load: runtime %q at %q, %v", c.Runtime, c.CRIEndpoint, err)
	}
	d, err := Load("")
	if err != nil || d.Runtime != RuntimeContainerd || d.CRIEndpoint != "unix:///run/containerd/containerd.sock" {
		t.Errorf("defaults: runtime %q at %q, %v", d.Runtime, d.CRIEndpoint, err)
	}
}

func TestShortRelistThresholdAlone(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("pods:\n  relistThreshold: 30s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Pods.RelistPeriod.Duration != 10*time.Second {
		t.Errorf("relistPeriod %s, want 10s", c.Pods.RelistPeriod)
	}
}

func TestLoadFile(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, wantErr string
	}{
		{"valid", "nodeName: gw-1\nnodeStatus:\n  leaseRenewInterval: 2s\n", ""},
		{"unknown field", "nodeNmae: gw-1\n", "unknown field"},
		{"bad duration", "pods:\n  relistPeriod: soon\n", "duration"},
		{"renew longer than lease", "nodeStatus:\n  leaseRenewInterval: 50s\n", "must be shorter"},
		{"negative pods", "maxPods: -1\n", "negative"},
		{"unknown runtime", "runtime: docker\n", `runtime "docker" is neither "containerd" nor "cri"`},
		{"relist threshold not above period", "pods:\n  relistPeriod: 2s\n  relistThreshold: 1s\n", "must be longer than pods.relistPeriod"},
		{"unsafe sysctl not namespaced", "allowedUnsafeSysctls: [net.core.somaxconn, vm.swappiness]\n", `"vm.swappiness" is not a namespaced sysctl`},
		{"unknown eviction signal", "evictionHard:\n  memory.free: 1Gi\n", `unknown signal "memory.free"`},
		{"eviction threshold not a quantity", "evictionHard:\n  nodefs.available: lots\n", `"lots" is neither a quantity`},
		{"soft threshold without grace period", "evictionSoft:\n  memory.available: 1Gi\n", "no grace period"},
		{"reserved resource unknown", "systemReserved:\n  gpu: \"1\"\n", `systemReserved: "gpu" is not one of`},
		{"reserved not a quantity", "kubeReserved:\n  memory: much\n", `kubeReserved: memory: "much" is not a quantity`},
		{"unsafe sysctl of the user namespace", "allowedUnsafeSysctls: [user.max_user_namespaces]\n", "not a namespaced sysctl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.NodeName != "gw-1" || c.NodeStatus.LeaseRenewInterval.Duration != 2*time.Second {
					t.Errorf("got %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), p) {
				t.Errorf("err = %v, want one naming %s and containing %q", err, p, tc.wantErr)
			}
		})
	}
}

// The configuration shipped in the firmware must stay loadable and equal to the defaults.
func TestFirmwareConfigIsTheDefault(t *testing.T) {
	c, err := Load("../../firmware/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	c.NodeName, d.NodeName = "", ""
	if !reflect.DeepEqual(c, d) {
		t.Errorf("firmware/config.yaml differs from the defaults:\n got %+v\nwant %+v", c, d)
	}
}

// A bootstrap kubeconfig alone makes the agent join a cluster: the node kubeconfig it writes
// defaults to the state dir.
func TestBootstrapKubeconfigDefaultsKubeconfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("stateDir: /data/hf\nbootstrapKubeconfig: /etc/holdfast/bootstrap-kubeconfig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kubeconfig != "/data/hf/kubeconfig" || c.Standalone() {
		t.Errorf("kubeconfig = %q, standalone %v; want /data/hf/kubeconfig, not standalone", c.Kubeconfig, c.Standalone())
	}
}

// systemReserved and kubeReserved add up; the hard thresholds a file does not name keep
// kubelet's defaults.
func TestReservedAndThresholds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	y := "nodeName: gw-1\nsystemReserved: {memory: 100Mi, cpu: 100m}\nkubeReserved: {memory: 156Mi, ephemeral-storage: 1Gi}\nevictionHard:\n  memory.available: 300Mi\n"
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserved()
	if err != nil {
		t.Fatal(err)
	}
	if m, cpu, s := r[v1.ResourceMemory], r[v1.ResourceCPU], r[v1.ResourceEphemeralStorage]; m.Value() != 256<<20 || cpu.MilliValue() != 100 || s.Value() != 1<<30 {
		t.Errorf("reserved %v, want memory 256Mi, cpu 100m, ephemeral-storage 1Gi", r)
	}
	if c.EvictionHard["memory.available"] != "300Mi" || c.EvictionHard["nodefs.available"] != "10%" {
		t.Errorf("evictionHard %v, want memory.available 300Mi and the default nodefs.available 10%%", c.EvictionHard)
	}
}

// The node API port: 10250 by default, 0 disables it, and nonsense is refused.
func TestNodeAPIPort(t *testing.T) {
	for _, tc := range []struct {
		yaml    string
		want    int
		wantErr string
	}{
		{"", 10250, ""},
		{"port: 0\n", 0, ""},
		{"port: 11250\naddress: 127.0.0.1\n", 11250, ""},
		{"port: 70000\n", 0, "port 70000"},
		{"address: gw.local\n", 0, `address "gw.local"`},
	} {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := c.NodeAPIPort(); got != tc.want {
			t.Errorf("%q: port %d, want %d", tc.yaml, got, tc.want)
		}
	}
}

// The policies' compiled code is machine code the agent runs, checked by a CRC only: by
// default it is kept on tmpfs, never under the state directory, where whoever holds the disk
// could plant an entry for a module whose digest checks out.
func TestPolicyCacheNotOnTheStateDisk(t *testing.T) {
	c, err := Parse([]byte("nodeName: gw\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.PolicyCacheDir, "/run/") || strings.HasPrefix(c.PolicyCacheDir, c.StateDir) {
		t.Errorf("policyCacheDir %q by default, state dir %q: want it on tmpfs (/run)", c.PolicyCacheDir, c.StateDir)
	}
	// Nor the FIFOs every exec probe makes and removes: on flash, their metadata writes wear it.
	if !strings.HasPrefix(c.ExecFIFODir, "/run/") {
		t.Errorf("execFIFODir %q by default: want it on tmpfs (/run)", c.ExecFIFODir)
	}
	off, err := Parse([]byte("nodeName: gw\npolicyCacheDir: \"-\"\n"), nil)
	if err != nil || off.PolicyCacheDir != "" {
		t.Errorf(`policyCacheDir "-": %q, %v; want the cache off`, off.PolicyCacheDir, err)
	}
}

// A state key credential is a systemd credential's name, never a path, and not sealed by the
// agent's TPM code too (systemd seals it).
func TestStateKeyCredential(t *testing.T) {
	for _, tc := range []struct{ yaml, wantErr string }{
		{"stateKeyCredential: holdfast-state-key\nsealConfigMaps: true\n", ""},
		{"stateKeyCredential: ../state.key\n", "not a credential name"},
		{"stateKeyCredential: /etc/holdfast/state.key\n", "not a credential name"},
		{"stateKeyCredential: ..\n", "not a credential name"},
		{"stateKeyCredential: k\nstateKeyTPM: /dev/tpmrm0\n", "both set"},
	} {
		c, err := Parse([]byte("nodeName: gw\n"+tc.yaml), nil)
		if tc.wantErr == "" {
			if err != nil || c.StateKeyCredential != "holdfast-state-key" || !c.SealConfigMaps {
				t.Errorf("%q: %+v, %v", tc.yaml, c, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.wantErr)
		}
	}
}

// memoryTrimAfter defaults to a minute; 0s is never, not the default; a negative one is
// refused.
func TestMemoryTrimAfter(t *testing.T) {
	if d := Default(); d.MemoryTrimAfter == nil || d.MemoryTrimAfter.Duration != time.Minute {
		t.Errorf("default memoryTrimAfter %v, want 1m", d.MemoryTrimAfter)
	}
	for _, tt := range []struct {
		yaml    string
		want    time.Duration
		wantErr string
	}{
		{"", time.Minute, ""},
		{"memoryTrimAfter: 0s\n", 0, ""},
		{"memoryTrimAfter: 5m\n", 5 * time.Minute, ""},
		{"memoryTrimAfter: -1s\n", 0, "memoryTrimAfter -1s is negative"},
	} {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte("nodeName: gw-1\n"+tt.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: error %v, want one saying %q", tt.yaml, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.yaml, err)
		case c.MemoryTrimAfter.Duration != tt.want:
			t.Errorf("%q: memoryTrimAfter %v, want %v", tt.yaml, c.MemoryTrimAfter, tt.want)
		}
	}
}

// The cgroup settings as the kubelet's: its defaults, and the combinations it refuses.
func TestCgroupSettings(t *testing.T) {
	d := Default()
	if !*d.CgroupsPerQOS || d.CgroupRoot != "/" || d.CgroupDriver != "cgroupfs" || !d.Enforces(EnforcePods) || !*d.CPUCFSQuota {
		t.Errorf("defaults %v %q %q %v %v; want the kubelet's", *d.CgroupsPerQOS, d.CgroupRoot, d.CgroupDriver, d.EnforceNodeAllocatable, *d.CPUCFSQuota)
	}
	for _, tt := range []struct {
		yaml    string
		wantErr string
	}{
		{"cgroupsPerQOS: false\nenforceNodeAllocatable: [none]\n", ""},
		{"cgroupsPerQOS: false\n", "no kubepods to cap"},
		{"cgroupDriver: systemd\n", ""},
		{"cgroupDriver: systemd\ncgroupRoot: /edge_1\n", "no \"_\""},
		{"cgroupDriver: slices\n", "want \"cgroupfs\" or \"systemd\""},
		{"cgroupRoot: edge\n", "not an absolute cgroup path"},
		{"enforceNodeAllocatable: [pods, kube-reserved]\n", "without kubeReservedCgroup"},
		{"enforceNodeAllocatable: [pods, system-reserved]\nsystemReservedCgroup: /system.slice\n", ""},
		{"enforceNodeAllocatable: [everything]\n", "is not pods"},
	} {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte("nodeName: gw-1\n"+tt.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tt.yaml, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one saying %q", tt.yaml, err, tt.wantErr)
		}
	}
}
