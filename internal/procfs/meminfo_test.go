package procfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadMeminfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       4\nbogus\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMeminfo(p)
	if err != nil {
		t.Fatal(err)
	}
	if m["MemTotal"] != 16384*1024 || m["MemAvailable"] != 8192*1024 || m["HugePages_Total"] != 4 {
		t.Errorf("parsed %v", m)
	}
	if err := os.WriteFile(p, []byte("MemFree: 1 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeminfo(p); err == nil {
		t.Error("a meminfo without MemTotal was accepted")
	}
}
