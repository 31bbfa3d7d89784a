package admission

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestSafeSysctlsFollowTheKernel(t *testing.T) {
	for _, tc := range []struct {
		release    string
		has, lacks []string
	}{
		{"6.1.0-18-arm64", []string{"net.ipv4.tcp_rmem", "net.ipv4.tcp_fin_timeout", "kernel.shm_rmid_forced"}, nil},
		{"4.9.337-rt", []string{"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout"}, []string{"net.ipv4.tcp_rmem", "net.ipv4.tcp_slow_start_after_idle"}},
		{"4.5.0", []string{"net.ipv4.tcp_keepalive_probes"}, []string{"net.ipv4.tcp_fin_timeout"}},
		{"garbage", []string{"net.ipv4.ip_local_port_range"}, []string{"net.ipv4.ip_local_reserved_ports"}},
	} {
		got := SafeSysctls(tc.release)
		for _, s := range tc.has {
			if !slices.Contains(got, s) {
				t.Errorf("kernel %s: %s missing from %v", tc.release, s, got)
			}
		}
		for _, s := range tc.lacks {
			if slices.Contains(got, s) {
				t.Errorf("kernel %s: %s is not namespaced there, yet in %v", tc.release, s, got)
			}
		}
	}
}

func TestSysctlAdmission(t *testing.T) {
	allowed := append(SafeSysctls("6.1.0"), "net.core.somaxconn", "kernel.msg*", "fs.mqueue.*")
	for _, tc := range []struct {
		name    string
		sysctls []string
		edit    func(p *v1.Pod)
		msg     string // empty: admitted
	}{
		{"safe", []string{"net.ipv4.ip_local_port_range", "kernel.shm_rmid_forced"}, nil, ""},
		{"slash form", []string{"net/ipv4/tcp_syncookies"}, nil, ""},
		{"allowed unsafe", []string{"net.core.somaxconn", "kernel.msgmax", "fs.mqueue.msg_max"}, nil, ""},
		{"unsafe", []string{"net.ipv4.ip_forward"}, nil, `forbidden sysctl: "net.ipv4.ip_forward" not allowlisted`},
		{"not namespaced", []string{"vm.swappiness"}, nil, `"vm.swappiness" not allowlisted`},
		{"net with host network", []string{"net.ipv4.ip_local_port_range"}, func(p *v1.Pod) { p.Spec.HostNetwork = true },
			`forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host Net enabled`},
		{"ipc with host IPC", []string{"kernel.shm_rmid_forced"}, func(p *v1.Pod) { p.Spec.HostIPC = true }, "not allowed with host IPC enabled"},
		{"ipc with host network", []string{"kernel.shm_rmid_forced"}, func(p *v1.Pod) { p.Spec.HostNetwork = true }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("", "", nil)
			p.Spec.SecurityContext = &v1.PodSecurityContext{}
			for _, s := range tc.sysctls {
				p.Spec.SecurityContext.Sysctls = append(p.Spec.SecurityContext.Sysctls, v1.Sysctl{Name: s, Value: "1"})
			}
			if tc.edit != nil {
				tc.edit(p)
			}
			r := Check(p, Node{Sysctls: allowed}, nil)
			switch {
			case tc.msg == "" && !r.Admitted:
				t.Fatalf("rejected: %+v", r)
			case tc.msg != "" && (r.Admitted || r.Reason != ReasonSysctlForbidden || !strings.Contains(r.Message, tc.msg)):
				t.Fatalf("Check = %+v, want reason %s with %q", r, ReasonSysctlForbidden, tc.msg)
			}
		})
	}
}

func TestAppArmorAdmission(t *testing.T) {
	runtimeDefault := &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeRuntimeDefault}
	for _, tc := range []struct {
		name     string
		edit     func(p *v1.Pod)
		required bool
	}{
		{"none", func(p *v1.Pod) {}, false},
		{"unconfined", func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeUnconfined}}
		}, false},
		{"pod runtime default", func(p *v1.Pod) { p.Spec.SecurityContext = &v1.PodSecurityContext{AppArmorProfile: runtimeDefault} }, true},
		{"init container localhost", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "i", SecurityContext: &v1.SecurityContext{
				AppArmorProfile: &v1.AppArmorProfile{Type: v1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptr.To("gw-collector")}}}}
		}, true},
		{"annotation", func(p *v1.Pod) {
			p.Annotations = map[string]string{v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "c": "runtime/default"}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("", "", nil)
			tc.edit(p)
			if r := Check(p, Node{AppArmor: true}, nil); !r.Admitted {
				t.Errorf("rejected on a host with AppArmor: %+v", r)
			}
			r := Check(p, Node{}, nil)
			if tc.required && (r.Admitted || r.Reason != ReasonAppArmor || r.Message != "Cannot enforce AppArmor: AppArmor is not enabled on the host") {
				t.Errorf("without AppArmor: %+v, want kubelet's rejection", r)
			}
			if !tc.required && !r.Admitted {
				t.Errorf("without AppArmor: rejected %+v", r)
			}
		})
	}
}
