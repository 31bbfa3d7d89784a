package gateway

import "testing"

func TestProcCgroupPath(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"0::/kubepods.slice/a.scope\n", "/kubepods.slice/a.scope"},
		{"12:pids:/kubepods.slice/p/b.scope\n11:memory:/kubepods.slice/m/b.scope\n1:name=systemd:/s\n0::/s\n", "/kubepods.slice/m/b.scope"},
		{"4:cpu,cpuacct:/c\n3:memory,foo:/m\n", "/m"},
		{"", ""},
	} {
		if got := procCgroupPath(tt.in); got != tt.want {
			t.Errorf("procCgroupPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
