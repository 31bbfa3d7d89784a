package containerd

import (
	"context"
	"path"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/typeurl/v2"
)

// systemdCgroupPrefix names the scope runc makes for each container under its pod's slice
// with the systemd cgroup driver: holdfast-<id>.scope, as containerd's CRI plugin names its
// own cri-containerd-<id>.scope.
const systemdCgroupPrefix = "holdfast"

// cgroupsPath is the OCI cgroupsPath of container id below parent, the pod's cgroup, as
// containerd's CRI plugin makes it (getCgroupsPath): a systemd slice's path
// (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice, the systemd
// driver's) gives runc's systemd form "slice:prefix:id"; any other the path below it.
func cgroupsPath(parent, id string) (p string, systemd bool) {
	if base := path.Base(parent); strings.HasSuffix(base, ".slice") {
		return base + ":" + systemdCgroupPrefix + ":" + id, true
	}
	return path.Join(parent, id), false
}

// systemdCgroupPath is the cgroup of a systemd-form cgroupsPath ("slice:prefix:name") in the
// hierarchy, as runc's systemd manager places it: the slice's expanded path, then
// prefix-name.scope. "" when p is not of that form.
func systemdCgroupPath(p string) string {
	parts := strings.Split(p, ":")
	if len(parts) != 3 || !strings.HasSuffix(parts[0], ".slice") {
		return ""
	}
	slice := strings.TrimSuffix(parts[0], ".slice")
	var dir, prefix string
	if slice != "-" {
		for _, c := range strings.Split(slice, "-") {
			if c == "" {
				return ""
			}
			dir += "/" + prefix + c + ".slice"
			prefix += c + "-"
		}
	}
	return dir + "/" + parts[1] + "-" + parts[2] + ".scope"
}

// withSystemdCgroup tells the runc shim to make the container's cgroup through systemd
// (runc's --systemd-cgroup), as containerd's CRI plugin does with SystemdCgroup = true: the
// container's record carries it, for every task made from it.
func withSystemdCgroup() client.NewContainerOpts {
	return client.WithRuntime(defaults.DefaultRuntime, &runcoptions.Options{SystemdCgroup: true})
}

// withRecordedRuncOptions gives the task the runc options of its container's record
// (withSystemdCgroup's), as task options too: a containerd that reads only the task's
// options (not the container's) then sees them as well.
func withRecordedRuncOptions(c client.Container) client.NewTaskOpts {
	return func(ctx context.Context, _ *client.Client, ti *client.TaskInfo) error {
		if ti.Options != nil {
			return nil
		}
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Runtime.Options == nil || info.Runtime.Options.GetValue() == nil {
			return nil
		}
		var opts runcoptions.Options
		if err := typeurl.UnmarshalTo(info.Runtime.Options, &opts); err != nil {
			return nil // another runtime's options: left to the record
		}
		if opts.SystemdCgroup {
			ti.Options = &opts
		}
		return nil
	}
}
