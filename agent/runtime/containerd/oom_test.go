package containerd

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOOMKillCount: the OOM kills of a container's cgroup are read from memory.events on
// cgroup v2 and memory.oom_control on v1, a systemd-style path's in its scope below its
// slice; no file counts none.
func TestOOMKillCount(t *testing.T) {
	root := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("holdfast/v2/memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
	write("holdfast/v2-none/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
	write("memory/holdfast/v1/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
	write("kubepods.slice/kubepods-pod1_2.slice/holdfast-c1.scope/memory.events", "oom 1\noom_kill 3\n")
	for path, want := range map[string]int{
		"/holdfast/v2":                      1,
		"/holdfast/v2-none":                 0,
		"/holdfast/v1":                      2,
		"/holdfast/absent":                  0,
		"":                                  0,
		"system.slice:holdfast:v2":          0,
		"kubepods-pod1_2.slice:holdfast:c1": 3,
	} {
		if got := oomKillCount(root, path); got != want {
			t.Errorf("oomKillCount(%q) = %d, want %d", path, got, want)
		}
	}
}
