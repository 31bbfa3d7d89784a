package containerd

import (
	"strings"
	"testing"
	"text/template"

	"github.com/containerd/containerd/v2/contrib/apparmor"
)

// TestDefaultAppArmorProfile: the default profile is the one containerd's CRI plugin loads,
// on this host and with every optional part present.
func TestDefaultAppArmorProfile(t *testing.T) {
	const name = "holdfast-test.apparmor.d"
	want, err := apparmor.DumpDefaultProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	if got := defaultAppArmorProfile(hostAppArmorProfileData(name)); got != want {
		t.Errorf("on this host:\n%s\nwant (contrib/apparmor):\n%s", got, want)
	}

	// contrib/apparmor's template is unexported: its text, v2.4.2, to cover the parts this
	// host may lack (abi, includes, rootlesskit).
	full := appArmorProfileData{
		Abi: "abi/3.0", Name: name, DaemonProfile: "holdfast", RootlessKit: "/usr/bin/rootlesskit",
		Imports:      []string{"#include <tunables/global>", "@{X}=/x/"},
		InnerImports: []string{"#include <abstractions/base>", "#include <abstractions/other>"},
	}
	var b strings.Builder
	if err := template.Must(template.New("").Parse(upstreamAppArmorTemplate)).Execute(&b, full); err != nil {
		t.Fatal(err)
	}
	if got := defaultAppArmorProfile(full); got != b.String() {
		t.Errorf("with every part:\n%s\nwant:\n%s", got, b.String())
	}
}

const upstreamAppArmorTemplate = `
{{if .Abi}}abi <{{.Abi}}>,
{{end}}
{{range $value := .Imports}}
{{$value}}
{{end}}

profile {{.Name}} flags=(attach_disconnected,mediate_deleted) {
{{range $value := .InnerImports}}
  {{$value}}
{{end}}

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
  signal (receive) peer={{.DaemonProfile}},
  # Container processes may send signals amongst themselves.
  signal (send,receive) peer={{.Name}},
{{if .RootlessKit}}
  # https://github.com/containerd/nerdctl/issues/2730
  signal (receive) peer={{.RootlessKit}},
{{end}}

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
  ptrace (trace,tracedby,read,readby) peer={{.Name}},
}
`
