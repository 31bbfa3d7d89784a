package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
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
