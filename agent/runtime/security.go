package runtime

// Security is a container's confinement as the pod layer resolves it from the pod's and the
// container's securityContext, the container's field over the pod's, as the kubelet does
// (determineEffectiveSecurityContext). Each backend applies it by its runtime's rules: the
// containerd backend as containerd's CRI plugin builds an OCI spec, the CRI backend as the
// runtime's LinuxContainerSecurityContext.
type Security struct {
	// RunAsUser and RunAsGroup: nil keeps the image's.
	RunAsUser, RunAsGroup *int64
	// SupplementalGroups: the pod's fsGroup first, then its supplementalGroups.
	SupplementalGroups []int64
	// RunAsNonRoot: a container that would run as root (UID 0) is refused, a ConfigError.
	RunAsNonRoot bool
	// Privileged: every capability, the host's devices, no seccomp filter, whatever the rest says.
	Privileged bool
	// Capabilities are added and dropped as the pod names them ("NET_ADMIN", "net_admin",
	// "CAP_NET_ADMIN", "ALL"); nil: the runtime's default set.
	Capabilities *Capabilities
	// ReadOnlyRootFilesystem: the container's root file system is mounted read-only.
	ReadOnlyRootFilesystem bool
	// NoNewPrivileges: allowPrivilegeEscalation is false (no_new_privs); only then.
	NoNewPrivileges bool
	// UnmaskedProcMount: procMount Unmasked, no masked or read-only /proc paths.
	UnmaskedProcMount bool
	// Seccomp and AppArmor are the profiles the pod asks for; nil: none asked for (each
	// backend's default applies).
	Seccomp, AppArmor *Profile
	// Sysctls are the pod's namespaced sysctls, by their dotted names.
	Sysctls map[string]string
	// HostNetwork, HostPID and HostIPC: the host's namespaces (with the host's network,
	// ContainerConfig.NetNSPath is empty). ShareProcessNamespace: one PID namespace for the pod.
	HostNetwork, HostPID, HostIPC, ShareProcessNamespace bool
}

// Capabilities are Linux capabilities to add to and drop from the runtime's default set.
type Capabilities struct {
	Add, Drop []string
}

// ProfileType is the kind of a seccomp or AppArmor profile, named as the Kubernetes API names it.
type ProfileType string

const (
	ProfileRuntimeDefault ProfileType = "RuntimeDefault"
	ProfileLocalhost      ProfileType = "Localhost"
	ProfileUnconfined     ProfileType = "Unconfined"
)

// Profile is a seccomp or AppArmor profile.
type Profile struct {
	Type ProfileType
	// Localhost names a Localhost profile: for seccomp a file below the node's profile root
	// (seccompProfileRoot), for AppArmor a profile loaded in the kernel.
	Localhost string
}
