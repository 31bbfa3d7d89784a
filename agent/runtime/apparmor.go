package runtime

import (
	"os"
	"sync"
)

// AppArmorEnabled says the host enforces AppArmor and can load profiles: what admission asks
// before it accepts a pod that names a profile, and what the containerd backend asks before it
// applies one. The check is runc's and containerd's (pkg/apparmor.HostSupports): the
// securityfs directory, not inside a container, apparmor_parser present, the module enabled.
var AppArmorEnabled = sync.OnceValue(func() bool {
	if _, err := os.Stat("/sys/kernel/security/apparmor"); err != nil || os.Getenv("container") != "" {
		return false
	}
	if _, err := os.Stat("/sbin/apparmor_parser"); err != nil {
		return false
	}
	buf, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	return err == nil && len(buf) > 1 && buf[0] == 'Y'
})
