package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/contrib/apparmor"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// NodeSecurity is what the node contributes to its containers' confinement (WithNodeSecurity).
type NodeSecurity struct {
	// SeccompProfileRoot holds the profiles of seccompProfile type Localhost (kubelet's
	// <root-dir>/seccomp); localhostProfile is a path below it.
	SeccompProfileRoot string
	// AppArmor says the host enforces AppArmor: profiles are applied as containerd's CRI plugin
	// applies them, the runtime's default one when the pod names none. Without it, pods asking
	// for a profile are refused at admission.
	AppArmor bool
	// CgroupNamespace gives every unprivileged container its own cgroup namespace, as
	// containerd's CRI plugin does on a unified (v2) hierarchy.
	CgroupNamespace bool
	// CgroupMountOptions are the options of the host's /sys/fs/cgroup mount (its superblock's,
	// as /proc/self/mountinfo lists them): a container that mounts cgroup2 in the host's cgroup
	// namespace must repeat those of sharedCgroup2Options (withCgroupfs).
	CgroupMountOptions []string
}

// appArmorDefaultProfile is the name containerd's CRI plugin loads its default profile under;
// holdfast uses the same, so both share one loaded profile on a node that runs both.
const appArmorDefaultProfile = "cri-containerd.apparmor.d"

// securitySpecOpts applies a container's confinement (runtime.Security, which the pod layer
// resolved from its securityContext) and its pod's host namespaces, the way containerd's CRI
// plugin builds the spec from what kubelet asks (internal/cri/server/container_create*.go).
// pod and container name the container in a refusal.
func securitySpecOpts(sec runtime.Security, pod, container string, node NodeSecurity) []oci.SpecOpts {
	var opts []oci.SpecOpts
	uid, gid := sec.RunAsUser, sec.RunAsGroup
	switch {
	case uid != nil && gid != nil:
		opts = append(opts, oci.WithUIDGID(uint32(*uid), uint32(*gid)))
	case uid != nil:
		opts = append(opts, withUserID(uint32(*uid)))
	case gid != nil:
		// The image's user with the group asked for: kubelet passes the image's user as
		// runAsUser, so the runtime gets "USER:GID".
		opts = append(opts, withGroupID(uint32(*gid)))
	}
	// kubelet puts fsGroup first among the supplementary groups, then supplementalGroups.
	var groups []uint32
	for _, g := range sec.SupplementalGroups {
		groups = append(groups, uint32(g))
	}
	if len(groups) > 0 {
		opts = append(opts, withSupplementalGroups(groups...))
	}
	if sec.RunAsNonRoot {
		opts = append(opts, verifyNonRoot(pod, container))
	}
	opts = append(opts, namespaceSpecOpts(sec)...)
	if len(sec.Sysctls) > 0 {
		// Admission allowed only namespaced sysctls of namespaces the pod does not share with
		// the host; runc writes them inside the container's namespaces.
		opts = append(opts, withSysctls(sec.Sysctls))
	}
	// A privileged container gets every capability, the host's devices and writable /sys and
	// cgroupfs, and no seccomp filter, whatever else its securityContext says: containerd's
	// CRI plugin (what kubelet nodes run) ignores capabilities and seccompProfile for it.
	if sec.Privileged {
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices,
			oci.WithWriteableSysfs, oci.WithWriteableCgroupfs)
	} else {
		opts = append(opts, withCapabilities(sec.Capabilities))
		if node.CgroupNamespace {
			opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}))
		}
	}
	opts = append(opts, withoutAmbientCapabilities)
	if sec.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	// kubelet's AddNoNewPrivileges: no_new_privs only when allowPrivilegeEscalation is false.
	// containerd's default spec turns it on, which would stop the setuid binaries of pods
	// that did not ask for it.
	if sec.NoNewPrivileges {
		opts = append(opts, oci.WithNoNewPrivileges)
	} else {
		opts = append(opts, oci.WithNewPrivileges)
	}
	// After the capabilities: the default seccomp profile allows syscalls by capability.
	if profile := sec.Seccomp; !sec.Privileged && profile != nil {
		switch profile.Type {
		case runtime.ProfileRuntimeDefault:
			opts = append(opts, seccomp.WithDefaultProfile())
		case runtime.ProfileLocalhost:
			opts = append(opts, withLocalhostSeccomp(node.SeccompProfileRoot, profile.Localhost))
		}
	}
	if node.AppArmor {
		if opt := appArmorSpecOpt(sec.AppArmor, sec.Privileged); opt != nil {
			opts = append(opts, opt)
		}
	}
	return opts
}

// withGroupID sets the process's group, keeping the user the image config resolved.
func withGroupID(gid uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.User.GID = gid
		s.Process.User.AdditionalGids = []uint32{gid}
		return nil
	}
}

