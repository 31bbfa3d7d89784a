package admission

import (
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/node/util/sysctl"
)

// Reasons a pod is rejected with for its securityContext, named as kubelet names them.
const (
	ReasonSysctlForbidden = "SysctlForbidden"
	ReasonAppArmor        = "AppArmor"
)

// safeSysctls is kubelet's safe set (pkg/kubelet/sysctl/safe_sysctls.go, v1.37): namespaced,
// and isolated from other pods on the node. Some are namespaced only from a kernel version on.
var safeSysctls = []struct {
	name      string
	minKernel [2]int // major, minor; zero when any kernel namespaces it
}{
	{"kernel.shm_rmid_forced", [2]int{}},
	{"net.ipv4.ip_local_port_range", [2]int{}},
	{"net.ipv4.tcp_syncookies", [2]int{}},
	{"net.ipv4.ping_group_range", [2]int{}},
	{"net.ipv4.ip_unprivileged_port_start", [2]int{}},
	{"net.ipv4.ip_local_reserved_ports", [2]int{3, 16}},
	{"net.ipv4.tcp_keepalive_time", [2]int{4, 5}},
	{"net.ipv4.tcp_fin_timeout", [2]int{4, 6}},
	{"net.ipv4.tcp_keepalive_intvl", [2]int{4, 5}},
	{"net.ipv4.tcp_keepalive_probes", [2]int{4, 5}},
	{"net.ipv4.tcp_rmem", [2]int{4, 15}},
	{"net.ipv4.tcp_wmem", [2]int{4, 15}},
	{"net.ipv4.tcp_slow_start_after_idle", [2]int{4, 15}},
	{"net.ipv4.tcp_notsent_lowat", [2]int{4, 6}},
}

// SafeSysctls returns kubelet's safe sysctls for a kernel release ("6.1.0-18-arm64"): those the
// kernel namespaces. An unreadable release keeps only the ones every kernel namespaces.
func SafeSysctls(kernelRelease string) []string {
	major, minor := parseKernel(kernelRelease)
	var out []string
	for _, s := range safeSysctls {
		if s.minKernel[0] > major || s.minKernel[0] == major && s.minKernel[1] > minor {
			continue
		}
		out = append(out, s.name)
	}
	return out
}

func parseKernel(release string) (major, minor int) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0
	}
	major, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits >= 0 {
		parts[1] = parts[1][:digits]
	}
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return 0, 0
	}
	return major, minor
}

// checkSysctls is kubelet's sysctl admission: every sysctl the pod sets must be in the node's
// allowlist (the safe set plus allowedUnsafeSysctls, names or patterns ending in "*"), and must
// not reach a namespace the pod shares with the host. holdfast runs host-network pods in the
// host's UTS namespace too, so kernel.domainname is refused for them as well.
func checkSysctls(pod *v1.Pod, allowed []string) Result {
	if pod.Spec.SecurityContext == nil || len(pod.Spec.SecurityContext.Sysctls) == 0 {
		return Admit
	}
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		if err := allowSysctl(s.Name, allowed, pod); err != nil {
			return Result{Reason: ReasonSysctlForbidden, Message: "forbidden sysctl: " + err.Error()}
		}
	}
	return Admit
}

func allowSysctl(name string, allowed []string, pod *v1.Pod) error {
	name = sysctl.NormalizeName(name)
	listed := false
	for _, pattern := range allowed {
		p := sysctl.NormalizeName(pattern)
		if prefix, ok := strings.CutSuffix(p, "*"); ok && strings.HasPrefix(name, prefix) || p == name {
			listed = true
			break
		}
	}
	if !listed {
		return fmt.Errorf("%q not allowlisted", name)
	}
	ns, _, _ := sysctl.GetNamespace(name)
	hostUsers := pod.Spec.HostUsers == nil || *pod.Spec.HostUsers
	switch {
	case ns == sysctl.UnknownNamespace:
		return fmt.Errorf("%q is not known to be namespaced", name)
	case ns == sysctl.NetNamespace && pod.Spec.HostNetwork,
		ns == sysctl.IPCNamespace && pod.Spec.HostIPC,
		ns == sysctl.UTSNamespace && pod.Spec.HostNetwork,
		ns == sysctl.UserNamespace && hostUsers:
		return fmt.Errorf("%q not allowed with host %s enabled", name, ns)
	}
	return nil
}

// checkAppArmor is kubelet's AppArmor admission: a pod asking for a profile other than
// Unconfined is refused on a host that cannot enforce one, rather than run unconfined.
func checkAppArmor(pod *v1.Pod, appArmorEnabled bool) Result {
	if appArmorEnabled || !AppArmorRequired(pod) {
		return Admit
	}
	return Result{Reason: ReasonAppArmor, Message: "Cannot enforce AppArmor: AppArmor is not enabled on the host"}
}

// AppArmorRequired reports whether any container of pod asks for an AppArmor profile other than
// Unconfined, through the fields or the deprecated annotations.
func AppArmorRequired(pod *v1.Pod) bool {
	if sc := pod.Spec.SecurityContext; sc != nil && confinedAppArmor(sc.AppArmorProfile) {
		return true
	}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix) && v != v1.DeprecatedAppArmorBetaProfileNameUnconfined {
			return true
		}
	}
	return anyContainer(pod, func(c *v1.Container) bool {
		return c.SecurityContext != nil && confinedAppArmor(c.SecurityContext.AppArmorProfile)
	})
}
