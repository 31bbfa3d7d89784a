package containerd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The runtime's default AppArmor profile, as containerd's contrib/apparmor (v2.4) loads it for
// its CRI plugin: the same text, under the same name, so a node that runs both shares one
// loaded profile. Rendered here with strings, not with contrib/apparmor's text/template: a
// reachable template execution makes the linker keep every exported method of every type in
// the binary (it cannot tell which one a template calls by name), about 6 MiB of the agent
// (issue 31).

// appArmorDir holds the host's profile includes (tunables, abstractions).
const appArmorDir = "/etc/apparmor.d"

// withDefaultAppArmorProfile loads the default profile under name unless the kernel has it,
// then confines the container with it (contrib/apparmor.WithDefaultProfile).
func withDefaultAppArmorProfile(name string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if err := loadDefaultAppArmorProfile(name); err != nil {
			return err
		}
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.ApparmorProfile = name
		return nil
	}
}

func loadDefaultAppArmorProfile(name string) error {
	loaded, err := appArmorProfileLoaded(name)
	if err != nil {
		return err
	}
	if loaded {
		return nil
	}
	f, err := os.CreateTemp(os.Getenv("XDG_RUNTIME_DIR"), name)
	if err != nil {
		return fmt.Errorf("write apparmor profile %s: %w", name, err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(defaultAppArmorProfile(hostAppArmorProfileData(name)))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write apparmor profile %s: %w", name, err)
	}
	out, err := exec.Command("apparmor_parser", "-Kr", f.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("load apparmor profile %s: parser error(%q): %w", f.Name(), strings.TrimSpace(string(out)), err)
	}
	return nil
}

// appArmorProfileData is what the default profile depends on: the host's includes, the
// profile the agent itself runs under (allowed to signal the containers), rootlesskit's path.
type appArmorProfileData struct {
	Abi           string
	Name          string
	Imports       []string
	InnerImports  []string
	DaemonProfile string
	RootlessKit   string
}

// hostAppArmorProfileData looks at this host as contrib/apparmor's loadData does.
func hostAppArmorProfileData(name string) appArmorProfileData {
	exists := func(include string) bool {
		_, err := os.Stat(filepath.Join(appArmorDir, include))
		return err == nil
	}
	p := appArmorProfileData{Name: name}
	if exists("abi/3.0") {
		p.Abi = "abi/3.0"
	}
	if exists("tunables/global") {
		p.Imports = append(p.Imports, "#include <tunables/global>")
	} else {
		p.Imports = append(p.Imports, "@{PROC}=/proc/")
	}
	if exists("abstractions/base") {
		p.InnerImports = append(p.InnerImports, "#include <abstractions/base>")
	}
	// Unreadable: unconfined, as is usual. A profile name is followed by " (enforce)".
	current, _ := os.ReadFile("/proc/self/attr/current")
	p.DaemonProfile, _, _ = strings.Cut(string(current), " ")
	if p.DaemonProfile == "" {
		p.DaemonProfile = "unconfined"
	}
	p.RootlessKit, _ = exec.LookPath("rootlesskit")
	return p
}

// defaultAppArmorProfile renders contrib/apparmor's defaultTemplate byte for byte
// (TestDefaultAppArmorProfile compares the two).
func defaultAppArmorProfile(p appArmorProfileData) string {
	var b strings.Builder
	b.WriteString("\n")
	if p.Abi != "" {
		b.WriteString("abi <" + p.Abi + ">,\n")
	}
	b.WriteString("\n")
	for _, v := range p.Imports {
		b.WriteString("\n" + v + "\n")
	}
	b.WriteString("\n\nprofile " + p.Name + " flags=(attach_disconnected,mediate_deleted) {\n")
	for _, v := range p.InnerImports {
		b.WriteString("\n  " + v + "\n")
	}
	b.WriteString(`

  network,
  capability,
  file,
  umount,
  # Host (privileged) processes may send signals to container processes.
  signal (receive) peer=unconfined,
  # runc may send signals to container processes.
  signal (receive) peer=runc,
  # crun may send signals to container processes.
  signal (receive) peer=crun,
  # Manager may send signals to container processes.
  signal (receive) peer=` + p.DaemonProfile + `,
  # Container processes may send signals amongst themselves.
  signal (send,receive) peer=` + p.Name + `,
`)
	if p.RootlessKit != "" {
		b.WriteString("\n  # https://github.com/containerd/nerdctl/issues/2730\n  signal (receive) peer=" + p.RootlessKit + ",\n")
	}
	b.WriteString(`

  deny @{PROC}/* w,   # deny write for all files directly in /proc (not in a subdir)
  # deny write to files not in /proc/<number>/** or /proc/sys/**
  deny @{PROC}/{[^1-9/],[^1-9/][^0-9/],[^1-9s/][^0-9y/][^0-9s/],[^1-9/][^0-9/][^0-9/][^0-9/]*}/** w,
  deny @{PROC}/sys/[^k]** w,  # deny /proc/sys except /proc/sys/k* (effectively /proc/sys/kernel)
  deny @{PROC}/sys/kernel/{?,??,[^s][^h][^m]**} w,  # deny everything except shm* in /proc/sys/kernel/
  deny @{PROC}/sysrq-trigger rwklx,
  deny @{PROC}/kcore rwklx,

  deny mount,

  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/devices/virtual/powercap/** rwklx,
  deny /sys/kernel/security/** rwklx,

  # allow processes within the container to trace each other,
  # provided all other LSM and yama setting allow it.
  ptrace (trace,tracedby,read,readby) peer=` + p.Name + `,
}
`)
	return b.String()
}