// withCapabilities is the CRI plugin's rule (internal/cri/opts.WithCapabilities): add "ALL"
// grants every capability the runtime has, drop "ALL" clears the set, then the named ones are
// added, then the named ones dropped. Capabilities unset leave the runtime's default set.
func withCapabilities(caps *runtime.Capabilities) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, c *containers.Container, s *oci.Spec) error {
		if caps == nil {
			return nil
		}
		var add, drop []string
		addAll, dropAll := false, false
		for _, name := range caps.Add {
			if n := capName(name); n == "ALL" {
				addAll = true
			} else {
				add = append(add, n)
			}
		}
		for _, name := range caps.Drop {
			if n := capName(name); n == "ALL" {
				dropAll = true
			} else {
				drop = append(drop, n)
			}
		}
		var opts []oci.SpecOpts
		if addAll {
			all, err := cap.Current()
			if err != nil {
				return fmt.Errorf("read the runtime's capabilities: %w", err)
			}
			opts = append(opts, oci.WithCapabilities(all))
		}
		if dropAll {
			opts = append(opts, oci.WithCapabilities(nil))
		}
		opts = append(opts, oci.WithAddedCapabilities(add), oci.WithDroppedCapabilities(drop))
		return oci.ApplyOpts(ctx, client, c, s, opts...)
	}
}

// capName turns a Kubernetes capability name ("net_admin") into an OCI one ("CAP_NET_ADMIN");
// "ALL" stays "ALL".
func capName(c string) string {
	name := strings.ToUpper(c)
	if name == "ALL" || strings.HasPrefix(name, "CAP_") {
		return name
	}
	return "CAP_" + name
}

// withoutAmbientCapabilities: as the CRI plugin, no ambient capabilities (what non-root plus
// capabilities means is not defined by Kubernetes; kubernetes#56374).
func withoutAmbientCapabilities(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil && s.Process.Capabilities != nil {
		s.Process.Capabilities.Ambient = nil
	}
	return nil
}

// namespaceSpecOpts puts the container in the host's PID and IPC namespaces when the pod asks
// for them (the host network, and with it the host's UTS namespace, is the runtime's
// NetNSPath). With the host's IPC namespace comes the host's /dev/shm, as with the CRI plugin.
func namespaceSpecOpts(sec runtime.Security) []oci.SpecOpts {
	var opts []oci.SpecOpts
	if sec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	if sec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace), withHostDevShm)
	}
	return opts
}

// withHostDevShm replaces the runtime's private /dev/shm with the host's, unless the pod
// mounts a volume there.
func withHostDevShm(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	mounts := s.Mounts[:0]
	volume := false
	for _, m := range s.Mounts {
		if m.Destination == "/dev/shm" {
			if m.Type == "tmpfs" && m.Source == "shm" {
				continue // the runtime's default
			}
			volume = true
		}
		mounts = append(mounts, m)
	}
	s.Mounts = mounts
	if !volume {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "/dev/shm", Options: []string{"rbind", "rw"}})
	}
	return nil
}

// withSysctls sets namespaced sysctls, which runc writes inside the container's namespaces.
func withSysctls(sysctls map[string]string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		for k, v := range sysctls {
			s.Linux.Sysctl[k] = v
		}
		return nil
	}
}

// withLocalhostSeccomp loads a profile from the node's profile directory. A profile that cannot
// be read fails the container's creation (CreateContainerError naming the file): it never runs
// without the filter it asked for.
func withLocalhostSeccomp(root, name string) oci.SpecOpts {
	if !filepath.IsLocal(name) {
		return func(context.Context, oci.Client, *containers.Container, *oci.Spec) error {
			return fmt.Errorf("seccomp profile %q: localhostProfile must be a relative path below %s", name, root)
		}
	}
	return seccomp.WithProfile(filepath.Join(root, name))
}

// appArmorSpecOpt is the CRI plugin's rule on a host that enforces AppArmor
// (internal/cri/sputil.GenerateApparmorSpecOpts): no profile means the runtime's default one,
// except for privileged containers; a Localhost profile must be loaded, else the container is
// not created.
func appArmorSpecOpt(p *runtime.Profile, privileged bool) oci.SpecOpts {
	if p == nil {
		p = &runtime.Profile{Type: runtime.ProfileRuntimeDefault}
	}
	switch p.Type {
	case runtime.ProfileUnconfined:
		return nil
	case runtime.ProfileRuntimeDefault:
		if privileged {
			return nil
		}
		return withDefaultAppArmorProfile(appArmorDefaultProfile)
	case runtime.ProfileLocalhost:
		name := p.Localhost
		return func(ctx context.Context, client oci.Client, c *containers.Container, s *oci.Spec) error {
			loaded, err := appArmorProfileLoaded(name)
			if err != nil {
				return err
			}
			if !loaded {
				return fmt.Errorf("apparmor profile not found %s", name)
			}
			return apparmor.WithProfile(name)(ctx, client, c, s)
		}
	}
	return func(context.Context, oci.Client, *containers.Container, *oci.Spec) error {
		return fmt.Errorf("unknown AppArmor profile type %q", p.Type)
	}
}

// appArmorProfileLoaded reports whether the kernel has a profile of that name loaded.
func appArmorProfileLoaded(name string) (bool, error) {
	if strings.TrimSpace(name) == "" {
		return false, fmt.Errorf("empty AppArmor localhost profile name")
	}
	b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	if err != nil {
		return false, fmt.Errorf("list loaded AppArmor profiles: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" (") {
			return true, nil
		}
	}
	return false, nil
}
